"""The standard-library byte corpus, its split, the resumable batch sampler and validation batches."""

import json
import os

import numpy as np
import pytest

from tilecast.data.corpus import (VOCAB_SIZE, BatchSampler, DataError, load_corpus, stdlib_files,
                                    stdlib_root, validation_batches)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    saved = os.environ.get("TILECAST_HOME")
    os.environ["TILECAST_HOME"] = str(tmp_path_factory.mktemp("cache"))
    try:
        yield load_corpus()
    finally:
        if saved is None:
            del os.environ["TILECAST_HOME"]
        else:
            os.environ["TILECAST_HOME"] = saved


def test_files_are_sorted_sources_without_tests_or_site_packages():
    files = stdlib_files()
    assert files == sorted(files) and len(files) > 300
    assert "os.py" in files and "json/decoder.py" in files
    for f in files:
        parts = f.split("/")
        assert f.endswith(".py")
        assert not {"test", "tests", "idle_test", "site-packages"} & set(parts), f
        assert not parts[0].startswith("config-") and not parts[-1].startswith("_sysconfigdata"), f


def test_split_is_whole_files_without_overlap(corpus):
    assert set(corpus.train_files).isdisjoint(corpus.val_files)
    assert sorted(corpus.train_files + corpus.val_files) == stdlib_files()
    assert 0.01 < corpus.val.size / (corpus.train.size + corpus.val.size) < 0.15
    # the validation bytes are exactly the held-out files, in order
    root = stdlib_root()
    expected = b""
    for f in corpus.val_files:
        with open(os.path.join(root, f), "rb") as fh:
            b = fh.read()
        expected += b if b.endswith(b"\n") else b + b"\n"
    assert corpus.val.tobytes() == expected
    assert corpus.train.dtype == np.uint8 and corpus.train.max() < VOCAB_SIZE


def test_corpus_is_the_same_from_cache_and_from_files(corpus):
    again = load_corpus()  # from the cache written by the fixture
    fresh = load_corpus(use_cache=False)
    for other in (again, fresh):
        assert other.key == corpus.key
        assert np.array_equal(other.train, corpus.train) and np.array_equal(other.val, corpus.val)
        assert other.val_files == corpus.val_files


def test_damaged_cache_is_rebuilt(corpus):
    path = os.path.join(os.environ["TILECAST_HOME"], "corpus", f"{corpus.key}.npz")
    with open(path, "r+b") as f:
        f.truncate(1000)
    assert np.array_equal(load_corpus().train, corpus.train)


def test_targets_are_the_next_byte(corpus):
    s = BatchSampler(corpus.train, batch=4, seq=32, seed=3)
    ids, targets = s.next()
    assert ids.shape == targets.shape == (4, 32) and ids.dtype == targets.dtype == np.int64
    assert np.array_equal(ids[:, 1:], targets[:, :-1])
    text = corpus.train.tobytes()
    for row, tgt in zip(ids, targets):
        window = bytes(row.astype(np.uint8)) + bytes([tgt[-1]])
        assert window in text


def test_sampler_is_deterministic_and_depends_on_seed(corpus):
    a, b, c = (BatchSampler(corpus.train, 2, 16, seed=s) for s in (7, 7, 8))
    for _ in range(3):
        x, y, z = a.next(), b.next(), c.next()
        assert np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1])
    assert not np.array_equal(x[0], z[0])


def test_saved_state_resumes_the_same_batches(corpus):
    a = BatchSampler(corpus.train, 3, 24, seed=11)
    for _ in range(5):
        a.next()
    state = json.loads(json.dumps(a.state()))  # as it travels in a checkpoint manifest
    expected = [a.next() for _ in range(4)]
    b = BatchSampler(corpus.train, 3, 24, seed=0)
    b.set_state(state)
    assert b.draws == 5
    for (ids, tg), (ids2, tg2) in zip(expected, [b.next() for _ in range(4)]):
        assert np.array_equal(ids, ids2) and np.array_equal(tg, tg2)


def test_state_of_another_shape_is_refused(corpus):
    state = BatchSampler(corpus.train, 3, 24).state()
    with pytest.raises(DataError, match="seq 24 \\(saved\\) vs 32 \\(now\\)"):
        BatchSampler(corpus.train, 3, 32).set_state(state)


def test_validation_batches_are_fixed_and_cover_the_data(corpus):
    first = list(validation_batches(corpus.val, 4, 64, max_batches=5))
    second = list(validation_batches(corpus.val, 4, 64, max_batches=5))
    assert len(first) == 5
    for (i1, t1), (i2, t2) in zip(first, second):
        assert np.array_equal(i1, i2) and np.array_equal(t1, t2)
        assert np.array_equal(i1[:, 1:], t1[:, :-1])
    # spread over the whole validation set: the last window starts near its end
    assert first[-1][1][-1, -1] == corpus.val[-1]
    small = corpus.val[:1000]
    full = list(validation_batches(small, 2, 100))
    assert len(full) == 4  # 9 whole windows of 100 bytes (+1 target) -> 4 batches of 2
    assert np.array_equal(np.concatenate([i for i, _ in full]).ravel(), small[:800])


def test_too_short_data_is_refused():
    with pytest.raises(DataError, match="shorter than one window"):
        BatchSampler(np.zeros(10, np.uint8), 1, 16)
