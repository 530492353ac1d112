"""One tilecast home for the loop tests: calibrations and host-cost fits made by one test are reused by the next."""

import pytest


@pytest.fixture(scope="session")
def loop_home_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tilecast-home")


@pytest.fixture
def loop_home(loop_home_dir, monkeypatch):
    monkeypatch.setenv("TILECAST_HOME", str(loop_home_dir))
    return loop_home_dir


@pytest.fixture
def own_home(tmp_path, monkeypatch, loop_home_dir):
    """An empty calibration store that shares the session's compiled kernels and detected machine."""
    import os

    for sub in ("native", "machines"):
        (loop_home_dir / sub).mkdir(exist_ok=True)
        os.symlink(loop_home_dir / sub, tmp_path / sub)
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    return tmp_path
