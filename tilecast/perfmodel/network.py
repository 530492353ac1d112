"""The network between ranks: what one message costs, fitted on a ping-pong and stored per machine.

A message of ``b`` bytes from one rank to another takes
``latency + message_cost + b / bandwidth`` seconds on the directed link between them
(:mod:`tilecast.simulator.ranks` holds the link for that long, one message after another):
``latency`` is MPI's own (a ping-pong of plain ``MPI_Send``/``MPI_Recv`` before StarPU starts),
``message_cost`` what StarPU-MPI adds per message (the same ping-pong through ``starpu_mpi_send`` /
``starpu_mpi_recv`` with StarPU's workers running, less MPI's latency; raised to what a probe step shows,
:mod:`tilecast.loop.ranks_probe`, where messages wait for time slices), ``bandwidth`` the slope of
the StarPU-MPI ping-pong. ``tilecast calibrate --ranks N`` measures them
(:mod:`tilecast.executor.mpi_pingpong`); they are stored under
``$TILECAST_HOME/calibration/network-<machine>-<fingerprint>.json``, keyed by rank count, workers per
rank and MPI transport. Open MPI's eager and rendezvous limits (``eager_bytes``, ``rndv_bytes``, from
``ompi_info``) say which protocol a message takes (:meth:`Network.protocol`); the ping-pong's extra time
per protocol is ``protocol_s``; ``submit_task_s`` and ``submit_cpu_task_s`` are a rank's main-thread wall
and CPU time per task it submits, ``submit_roles`` its CPU time per task by its role in the task (a probe
step, :mod:`tilecast.loop.ranks_probe`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from tilecast.atomic_file import atomic_write
from tilecast.home import home
from tilecast.errors import FieldError


@dataclass
class Network:
    """Seconds per message: ``latency_s + message_s + nbytes / bandwidth_Bps``."""

    latency_s: float
    bandwidth_Bps: float
    message_s: float = 0.0
    source: str = "assumed"
    transport: str = ""
    ranks: int = 2
    workers_per_rank: int = 1
    points: list | None = None  # [bytes, StarPU-MPI one-way s, MPI one-way s] medians of the ping-pong
    probe: dict | None = None  # the probe step message_s was fitted on (tilecast.loop.ranks_probe), if any
    submit_task_s: float = 0.0  # s of a rank's main thread per task it submits, measured on the probe step
    eager_bytes: int | None = None  # payload up to which a send completes as it leaves (None: the transport's,
    # eager_for; above it, once the receiver has matched it and the sender has seen that)
    rndv_bytes: int | None = None  # payload the rendezvous' first fragment carries (None: the transport's,
    # rendezvous_for); above it the rest leaves only at the sender's next turn after the receiver matched it
    protocol_s: dict | None = None  # extra one-way seconds of the ping-pong per protocol over an eager
    # message's ({"rendezvous": s, "pipeline": s}, fit_network), in flight like the latency
    submit_cpu_task_s: float = 0.0  # CPU s of a rank's main thread per task it submits (the probe step), which
    # it asks of the cores it shares with the workers and progress threads
    submit_roles: dict | None = None  # CPU s of a rank's main thread per task by its role in it ({"exec", "other",
    # "send", "recv", "drop"}: tilecast.simulator.submit_roles), fitted on the probe step's insertion times; where set,
    # the forecast charges these instead of submit_cpu_task_s
    submit_share: float | None = None  # the main thread's part of its rank's CPU while it submits (the probe step's
    # scheduler counts: tilecast.executor.mpi_threads.submit_share_of); None: half (ranks_submission.EVEN_SHARE)
    progress_task_s: float | None = None  # s a worker run by StarPU-MPI's progress thread spends per task beyond
    # the one-process cost (its round of the progress loop), measured on the probe's traces
    # (tilecast.loop.ranks_task_cost); None: not measured, nothing added
    message_cpu_s: float | None = None  # that thread's CPU per message on each side, measured there; None:
    # message_s / 2

    def __post_init__(self):
        for name in ("latency_s", "message_s", "submit_task_s", "submit_cpu_task_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v >= 0):
                raise FieldError(f"network {name} must be a number >= 0, got {v!r}")
        if self.submit_roles is not None:
            if not isinstance(self.submit_roles, dict) or not all(
                    isinstance(v, (int, float)) and np.isfinite(v) and v >= 0 for v in self.submit_roles.values()):
                raise FieldError(f"network submit_roles must map roles to seconds >= 0, got {self.submit_roles!r}")
        if self.submit_share is not None and not (isinstance(self.submit_share, (int, float))
                                                  and 0.0 < self.submit_share < 1.0):
            raise FieldError(f"network submit_share must be a number between 0 and 1, got {self.submit_share!r}")
        for name in ("progress_task_s", "message_cpu_s"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and np.isfinite(v) and v >= 0):
                raise FieldError(f"network {name} must be a number >= 0 or null, got {v!r}")
        if not (isinstance(self.bandwidth_Bps, (int, float)) and self.bandwidth_Bps > 0):
            raise FieldError(f"network bandwidth_Bps must be a number > 0, got {self.bandwidth_Bps!r}")

    def seconds(self, nbytes) -> np.ndarray:
        """Seconds a message of ``nbytes`` holds its link."""
        return self.latency_s + self.message_s + np.asarray(nbytes, dtype=np.float64) / self.bandwidth_Bps

    def eager_limit(self) -> int | None:
        """``eager_bytes``, or where it is None what :func:`eager_for` says of the transport (None: every
        send completes as it leaves)."""
        return eager_for(self.transport) if self.eager_bytes is None else int(self.eager_bytes)

    def rendezvous_limit(self) -> int | None:
        """``rndv_bytes``, or where it is None what :func:`rendezvous_for` says of the transport (None: no
        message needs more than the first fragment)."""
        return rendezvous_for(self.transport) if self.rndv_bytes is None else int(self.rndv_bytes)

    def protocol(self, nbytes: int) -> str:
        """How a message of ``nbytes`` goes: ``eager`` (complete as it leaves), ``rendezvous`` (its first
        fragment carries it all; the sender completes once the receiver has matched it) or ``pipeline`` (the
        rest follows the receiver's acknowledgement, at the sender's next turn)."""
        eager, rndv = self.eager_limit(), self.rendezvous_limit()
        if eager is None or nbytes <= eager:
            return "eager"
        return "pipeline" if rndv is not None and nbytes > rndv else "rendezvous"

    def protocol_extra_s(self, nbytes: int) -> float:
        """The ping-pong's extra one-way time of ``nbytes``' protocol over an eager message's (0 if not
        measured)."""
        return float((self.protocol_s or {}).get(self.protocol(nbytes), 0.0))

    def key(self) -> str:
        return network_key(self.ranks, self.workers_per_rank, self.transport)


def network_key(ranks: int, workers_per_rank: int, transport: str) -> str:
    return f"ranks={ranks}:workers={workers_per_rank}:transport={transport}"


def fit_network(sizes, starpu_s, mpi_s, **kw) -> Network:
    """Robust line (Siegel's repeated medians, scipy) of one-way times on message size: StarPU-MPI's
    intercept and slope, MPI's intercept (``sizes`` bytes; ``starpu_s``, ``mpi_s`` one-way seconds, one
    figure per size). A size timed during a burst of other work does not move the line.

    Where the transport has an eager limit (``eager_bytes``/``rndv_bytes`` in ``kw``, or the transport's own)
    and some sizes are eager, the protocols are fitted apart: the slope is the median slope of pairs of sizes
    within one protocol, ``message_s`` the eager sizes' intercept (median residual) less MPI's latency, and
    ``protocol_s`` each other protocol's intercept over the eager one (>= 0): the round trips a rendezvous'
    acknowledgement and a pipeline's second fragment add."""
    from scipy.stats import siegelslopes

    sizes = np.asarray(sizes, dtype=np.float64)
    starpu_s, mpi_s = np.asarray(starpu_s, dtype=np.float64), np.asarray(mpi_s, dtype=np.float64)
    if len(sizes) < 2 or len(np.unique(sizes)) < 2:
        raise ValueError("sizes: a fit needs at least two message sizes")
    slope, intercept = siegelslopes(starpu_s, sizes)
    mpi_slope, mpi_intercept = siegelslopes(mpi_s, sizes)
    if not slope > 0:  # StarPU-MPI's times too disturbed to show the size: MPI's own bandwidth
        slope = mpi_slope
    slope = max(float(slope), 1e-15)
    latency = max(float(mpi_intercept), 0.0)
    message = max(float(intercept) - latency, 0.0)
    pts = [[int(b), float(a), float(m)] for b, a, m in zip(sizes, starpu_s, mpi_s)]
    net = Network(latency_s=latency, bandwidth_Bps=1.0 / slope, message_s=message, points=pts, **kw)
    # each protocol's own intercept over the common slope (the median of its sizes' residuals): an eager
    # message's gives the cost per message, the others' their extra over it (a rendezvous' acknowledgement,
    # a pipeline's second fragment: round trips the line through every size would spread over all sizes)
    kinds = np.array([net.protocol(int(b)) for b in sizes])
    if net.eager_limit() is not None and (kinds == "eager").any():
        # the slope of pairs of sizes within one protocol (Theil-Sen's median, less the protocols' steps)
        pairs = [(starpu_s[j] - starpu_s[i]) / (sizes[j] - sizes[i]) for i in range(len(sizes))
                 for j in range(i + 1, len(sizes)) if kinds[i] == kinds[j] and sizes[j] != sizes[i]]
        if pairs and np.median(pairs) > 0:
            slope = float(np.median(pairs))
            net.bandwidth_Bps = 1.0 / slope
        resid = starpu_s - sizes * slope
        base = float(np.median(resid[kinds == "eager"]))
        net.message_s = max(base - latency, 0.0)
        net.protocol_s = {k: max(float(np.median(resid[kinds == k])) - base, 0.0)
                          for k in ("rendezvous", "pipeline") if (kinds == k).any()}
    return net


def _path(machine) -> str:
    return str(home("calibration", f"network-{machine.name}-{machine.fingerprint()}.json"))


def save_network(machine, net: Network) -> str:
    """Store ``net`` for ``machine`` beside the kernel calibration (other keys kept)."""
    path = _path(machine)
    doc = _load_doc(path)
    doc[net.key()] = asdict(net)
    with atomic_write(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def _load_doc(path: str) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def load_network(machine, ranks: int, workers_per_rank: int, transport: str | None = None) -> Network | None:
    """The stored network for this rank count and workers per rank (any transport unless named), else None.
    A fit for 2 ranks serves other rank counts when none was stored for them (the cost of one message
    between two ranks does not depend on how many others there are, on a network without contention)."""
    doc = _load_doc(_path(machine))
    want = [network_key(ranks, workers_per_rank, transport)] if transport else []
    keys = want + [k for k in doc if k.startswith(f"ranks={ranks}:workers={workers_per_rank}:")]
    keys += [k for k in doc if k.startswith(f"ranks=2:workers={workers_per_rank}:")]
    for k in keys:
        if k in doc:
            try:
                return Network(**doc[k])
            except (TypeError, ValueError):
                continue
    return None


# Open MPI's shared-memory transport (btl vader), as ``run --ranks`` starts it: a message whose fragment,
# header included, exceeds btl_vader_eager_limit (4096 B, ``ompi_info --param btl vader --level 9``) goes by
# ob1's rendezvous: the send request completes only once the receiver has matched it and acknowledged it.
VADER_EAGER_LIMIT = 4096
OB1_HEADER = 32  # bytes of ob1's match/rendezvous header, rounded up


VADER_RNDV_EAGER_LIMIT = 32768  # btl_vader_rndv_eager_limit: the rendezvous' first fragment, header included
OB1_RNDV_HEADER = 48  # bytes of ob1's rendezvous header (match header, length, request pointer), rounded up


def rendezvous_for(transport: str) -> int | None:
    """The payload the first fragment of a rendezvous carries, for a stored ``transport`` (Open MPI's shared
    memory: ``btl_vader_rndv_eager_limit`` less ob1's header); None for anything else."""
    if transport.startswith("Open MPI") and "shared memory" in transport:
        return VADER_RNDV_EAGER_LIMIT - OB1_RNDV_HEADER
    return None


def eager_for(transport: str) -> int | None:
    """The payload up to which a send completes as it leaves, for a stored ``transport``: Open MPI on one
    host (shared memory); None (every send completes as it leaves) for anything else."""
    if transport.startswith("Open MPI") and "shared memory" in transport:
        return VADER_EAGER_LIMIT - OB1_HEADER
    return None
