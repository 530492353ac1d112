"""tune's candidates split the heads independently of the other tile sizes, and tune ranks those tilings."""

import json

import numpy as np

from tilecast.graph import Tiling
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.kernels import all_kernels
from tilecast.loop import tune
from tilecast.perfmodel import load_machine
from tilecast.loop.candidates import candidate_tilings, dims_of, effective, head_splits

from loop_home import loop_home, loop_home_dir  # noqa: F401

GPT2_SMALL = dict(n_layer=2, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
LLAMA = dict(family="llama", n_layer=2, n_embd=768, n_head=12, n_kv_head=4, intermediate_size=2048,
             vocab_size=50257, n_positions=1024)


def shape(**kw):
    return load_model(json.dumps(kw))


def attention_tasks(graph) -> int:
    names = np.array([k.name for k in all_kernels()])
    return int(np.isin(names[graph.kernel], ["attn_qk_softmax", "attn_qk", "attn_pv"]).sum())


def test_head_splits_keep_whole_key_value_groups():
    assert head_splits(shape(**GPT2_SMALL)) == [3, 6]
    assert head_splits(shape(**LLAMA)) == [3, 6]  # groups of 3 query heads: 4 and 2 tiles of groups
    assert head_splits(shape(**{**LLAMA, "n_kv_head": 2})) == [6]  # 2 groups of 6: split in 2 only
    assert head_splits(shape(**{**GPT2_SMALL, "n_head": 1, "n_embd": 64})) == []


def test_candidates_split_heads_where_attention_has_few_tiles():
    for kw in (GPT2_SMALL, LLAMA):
        cfg = shape(**kw)
        tilings = candidate_tilings(cfg, 4, 256)
        labels = {t.describe() for t in tilings}
        dims = dims_of(cfg, 4, 256)
        keys = [effective(t, dims) for t in tilings]
        assert len(set(keys)) == len(keys)
        plain = Tiling.uniform(512)
        for h in (3, 6):
            split = Tiling({**plain.sizes, "head": h})
            assert split.describe() in labels, (kw, split)
            # everything but the heads as in the plain tiling: same GEMM tiles, more attention tasks
            assert [k for d, k in zip(dims, effective(split, dims)) if d != "head"] == \
                [k for d, k in zip(dims, effective(plain, dims)) if d != "head"]
            g, g0 = build_step(cfg, 4, 256, split), build_step(cfg, 4, 256, plain)
            assert attention_tasks(g) == attention_tasks(g0) * (12 // h)
        # the tokens-whole tiling gets its split too; fine tilings, whose sequence is in many tiles, do not
        assert "embd=128,head=6,inner=128,vocab=128" in labels  # at 512 it is the uniform tiling
        assert not any(t.sizes.get("head") in (3, 6) and t.tile("seq", 256) < 128 for t in tilings)
        assert candidate_tilings(cfg, 4, 256, split_heads=False) == [
            t for t in tilings if t.tile("head", 12) == 12]


def test_tune_ranks_the_head_splits(loop_home):  # noqa: F811
    # a described machine (its kernel models need no calibration here): tune's default candidates, simulated
    cfg = load_model("gpt2-tiny")
    res = tune(cfg, 2, 32, machine=load_machine("h100-sxm5-80gb-8"), scheds=("eager",), workers=[2],
               progress=False)
    split = [p for p in res.ranking if p.config.tiling.tile("head", cfg.n_head) < cfg.n_head]
    whole = [p for p in res.ranking if p.config.tiling.tile("head", cfg.n_head) == cfg.n_head]
    assert split and whole
    assert len(res.ranking) == len(res.graphs)
    # each split was simulated on its own graph: more tasks than the same tiling with whole heads
    by_label = {p.config.tiling.describe(): p for p in res.ranking}
    for p in split:
        sizes = dict(p.config.tiling.sizes)
        del sizes["head"]
        sibling = by_label.get(Tiling(sizes).describe()) or by_label.get(
            Tiling({**sizes, "head": sizes.get("embd", 1)}).describe())
        if sibling is not None:
            assert p.tasks > sibling.tasks
            assert p.step_s != sibling.step_s
