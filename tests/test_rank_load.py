"""Other work as the ranks' share of the cores: Linux shares them between autogroups before threads."""

import os

import pytest

from tilecast.loop.ranks_load import background_now, equivalent_background, fair_share
from tilecast.simulator.ranks_threads import CoreSharing


def test_fair_share_is_max_min():
    assert fair_share([1, 1], 2) == float("inf")  # everyone has a core
    assert fair_share([1, 5], 2) == pytest.approx(1.0)  # the single thread keeps its core, the rest to the other
    assert fair_share([2, 1, 1, 1, 1], 2) == pytest.approx(0.4)


def test_equivalent_background_gives_the_ranks_their_groups_share():
    # the ranks' 2 threads beside 4 sessions of 1 busy thread each, on 2 cores: 5 groups, 0.4 core each,
    # 0.2 per rank thread; counting threads would give them 2 / 6 = 0.33 each
    bg = equivalent_background([1, 1, 1, 1], threads=2, cores=2)
    assert bg == pytest.approx(8.0)
    sh = CoreSharing(cores=2, ranks=2, workers_per_rank=1, progress_drives_worker=True, background=bg)
    assert sh.core_share == pytest.approx(5.0)
    # one session of 5 busy threads: a core for it, a core for the ranks (half each), not 2 / 7
    assert equivalent_background([5], threads=2, cores=2) == pytest.approx(2.0)
    assert equivalent_background([], threads=2, cores=2) == 0.0 and equivalent_background([1], 1, 2) == 0.0
    with pytest.raises(ValueError, match="threads"):
        equivalent_background([1], threads=0, cores=2)


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="no autogroups in /proc (not Linux)")
def test_background_now_reads_proc():
    got = background_now(2, 2, samples=2, every_s=0.01)
    assert set(got) == {"groups", "threads", "background"} and got["background"] >= 0 and got["groups"] >= 0


def test_background_from_a_measured_share():
    from tilecast.loop.ranks_load import background_from_share, measured_share

    # each of 2 rank threads getting a fifth of a core on 2 cores: as 8 background threads would leave them
    assert background_from_share(0.2, 2, 2) == pytest.approx(8.0) and background_from_share(1.0, 2, 2) == 0.0
    with pytest.raises(ValueError, match="share"):
        background_from_share(0.0, 2, 2)
    share = measured_share(1, seconds=0.2)  # real spinning process; under any load a share in (0, 1]
    assert 0.0 < share <= 1.0
