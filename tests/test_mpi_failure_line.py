"""The one line a failed `run --ranks` gives: the rank's own words where it said something, else mpirun's."""

from tilecast.executor.mpi_launch import _failure_line

MPIRUN_TAIL = """--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:
--------------------------------------------------------------------------"""


def test_a_rank_whose_python_failed_before_it_could_say_so():
    text = ("/usr/bin/python3: Error while finding module specification for 'tilecast.executor.mpi_rank' "
            "(ModuleNotFoundError: No module named 'tilecast')\n" + MPIRUN_TAIL)
    line = _failure_line(text, 1)
    assert "No module named 'tilecast'" in line and line.startswith("a rank failed (mpirun exit status 1)")
    tb = 'Traceback (most recent call last):\n  File "x.py", line 3, in <module>\nValueError: no such tiling\n'
    assert _failure_line(tb + MPIRUN_TAIL, 1).endswith("ValueError: no such tiling")


def test_the_rank_s_own_line_first_then_mpirun_s():
    assert _failure_line("tilecast rank 1: kernel gemm failed\nValueError: x: y\n" + MPIRUN_TAIL, 1) == \
        "tilecast rank 1: kernel gemm failed"
    line = _failure_line("mpirun noticed that process rank 1 with PID 7 on node h exited on signal 9 (Killed).", 137)
    assert line.endswith("exited on signal 9 (Killed).") and "exit status 137" in line
