"""The AIO probe of StarPU's disk transfers: glibc's POSIX AIO among spinning workers takes microseconds, far
below the fitted cost per transfer (docs/memory.md, "Where StarPU's time per disk transfer goes")."""

import numpy as np
import pytest

from tilecast.kernels.native_build import NativeUnavailable
from tilecast.perfmodel.aio_wait import OPS, cores, measure_aio_wait


def test_aio_transfer_among_spinning_workers_takes_microseconds(tmp_path):
    n = cores()
    try:
        free = measure_aio_wait(str(tmp_path), n - 1, transfers=200)
    except NativeUnavailable as e:
        pytest.skip(f"the AIO probe cannot be built here: {e}")
    busy = measure_aio_wait(str(tmp_path), n, transfers=200)
    for t in (free, busy):
        assert set(t) == set(OPS) and all(len(t[op]) == 200 and (t[op] > 0).all() for op in OPS)
    med = {k: float(np.median(t["aio_write"] + t["aio_read"])) for k, t in (("free", free), ("busy", busy))}
    print(f"AIO write + read of 16 KiB, median: {med['free'] * 1e6:.1f} us with a core free, "
          f"{med['busy'] * 1e6:.1f} us with {n} spinning threads")
    # the fitted cost was 856 us per transfer: the I/O path's share, even with every core spinning, is tiny
    assert med["busy"] < 200e-6, med
    assert not list(tmp_path.iterdir())  # the probe's files are gone


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="out of range"):
        measure_aio_wait("/tmp", -1)
    with pytest.raises(OSError):
        measure_aio_wait("/nonexistent-dir-for-aio-probe", 1, transfers=2)
