"""benchmarks/system_counters.py: a StarPU worker's own thread is told from the AIO helper threads that take its
name by being alive at both ends of the step."""

import ctypes
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from system_counters import StepCounters  # noqa: E402

PR_SET_NAME = 15


def _busy(name: bytes, seconds: float, started: threading.Event | None = None, until: threading.Event | None = None,
          go: threading.Event | None = None, burned: threading.Event | None = None):
    """Rename this OS thread (as StarPU names its workers, as glibc's AIO helpers inherit), then (with ``go``,
    once it is set) burn processor time for ``seconds``; then, with ``until``, wait for it."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    if started is not None:
        started.set()
    if go is not None:
        go.wait(30)
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        pass
    if burned is not None:
        burned.set()
    if until is not None:
        until.wait(30)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")
def test_a_workers_own_thread_is_counted_apart_from_a_short_lived_thread_of_its_name(tmp_path):
    counters = StepCounters(str(tmp_path))
    started, go, burned, done = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    worker = threading.Thread(target=_busy, args=(b"CPU 0", 0.4, started, done, go, burned))
    worker.start()
    started.wait(10)
    counters.start()
    go.set()  # the worker burns its 0.4 s inside the step, however busy the machine is
    helper = threading.Thread(target=_busy, args=(b"CPU 0", 0.3))  # ends within the step, as an AIO helper does
    helper.start()
    helper.join()
    burned.wait(30)
    time.sleep(0.05)
    counters.mark()
    done.set()
    worker.join()
    counters.stop()
    (step,) = counters.steps()
    process_s = step["process_user_s"] + step["process_system_s"]
    # the worker's 0.4 s, all of it within the step, apart from the helper's 0.3 s
    assert 0.35 <= step["workers_cpu_s"] <= 0.45 and step["workers_waiting_for_a_core_s"] >= 0, step
    assert step["process_other_cpu_s"] >= 0.25, step
    assert step["process_other_cpu_s"] == pytest.approx(process_s - step["workers_cpu_s"])
    assert step["reclaimed_bytes"] >= 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")
def test_pages_touched_first_in_a_step_are_counted(tmp_path):
    import mmap

    counters = StepCounters(str(tmp_path))
    counters.start()
    counters.mark()  # an empty step
    pages = 2048
    buf = mmap.mmap(-1, pages * mmap.PAGESIZE)  # fresh anonymous pages: each faults in when first written
    for k in range(pages):
        buf[k * mmap.PAGESIZE] = 1
    counters.mark()
    counters.stop()
    buf.close()
    empty, touched = counters.steps()
    assert touched["process_minor_faults"] >= pages > empty["process_minor_faults"], (empty, touched)
