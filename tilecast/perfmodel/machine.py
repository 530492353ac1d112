"""Machine descriptions: workers, memory nodes, links and kernel-speed figures.

A machine is described in YAML (format version 1)::

    format: 1
    name: h100-sxm5-8
    description: free text
    runtime:
      task_overhead_us: {value: 3.0, source: "where the figure comes from"}
    memory_nodes:                 # node 0 is the host RAM: the backing store
      - {name: host, kind: ram, capacity_GiB: {value: 2048, source: ...}}
      - {name: gpu, kind: hbm, count: 8, capacity_GiB: {value: 80, source: ...}}
    switches: [nvswitch]          # optional: link endpoints that hold no data
    links:                        # full duplex: one directed link each way
      - {name: pcie, between: [host, gpu], bandwidth_GBps: {...}, latency_us: {...}}
      - {name: nvlink, between: [gpu, nvswitch], bandwidth_GBps: {...}, latency_us: {...}}
    worker_kinds:
      h100:                       # roofline figures, used until a calibration exists
        peak_tflops: {value: 67, source: ...}
        memory_bandwidth_GBps: {value: 3350, source: ...}
        compute_efficiency: {value: 0.7, source: ...}
        memory_efficiency: {value: 0.8, source: ...}
        half_efficiency_gflop: {value: 1.1, source: ...}
        launch_us: {value: 5, source: ...}
    workers:                      # processing units grouped into workers
      - {name: cuda, kind: h100, count: 8, units: 1, memory_node: gpu}

Every figure is ``{value: number, source: text}``: the source (a datasheet, a
measurement, a derivation) sits beside the number. A group with ``count: N``
expands into ``name0 .. name{N-1}``; a worker group of the same count as its
memory-node group puts worker i on node i; a link between a group and a single
endpoint connects each member; a link between two groups connects members
pairwise (i with i) when both have the same count. Routes between memory
nodes are the fewest-hop paths over links and switches (ties: highest
bottleneck bandwidth, then description order).

Compute efficiency follows a saturation curve in task size:
``eff(f) = compute_efficiency * f / (f + half_efficiency)`` (small tasks
cannot fill a GPU).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace

import numpy as np
import yaml

FORMAT_VERSION = 1
MACHINES_DIR = os.path.join(os.path.dirname(__file__), "machines")

# YAML key -> (attribute, factor to SI)
KIND_FIGURES = {
    "peak_tflops": ("peak_flops", 1e12),
    "memory_bandwidth_GBps": ("memory_bandwidth", 1e9),
    "compute_efficiency": ("compute_efficiency", 1.0),
    "memory_efficiency": ("memory_efficiency", 1.0),
    "half_efficiency_gflop": ("half_efficiency_flops", 1e9),
    "launch_us": ("launch_s", 1e-6),
}
# Figures a worker kind may state: the level-2 cache per core (KiB), within which a task's inputs count as hot
# (tilecast.perfmodel.reuse); a kind that states none is given the calibration's (tilecast.perfmodel.cache_size).
OPTIONAL_KIND_FIGURES = {"l2_per_core_KiB": ("cache_bytes", 1024.0)}


class MachineError(ValueError):
    """An invalid machine description; the message names the file and field."""


@dataclass
class MemoryNode:
    name: str
    kind: str
    capacity: float  # bytes


@dataclass
class Link:
    name: str
    src: str
    dst: str
    bandwidth: float  # bytes/s
    latency: float  # s


@dataclass
class WorkerKind:
    name: str
    peak_flops: float = 0.0
    memory_bandwidth: float = 0.0
    compute_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    half_efficiency_flops: float = 0.0
    launch_s: float = 0.0
    cache_bytes: float = 0.0  # level-2 cache per core (0: not stated)
    sources: dict = field(default_factory=dict)

    def roofline(self, flops: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Seconds per task: launch + max(compute time at shape efficiency, memory time)."""
        flops = np.asarray(flops, dtype=np.float64)
        nbytes = np.asarray(nbytes, dtype=np.float64)
        eff = self.compute_efficiency * flops / np.maximum(flops + self.half_efficiency_flops, 1e-300)
        compute = np.where(flops > 0, flops / np.maximum(self.peak_flops * eff, 1e-300), 0.0)
        memory = nbytes / (self.memory_bandwidth * self.memory_efficiency)
        return self.launch_s + np.maximum(compute, memory)


@dataclass
class Worker:
    name: str
    kind: str
    node: int
    units: int = 1


@dataclass
class Machine:
    name: str
    description: str
    nodes: list[MemoryNode]
    workers: list[Worker]
    kinds: dict[str, WorkerKind]
    links: list[Link]
    switches: list[str]
    task_overhead: float
    source_text: str = ""
    meta: dict = field(default_factory=dict)
    #: what a scheduling decision costs (dmdasd; see tilecast.simulator.engine): seconds per queued task
    #: it reads and per other worker whose queue it locks
    decision_scan: float = 0.0
    decision_lock: float = 0.0
    #: the thread submitting the graph: seconds it spends per task (the executor's wall time per task, as the
    #: probes measure it), and its turns on a worker's core where the workers leave it none
    #: (tilecast.simulator.submit_slices.SubmitSlices, or None)
    submit_task: float = 0.0
    submit_slices: object = None
    #: dmdas and dmdasd: seconds per queued task that inserting a task into a worker's sorted queue walks past,
    #: paid by the pushing worker; prio: seconds per level of its priority tree searched on each push and pop
    #: (see tilecast.simulator.engine, tilecast.simulator.queue_costs)
    push_walk: float = 0.0
    #: dmdas and dmdasd: seconds per queued task walked past beyond the first ``push_walk_knee`` of an insertion
    #: (0: ``push_walk`` for every step; tilecast.simulator.queue_costs.list_walk_s)
    push_walk_far: float = 0.0
    push_walk_knee: float = 0.0
    #: the runtime's cost between a worker's tasks beyond ``task_overhead`` (see tilecast.simulator.gap_cost):
    #: seconds per buffer of the task starting, and per buffer and per successor of the worker's ended task
    gap_start_buffer: float = 0.0
    gap_end_buffer: float = 0.0
    gap_successor: float = 0.0
    gap_ready: float = 0.0  # per successor that the ended task made ready (pushed to the scheduler)
    #: per task started on another worker than the one whose ended task made it ready (the handoff between cores)
    gap_handoff: float = 0.0
    #: per byte the worker's ended task accessed, up to ``gap_byte_cap`` bytes (tilecast.loop.gap_bytes)
    gap_end_byte: float = 0.0
    gap_byte_cap: float = 0.0

    def __post_init__(self):
        self.routes = _routes(self)

    @property
    def kind_names(self) -> list[str]:
        """Worker kinds in first-use order: rows of a duration matrix."""
        out = []
        for w in self.workers:
            if w.kind not in out:
                out.append(w.kind)
        return out

    def fingerprint(self) -> str:
        """Stable hash of what determines kernel speeds: worker kinds, units, and detected hardware.

        It is the fingerprint of the machine as described: a machine reduced to
        some of its workers (:meth:`with_workers`) keeps it, so the kernel
        calibration and host-cost fits stored for the machine serve every
        worker count (a task runs no faster for having fewer neighbours).
        """
        if "fingerprint" in self.meta:
            return self.meta["fingerprint"]
        what = {"name": self.name, "workers": [(w.kind, w.units) for w in self.workers],
                "hardware": self.meta.get("hardware", {})}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]

    def with_workers(self, n: int) -> "Machine":
        """The same machine using only its first ``n`` workers."""
        if not 1 <= n <= len(self.workers):
            raise MachineError(f"{self.name}: workers must be between 1 and {len(self.workers)}, got {n}")
        slices = self.submit_slices if self.submit_slices is None or self.submit_slices.workers == n else None
        return replace(self, workers=self.workers[:n], submit_slices=slices,
                       meta={**self.meta, "fingerprint": self.fingerprint()})

    def with_task_overhead(self, seconds: float) -> "Machine":
        """The same machine with another per-task runtime cost (e.g. one measured on StarPU traces)."""
        if not seconds >= 0:
            raise MachineError(f"{self.name}: the per-task overhead must be at least 0 s, got {seconds}")
        return replace(self, task_overhead=float(seconds), meta=dict(self.meta))

    def with_decision_cost(self, scan: float, lock: float) -> "Machine":
        """The same machine with another cost of a scheduling decision: seconds per queued task it reads and
        per other worker's queue it locks."""
        if not (scan >= 0 and lock >= 0):
            raise MachineError(f"{self.name}: a decision's costs must be at least 0 s, got {scan} and {lock}")
        return replace(self, decision_scan=float(scan), decision_lock=float(lock), meta=dict(self.meta))

    def with_submission(self, per_task: float) -> "Machine":
        """The same machine with another submitting thread: seconds per task."""
        if not per_task >= 0:
            raise MachineError(f"{self.name}: submission costs at least 0 s per task, got {per_task}")
        return replace(self, submit_task=float(per_task), meta=dict(self.meta))

    def with_submit_slices(self, slices) -> "Machine":
        """The same machine with the submitting thread taking its turns on a worker's core
        (:class:`tilecast.simulator.submit_slices.SubmitSlices`, or None: not modelled that way)."""
        if slices is not None and slices.workers != len(self.workers):
            raise MachineError(f"{self.name}: the submitting thread's turns describe {slices.workers} workers, "
                               f"the machine has {len(self.workers)}")
        return replace(self, submit_slices=slices, meta=dict(self.meta))

    def with_push_walk(self, seconds: float) -> "Machine":
        """The same machine with another cost of inserting a task into a sorted queue, per queued task walked."""
        if not seconds >= 0:
            raise MachineError(f"{self.name}: the sorted insertion's cost must be at least 0 s a task, got {seconds}")
        return replace(self, push_walk=float(seconds), meta=dict(self.meta))

    def with_walk_far(self, seconds: float, knee: float) -> "Machine":
        """The same machine with another cost per task a sorted insertion walks past beyond its first ``knee``
        (:func:`tilecast.simulator.queue_costs.list_walk_s`; 0 s: ``push_walk`` for every step)."""
        if not (seconds >= 0 and knee >= 0):
            raise MachineError(f"{self.name}: the sorted insertion's far cost and its knee must be at least 0, "
                               f"got {seconds} s and {knee} tasks")
        return replace(self, push_walk_far=float(seconds), push_walk_knee=float(knee), meta=dict(self.meta))

    def with_gap_costs(self, start_buffer: float, end_buffer: float, successor: float,
                       ready: float = 0.0, handoff: float = 0.0, end_byte: float = 0.0,
                       byte_cap: float = 0.0) -> "Machine":
        """The same machine with another cost between a worker's tasks: seconds per buffer of the starting
        task, per buffer of the worker's ended task, per successor of it, per successor it made ready, per
        task started on another worker than the one that made it ready, and per byte the ended task accessed up
        to ``byte_cap`` bytes (on top of ``task_overhead``)."""
        if not (start_buffer >= 0 and end_buffer >= 0 and successor >= 0 and ready >= 0 and handoff >= 0
                and end_byte >= 0 and byte_cap >= 0):
            raise MachineError(f"{self.name}: the costs between tasks must be at least 0 s, got {start_buffer}, "
                               f"{end_buffer}, {successor}, {ready}, {handoff} and {end_byte} (cap {byte_cap} "
                               f"bytes)")
        return replace(self, gap_start_buffer=float(start_buffer), gap_end_buffer=float(end_buffer),
                       gap_successor=float(successor), gap_ready=float(ready), gap_handoff=float(handoff),
                       gap_end_byte=float(end_byte), gap_byte_cap=float(byte_cap), meta=dict(self.meta))

    def transfer_time(self, src: int, dst: int, nbytes: float) -> float:
        """Uncontended seconds to move ``nbytes`` from node ``src`` to node ``dst``."""
        if src == dst:
            return 0.0
        route = self.routes[src][dst]
        return sum(self.links[i].latency for i in route) + nbytes / min(self.links[i].bandwidth for i in route)


# --- loading ---------------------------------------------------------------------

def list_machines() -> list[str]:
    """Names accepted by :func:`load_machine` (``local`` plus the shipped files)."""
    files = sorted(f[:-5] for f in os.listdir(MACHINES_DIR) if f.endswith(".yaml"))
    return ["local"] + files


def load_machine(spec: str) -> Machine:
    """A machine by name (``local``, a shipped description) or a YAML file path."""
    if spec == "local":
        from tilecast.perfmodel.local import detect_local
        return detect_local()
    path = spec if os.path.exists(spec) else os.path.join(MACHINES_DIR, f"{spec}.yaml")
    if not os.path.exists(path):
        raise MachineError(f"unknown machine {spec!r}: not a file, and not one of {', '.join(list_machines())}")
    with open(path) as f:
        text = f.read()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise MachineError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    return parse_machine(doc, where=path, text=text)


def _fail(where, path, msg):
    raise MachineError(f"{where}: field {path}: {msg}")


def _figure(where, path, value, positive=True, at_most=None) -> tuple[float, str]:
    if not isinstance(value, dict) or "value" not in value or "source" not in value:
        _fail(where, path, "must be {value: number, source: text}")
    v, src = value["value"], value["source"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
        _fail(where, f"{path}.value", f"must be a number, got {v!r}")
    if positive and v <= 0:
        _fail(where, f"{path}.value", f"must be > 0, got {v}")
    if not positive and v < 0:
        _fail(where, f"{path}.value", f"must be >= 0, got {v}")
    if at_most is not None and v > at_most:
        _fail(where, f"{path}.value", f"must be <= {at_most}, got {v}")
    if not isinstance(src, str) or not src.strip():
        _fail(where, f"{path}.source", "must name where the figure comes from")
    return float(v), src


def _require(where, path, doc, key, types):
    if not isinstance(doc, dict) or key not in doc:
        _fail(where, f"{path}.{key}" if path else key, "missing")
    v = doc[key]
    if not isinstance(v, types) or isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        _fail(where, f"{path}.{key}" if path else key, f"must be {getattr(types, '__name__', types)}, got {v!r}")
    return v


def _count(where, path, item):
    c = item.get("count", None)
    if c is None:
        return None
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        _fail(where, f"{path}.count", f"must be a positive integer, got {c!r}")
    return c


def parse_machine(doc, where: str = "<machine>", text: str = "") -> Machine:
    """Validate a parsed YAML document and expand it into a :class:`Machine`."""
    if not isinstance(doc, dict):
        raise MachineError(f"{where}: the description must be a mapping")
    fmt = _require(where, "", doc, "format", int)
    if fmt != FORMAT_VERSION:
        _fail(where, "format", f"version {fmt} is not supported (expected {FORMAT_VERSION})")
    name = _require(where, "", doc, "name", str)
    runtime = doc.get("runtime", {}) or {}
    overhead = 0.0
    if "task_overhead_us" in runtime:
        overhead = _figure(where, "runtime.task_overhead_us", runtime["task_overhead_us"], positive=False)[0] * 1e-6

    # memory nodes
    nodes, groups = [], {}
    raw_nodes = _require(where, "", doc, "memory_nodes", list)
    if not raw_nodes:
        _fail(where, "memory_nodes", "must list at least the host memory")
    for i, item in enumerate(raw_nodes):
        p = f"memory_nodes[{i}]"
        nm = _require(where, p, item, "name", str)
        kind = _require(where, p, item, "kind", str)
        cap = _figure(where, f"{p}.capacity_GiB", item.get("capacity_GiB"))[0] * 2**30
        count = _count(where, p, item)
        if nm in groups:
            _fail(where, f"{p}.name", f"duplicate memory node {nm!r}")
        names = [nm] if count is None else [f"{nm}{j}" for j in range(count)]
        groups[nm] = list(range(len(nodes), len(nodes) + len(names)))
        nodes += [MemoryNode(n, kind, cap) for n in names]
    node_index = {n.name: i for i, n in enumerate(nodes)}

    switches = doc.get("switches", []) or []
    if not isinstance(switches, list) or not all(isinstance(s, str) for s in switches):
        _fail(where, "switches", "must be a list of names")
    for s in switches:
        if s in groups or s in node_index:
            _fail(where, "switches", f"{s!r} is also a memory node")

    # worker kinds
    kinds = {}
    raw_kinds = _require(where, "", doc, "worker_kinds", dict)
    for kname, spec in raw_kinds.items():
        p = f"worker_kinds.{kname}"
        if not isinstance(spec, dict):
            _fail(where, p, "must be a mapping of figures")
        wk = WorkerKind(kname)
        for key in spec:
            if key not in KIND_FIGURES and key not in OPTIONAL_KIND_FIGURES:
                known = ", ".join([*KIND_FIGURES, *OPTIONAL_KIND_FIGURES])
                _fail(where, f"{p}.{key}", f"unknown figure (known: {known})")
        for key, (attr, factor) in KIND_FIGURES.items():
            if key not in spec:
                _fail(where, f"{p}.{key}", "missing")
            at_most = 1.0 if key.endswith("efficiency") else None
            positive = key not in ("launch_us", "half_efficiency_gflop")
            v, src = _figure(where, f"{p}.{key}", spec[key], positive=positive, at_most=at_most)
            setattr(wk, attr, v * factor)
            wk.sources[key] = src
        for key, (attr, factor) in OPTIONAL_KIND_FIGURES.items():
            if key in spec:
                v, src = _figure(where, f"{p}.{key}", spec[key])
                setattr(wk, attr, v * factor)
                wk.sources[key] = src
        kinds[kname] = wk

    # workers
    workers = []
    raw_workers = _require(where, "", doc, "workers", list)
    if not raw_workers:
        _fail(where, "workers", "must list at least one worker")
    for i, item in enumerate(raw_workers):
        p = f"workers[{i}]"
        nm = _require(where, p, item, "name", str)
        kind = _require(where, p, item, "kind", str)
        if kind not in kinds:
            _fail(where, f"{p}.kind", f"unknown worker kind {kind!r} (declared: {', '.join(kinds) or 'none'})")
        mem = _require(where, p, item, "memory_node", str)
        if mem not in groups:
            _fail(where, f"{p}.memory_node", f"unknown memory node {mem!r} (declared: {', '.join(groups)})")
        units = item.get("units", 1)
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            _fail(where, f"{p}.units", f"must be a positive integer, got {units!r}")
        count = _count(where, p, item) or 1
        members = groups[mem]
        if len(members) > 1 and len(members) != count:
            _fail(where, f"{p}.count", f"is {count} but memory node group {mem!r} has {len(members)} members")
        for j in range(count):
            node = members[j] if len(members) > 1 else members[0]
            workers.append(Worker(nm if count == 1 else f"{nm}{j}", kind, node, units))

    # links
    links = []
    endpoints = {**{g: [nodes[i].name for i in ids] for g, ids in groups.items()}, **{s: [s] for s in switches}}
    for i, item in enumerate(doc.get("links", []) or []):
        p = f"links[{i}]"
        nm = _require(where, p, item, "name", str)
        between = _require(where, p, item, "between", list)
        if len(between) != 2 or not all(isinstance(b, str) for b in between):
            _fail(where, f"{p}.between", "must name two endpoints")
        for b in between:
            if b not in endpoints:
                _fail(where, f"{p}.between", f"unknown endpoint {b!r} (memory nodes or switches)")
        bw = _figure(where, f"{p}.bandwidth_GBps", item.get("bandwidth_GBps"))[0] * 1e9
        lat = _figure(where, f"{p}.latency_us", item.get("latency_us"), positive=False)[0] * 1e-6
        a, b = endpoints[between[0]], endpoints[between[1]]
        if len(a) > 1 and len(b) > 1:
            if len(a) != len(b):
                _fail(where, f"{p}.between", "two groups of different sizes cannot be paired")
            pairs = list(zip(a, b))
        else:
            pairs = [(x, y) for x in a for y in b]
        for x, y in pairs:
            if x == y:
                _fail(where, f"{p}.between", f"links {x!r} to itself")
            links.append(Link(f"{nm}:{x}->{y}", x, y, bw, lat))
            links.append(Link(f"{nm}:{y}->{x}", y, x, bw, lat))
    m = Machine(name, str(doc.get("description", "")), nodes, workers, kinds, links, switches, overhead, text)
    for s in range(len(nodes)):
        for d in range(len(nodes)):
            if s != d and m.routes[s][d] is None:
                _fail(where, "links", f"no route from memory node {nodes[s].name!r} to {nodes[d].name!r}")
    return m


def _routes(m: Machine) -> list[list]:
    """Directed routes between memory nodes, as lists of link indices (None: unreachable).

    Fewest hops first, then the highest bottleneck bandwidth, then the fewest
    stops in host memory (a direct peer path beats staging), then description
    order. Data may pass through switches and the host memory (node 0, where
    StarPU stages copies between devices without a direct path), never through
    another device.
    """
    names = [n.name for n in m.nodes]
    relay = set(m.switches) | {names[0]}
    routes = []
    for s, src in enumerate(names):
        best: dict[str, tuple] = {src: (0, -np.inf, 0, ())}
        changed = True
        while changed:
            changed = False
            for i, link in enumerate(m.links):
                at = best.get(link.src)
                if at is None or (link.src != src and link.src not in relay) or link.dst == src:
                    continue
                hops, neg_bw, staged, path = at
                cand = (hops + 1, max(neg_bw, -link.bandwidth), staged + (link.src == names[0] and link.src != src),
                        path + (i,))
                old = best.get(link.dst)
                if old is None or cand[:3] < old[:3]:
                    best[link.dst] = cand
                    changed = True
        routes.append([[] if d == s else (list(best[n][3]) if n in best else None)
                       for d, n in enumerate(names)])
    return routes
