"""tilecast's one home directory, its one atomic writer, and the executor fingerprint's file list."""

import os
import threading
from pathlib import Path

import pytest

from tilecast.atomic_file import atomic_write
from tilecast.home import home


def test_home_is_tilecast_home_then_xdg_then_dot_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert home() == tmp_path / "h" and home("corpus", "k.npz") == tmp_path / "h" / "corpus" / "k.npz"
    monkeypatch.delenv("TILECAST_HOME")
    assert home("native") == tmp_path / "x" / "tilecast" / "native"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert home() == Path(os.path.expanduser("~")) / ".cache" / "tilecast"


def test_every_store_lives_in_the_one_home(monkeypatch, tmp_path):
    from tilecast.executor.starpu_session import starpu_home
    from tilecast.perfmodel.calibration import calibration_path

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))
    assert calibration_path("m", "f") == str(tmp_path / "calibration" / "m-f.json")
    assert Path(starpu_home()) == tmp_path / "starpu"


def test_corpus_cache_honours_tilecast_home(monkeypatch, tmp_path):
    from tilecast.data import corpus as data

    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    for i in range(40):
        (root / "pkg" / f"m{i}.py").write_text(f"x = {i}\n")
    monkeypatch.setenv("TILECAST_HOME", str(tmp_path / "home"))
    corpus = data.load_corpus(root=str(root))
    assert (tmp_path / "home" / "corpus" / f"{corpus.key}.npz").exists()


def test_atomic_write_replaces_whole_files_and_cleans_up(tmp_path):
    path = tmp_path / "sub" / "f.json"
    with atomic_write(path, "w") as f:
        f.write("one")
    assert path.read_text() == "one"
    with pytest.raises(RuntimeError):
        with atomic_write(path, "w") as f:
            f.write("half")
            raise RuntimeError("interrupted")
    assert path.read_text() == "one" and os.listdir(path.parent) == ["f.json"]


def test_concurrent_writers_never_share_a_temporary_file(tmp_path):
    path = tmp_path / "shared.bin"
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    errors = []

    def write(p):
        try:
            for _ in range(5):
                with atomic_write(path) as f:
                    f.write(p)
        except Exception as e:  # pragma: no cover - the assertion below reports it
            errors.append(e)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert path.read_bytes() in payloads and os.listdir(tmp_path) == ["shared.bin"]


def test_executor_fingerprint_covers_every_executor_file():
    import tilecast
    from tilecast.loop.host_cost import executor_files

    pkg = Path(tilecast.__file__).parent
    files = set(executor_files())
    on_disk = {p.relative_to(pkg).as_posix() for package in ("executor", "reference")
               for p in (pkg / package).rglob("*")
               if p.suffix in (".py", ".c", ".h") and "__pycache__" not in p.parts}
    assert on_disk <= files and "executor/c/starpu_glue.c" in files and "trace.py" in files
    assert "reference/tiles.py" in files and "reference/step.py" in files
