"""The trace schema shared by predicted (simulated) and measured (StarPU) runs.

A trace is a pandas DataFrame with one row per task execution or data transfer:

============  =========  ==========================================================
column        dtype      meaning
============  =========  ==========================================================
task          int64      graph task id, or -1 for a data transfer
kernel        str        kernel name ("transfer" for a transfer)
worker        int64      worker index (for a transfer: the link index)
node          int64      memory node the work ran on (transfer: destination node)
start_s       float64    start, seconds from the start of the step
end_s         float64    end, seconds from the start of the step
bytes         int64      bytes read and written (transfer: bytes moved)
flops         float64    floating-point operations (0 for a transfer)
source        str        "sim" or "real"
tag           str        layer/phase label of the task
============  =========  ==========================================================

A trace covers a step's tasks; the step itself may take longer (the host's
work outside the tasks). Its time, when known, is ``df.attrs["step_s"]``
(predicted: makespan plus host cost; measured: the step's wall time), kept
in Parquet files (not in CSV or Chrome JSON); see :func:`with_step_time`.

A step run under a memory limit with a disk node also records its disk
traffic, ``df.attrs["disk"]`` (:func:`with_disk_counters`, Parquet only): per
step, ``written_bytes`` / ``read_bytes`` (bytes moved from main memory to the
disk node / back), ``writes`` / ``reads`` (those transfers, tiles), and, in a
prediction, ``evictions`` (tiles evicted from main memory), ``writebacks``
(of them, written to disk first), ``dropped`` (of them, dropped clean) and
``tidied`` (tiles written back ahead of need; ``writes`` = ``writebacks`` +
``tidied``). A measured trace has no eviction counts: StarPU 1.3.10 counts
the transfers on each bus (its bus profiling), not the tiles it evicts.
Traces without the field (older files, unlimited runs) read as before.

Files: Parquet (``.parquet``) or CSV (``.csv``) for the table, and Chrome Trace
Event JSON (``.json``) that opens in Perfetto: complete events (``ph: "X"``) in
microseconds, pid = memory node, tid = worker, and flow events for dependencies.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where a trace is made or read (0.4 s): predictions need none
    import pandas as pd

COLUMNS = {
    "task": "int64",
    "kernel": "object",
    "worker": "int64",
    "node": "int64",
    "start_s": "float64",
    "end_s": "float64",
    "bytes": "int64",
    "flops": "float64",
    "source": "object",
    "tag": "object",
}
SOURCES = ("sim", "real")
MPI_TRACK = 1000  # worker index of the track of messages from rank 0 in a multi-rank trace (rank S: MPI_TRACK + S)
MPI_CALLS_TRACK = 2000  # worker index of a rank's timed MPI calls (run --ranks --mpi-calls) in a multi-rank trace


class TraceError(ValueError):
    """A table that does not follow the trace schema."""


def make_trace(**columns) -> pd.DataFrame:
    """Build a trace from column arrays (scalars broadcast), in schema order and dtypes."""
    missing = [c for c in COLUMNS if c not in columns]
    if missing:
        raise TraceError(f"trace: missing columns {missing}")
    n = max((np.size(v) for v in columns.values() if np.ndim(v) > 0), default=1)
    data = {}
    for name, dtype in COLUMNS.items():
        v = columns[name]
        data[name] = np.broadcast_to(np.asarray(v), (n,)) if np.ndim(v) == 0 else np.asarray(v)
    import pandas as pd

    df = pd.DataFrame(data)
    return validate(df)


def with_step_time(df: pd.DataFrame, step_s: float) -> pd.DataFrame:
    """``df`` (a copy) recording the time of the step it traces: its makespan plus the time outside its tasks."""
    out = df.copy()
    out.attrs["step_s"] = float(step_s)
    return out


def step_time(df: pd.DataFrame) -> float | None:
    """The step time a trace records (:func:`with_step_time`), or None."""
    v = df.attrs.get("step_s")
    return None if v is None else float(v)


DISK_COUNTERS = ("written_bytes", "read_bytes", "writes", "reads", "evictions", "writebacks", "dropped", "tidied")


def with_disk_counters(df: pd.DataFrame, **counters) -> pd.DataFrame:
    """``df`` (a copy) recording the disk traffic of the step it traces (names in :data:`DISK_COUNTERS`,
    integers; the ones not known are left out)."""
    unknown = sorted(set(counters) - set(DISK_COUNTERS))
    if unknown:
        raise TraceError(f"trace: unknown disk counters {unknown} (known: {', '.join(DISK_COUNTERS)})")
    out = df.copy()
    out.attrs["disk"] = {k: int(counters[k]) for k in DISK_COUNTERS if counters.get(k) is not None}
    return out


def disk_counters(df: pd.DataFrame) -> dict | None:
    """The disk traffic a trace records (:func:`with_disk_counters`), or None."""
    v = df.attrs.get("disk")
    return None if not isinstance(v, dict) else {k: int(v[k]) for k in DISK_COUNTERS if v.get(k) is not None}


def validate(df: pd.DataFrame) -> pd.DataFrame:
    """Check columns, dtypes and basic sanity; return the frame with schema dtypes."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(f"trace: missing columns {missing}")
    df = df[list(COLUMNS)].astype(COLUMNS)
    bad_src = set(df["source"].unique()) - set(SOURCES)
    if bad_src:
        raise TraceError(f"trace: source must be one of {SOURCES}, got {sorted(bad_src)}")
    if len(df) and (df["end_s"] < df["start_s"]).any():
        raise TraceError("trace: some rows end before they start")
    return df


def save(df: pd.DataFrame, path: str, graph=None) -> str:
    """Write a trace by extension: .parquet, .csv, or .json (Chrome trace)."""
    ext = os.path.splitext(path)[1].lower()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if ext == ".parquet":
        df.to_parquet(path, index=False)
    elif ext == ".csv":
        df.to_csv(path, index=False)
    elif ext == ".json":
        text = json.dumps(to_chrome(df, graph))  # one string: faster than streaming json.dump
        with open(path, "w") as f:
            f.write(text)
    else:
        raise TraceError(f"trace: unknown file type {ext!r} (use .parquet, .csv or .json)")
    return path


def load(path: str) -> pd.DataFrame:
    """Read a trace table written by :func:`save` (.parquet or .csv)."""
    import pandas as pd

    ext = os.path.splitext(path)[1].lower()
    if not os.path.exists(path):
        raise TraceError(f"trace: no file {path}")
    if ext == ".parquet":
        df = pd.read_parquet(path)
    elif ext == ".csv":
        df = pd.read_csv(path)
    else:
        raise TraceError(f"trace: cannot read {ext!r} (use .parquet or .csv)")
    return validate(df)


def to_chrome(df: pd.DataFrame, graph=None, max_flows: int = 200_000) -> dict:
    """Chrome Trace Event JSON: one complete event per row; flow arrows for dependencies.

    Flow events need the graph's dependencies; they are drawn from each task's
    predecessors to the task (at most ``max_flows`` of them, to keep files small).
    """
    events = []
    for node in sorted(df["node"].unique().tolist()):
        events.append({"ph": "M", "name": "process_name", "pid": int(node), "args": {"name": f"memory node {node}"}})
    ts = (df["start_s"].to_numpy() * 1e6).tolist()
    dur = ((df["end_s"] - df["start_s"]).to_numpy() * 1e6).tolist()
    for row, t, d in zip(df.itertuples(index=False), ts, dur):
        events.append({
            "ph": "X", "name": row.kernel, "cat": row.source, "pid": int(row.node), "tid": int(row.worker),
            "ts": t, "dur": d, "args": {"task": int(row.task), "tag": row.tag, "flops": float(row.flops),
                                        "bytes": int(row.bytes)},
        })
    if graph is not None:
        tasks = df[df["task"] >= 0]
        where = {int(t): (int(n), int(w), s, e) for t, n, w, s, e in zip(
            tasks["task"], tasks["node"], tasks["worker"], tasks["start_s"] * 1e6, tasks["end_s"] * 1e6)}
        ptr, pred = graph.dependencies
        flow_id = 0
        for t, (n, w, s, _) in where.items():
            for p in pred[ptr[t]:ptr[t + 1]].tolist():
                if p not in where or flow_id >= max_flows:
                    continue
                pn, pw, _, pe = where[p]
                events.append({"ph": "s", "id": flow_id, "name": "dep", "cat": "dep", "pid": pn, "tid": pw, "ts": pe})
                events.append({"ph": "f", "bp": "e", "id": flow_id, "name": "dep", "cat": "dep", "pid": n, "tid": w,
                               "ts": s})
                flow_id += 1
    return {"traceEvents": events, "displayTimeUnit": "ms"}
