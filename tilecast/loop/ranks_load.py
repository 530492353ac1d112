"""Other work on the machine, as the ranks' share of its cores: runnable threads counted per autogroup.

Linux with ``CONFIG_SCHED_AUTOGROUP`` and ``/proc/sys/kernel/sched_autogroup_enabled`` = 1 (this
machine's default) puts every session in a task group of its own and shares the CPU between groups
before threads (``autogroup_create``, ``kernel/sched/autogroup.c``; every group weighs ``NICE_0_LOAD``
and its weight is split over its runnable threads, ``calc_group_shares``, ``kernel/sched/fair.c``).
``tilecast run --ranks`` starts ``mpirun`` in a session of its own (``start_new_session``), so its ranks
form one group. With ``G`` other groups busy, the ranks do not get ``cores / (theirs + others'
threads)`` each, as counting threads assumes, but their group's fair share of the cores (max-min:
a group cannot use more cores than it has runnable threads; what it leaves goes to the others).

:func:`equivalent_background` turns the groups' runnable threads into the number of background
threads that gives the ranks' threads the same share in
:class:`tilecast.simulator.ranks_threads.CoreSharing` (which shares cores between threads);
:func:`sample_groups` counts runnable threads per group on this machine.
"""

from __future__ import annotations

import os
import time

import numpy as np


def fair_share(demands, capacity: float) -> float:
    """The max-min fair level ``s``: sum(min(d, s)) = capacity (inf when the demands fit in it)."""
    d = np.sort(np.asarray([x for x in demands if x > 0], dtype=np.float64))
    if d.sum() <= capacity:
        return float("inf")
    left, n = float(capacity), len(d)
    for i, x in enumerate(d):
        if x * (n - i) >= left:
            return left / (n - i)
        left -= x
    return float("inf")


def equivalent_background(others, threads: int, cores: int) -> float:
    """Background threads (:class:`~tilecast.simulator.ranks_threads.CoreSharing`) equivalent to other
    groups with ``others`` runnable threads each, beside the ranks' group of ``threads``, on ``cores``.

    The ranks' group gets ``min(threads, s)`` cores (``s``: :func:`fair_share`), each of its threads that
    over ``threads``; the equivalent is the ``bg`` with ``cores / (threads + bg)`` the same."""
    others = [float(x) for x in others if x > 0]
    if threads < 1 or cores < 1:
        raise ValueError(f"threads and cores must be at least 1, got {threads} and {cores}")
    s = fair_share(others + [threads], cores)
    if not np.isfinite(s) or s >= threads:  # a core for each of the ranks' threads, or no one else busy
        return 0.0
    per_thread = s / threads
    return cores / per_thread - threads


def _runnable_by_group(skip: set) -> dict:
    """{autogroup: runnable threads} now, from ``/proc/*/task/*/stat`` (state R) and
    ``/proc/*/autogroup``; threads in ``skip`` (ids) are left out."""
    groups: dict = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/autogroup") as f:
                group = f.read().split()[0]
            tids = os.listdir(f"/proc/{pid}/task")
        except (OSError, IndexError):
            continue
        for tid in tids:
            if int(tid) in skip:
                continue
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state == "R":
                groups[group] = groups.get(group, 0) + 1
    return groups


def sample_groups(samples: int = 20, every_s: float = 0.05) -> list[list[int]]:
    """``samples`` readings, ``every_s`` apart, of the runnable threads of every autogroup but this
    process's own thread (empty lists where ``/proc`` has no autogroups)."""
    skip = {os.getpid(), _tid()}
    out = []
    for i in range(samples):
        out.append(sorted(_runnable_by_group(skip).values()))
        if i + 1 < samples:
            time.sleep(every_s)
    return out


def _tid() -> int:
    try:
        return os.gettid()
    except AttributeError:  # not Linux
        return os.getpid()


def background_now(threads: int, cores: int, samples: int = 20, every_s: float = 0.05) -> dict:
    """Other work now, for a forecast of ranks keeping ``threads`` threads runnable on ``cores``:
    ``groups`` (median count of other busy autogroups), ``threads`` (median of their runnable threads) and
    ``background`` (median over the readings of :func:`equivalent_background`)."""
    got = sample_groups(samples, every_s)
    eq = [equivalent_background(g, threads, cores) for g in got]
    return {"groups": float(np.median([len(g) for g in got])) if got else 0.0,
            "threads": float(np.median([sum(g) for g in got])) if got else 0.0,
            "background": float(np.median(eq)) if eq else 0.0}


_SPIN = """
import os, sys, time
n, secs = int(sys.argv[1]), float(sys.argv[2])
r, w = os.pipe()
kids = []
for i in range(n):
    pid = os.fork() if i + 1 < n else 0
    if pid:
        kids.append(pid)
        continue
    c0, t0 = time.thread_time(), time.monotonic()
    while time.monotonic() - t0 < secs:
        pass
    os.write(w, ("%r\\n" % ((time.thread_time() - c0) / (time.monotonic() - t0))).encode())
    if i + 1 < n:
        os._exit(0)
os.close(w)
for p in kids:
    os.waitpid(p, 0)
print(os.read(r, 65536).decode().split())
"""


def measured_share(threads: int, seconds: float = 1.0) -> float:
    """The share of a core each of ``threads`` busy threads gets now, measured: ``threads`` spinning
    processes in a session of their own (as ``run --ranks`` starts its ranks) for ``seconds``, each
    reporting its CPU time over its wall time (the median). 1 on an idle machine with a core per thread."""
    import subprocess
    import sys

    if threads < 1 or not seconds > 0:
        raise ValueError(f"threads must be at least 1 and seconds > 0, got {threads} and {seconds}")
    out = subprocess.run([sys.executable, "-c", _SPIN, str(threads), str(seconds)], capture_output=True,
                         text=True, start_new_session=True, timeout=seconds * 20 + 30, check=True).stdout
    vals = [float(x.strip("'\"[],")) for x in out.split()]
    return float(min(1.0, np.median(vals))) if vals else 1.0


def background_from_share(share: float, threads: int, cores: int) -> float:
    """The background threads (:class:`~tilecast.simulator.ranks_threads.CoreSharing`) that leave each
    of ``threads`` threads ``share`` of a core on ``cores``: ``cores / share - threads``, at least 0."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    return max(0.0, cores / share - threads) if share < 1 else 0.0
