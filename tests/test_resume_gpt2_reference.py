"""GPT-2 (gpt2-tiny) trained on the byte corpus with the reference executor: a run resumed from a
checkpoint has exactly the losses of an uninterrupted one."""

import math

import pytest

from tilecast.data.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from tilecast.data.corpus import BatchSampler, load_corpus
from tilecast.reference.step import TrainState, init_gpt2_params, reference_step
from tilecast.graph.gpt2 import build_gpt2_step
from tilecast.graph.model_config import load_model
from tilecast.graph.tiling import Tiling

CFG = load_model("gpt2-tiny")
TILING = Tiling.parse("16")
BATCH, SEQ = 2, 32


@pytest.fixture(scope="module")
def setup():
    corpus = load_corpus(use_cache=False)
    return corpus, build_gpt2_step(CFG, BATCH, SEQ, TILING)


def train(graph, state, sampler, steps):
    return [reference_step(graph, state, *sampler.next(), want_grads=False).loss for _ in range(steps)]


def test_resume_matches_uninterrupted_run(setup, tmp_path):
    corpus, graph = setup
    straight = train(graph, TrainState(init_gpt2_params(CFG, seed=0)), BatchSampler(corpus.train, BATCH, SEQ, 1), 6)
    assert straight[0] == pytest.approx(math.log(256), rel=0.05)  # near-uniform at initialisation

    state, sampler = TrainState(init_gpt2_params(CFG, seed=0)), BatchSampler(corpus.train, BATCH, SEQ, 1)
    losses = train(graph, state, sampler, 3)
    path = str(tmp_path / "ckpt.npz")
    save_checkpoint(path, params=state.params, adam_m=state.m, adam_v=state.v, step=state.step,
                    sampler_state=sampler.state(), rng_state={}, model=CFG, tiling=TILING,
                    extra={"corpus": corpus.key, "losses": losses})

    c = load_checkpoint(path, model=CFG, tiling=TILING)
    resumed = TrainState(c.params, c.adam_m, c.adam_v, c.step)
    sampler2 = BatchSampler(corpus.train, BATCH, SEQ, seed=99)
    sampler2.set_state(c.sampler_state)
    assert c.extra["losses"] == losses and c.extra["corpus"] == corpus.key
    losses += train(graph, resumed, sampler2, 3)
    assert losses == straight

    with pytest.raises(CheckpointError, match="n_layer=2 in the checkpoint, 3 requested"):
        load_checkpoint(path, model=load_model('{"n_layer": 3, "n_embd": 64, "n_head": 4, "vocab_size": 256, '
                                                '"n_positions": 128}'))
