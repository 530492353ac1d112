"""Interrupt-and-resume through a checkpoint reproduces an uninterrupted run exactly.

The model is a byte bigram table (logits = W[previous byte]) trained with the
registry's AdamW reference kernel on corpus batches: small enough for a unit
test, and it exercises every part a resumed run needs (parameters, both AdamW
moments, the step number, the sampler's state and another RNG's state).
"""

import math
import os

import numpy as np
import pytest

from tilecast.data.checkpoint import load_checkpoint, save_checkpoint
from tilecast.data.corpus import VOCAB_SIZE, BatchSampler, load_corpus, validation_batches
from tilecast.kernels import get

MODEL = {"kind": "bigram", "vocab_size": VOCAB_SIZE}
ADAMW = dict(lr=0.1, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.01)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(use_cache=False)


def loss_and_grad(w, ids, targets):
    logits = w[ids.ravel()]                              # (tokens, 256)
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    t = targets.ravel()
    loss = float(-np.log(p[np.arange(t.size), t]).mean())
    p[np.arange(t.size), t] -= 1
    g = np.zeros_like(w)
    np.add.at(g, ids.ravel(), p / t.size)
    return loss, g.astype(np.float32)


class Run:
    def __init__(self, corpus, seed=0):
        self.sampler = BatchSampler(corpus.train, batch=8, seq=64, seed=seed)
        self.noise = np.random.default_rng(seed + 1)   # stands for dropout and the like
        self.w = np.zeros((VOCAB_SIZE, VOCAB_SIZE), np.float32)
        self.m, self.v = np.zeros_like(self.w), np.zeros_like(self.w)
        self.step = 0

    def train(self, n):
        adamw = get("adamw")
        losses = []
        for _ in range(n):
            ids, targets = self.sampler.next()
            loss, g = loss_and_grad(self.w, ids, targets)
            g += np.float32(1e-4) * self.noise.standard_normal(g.shape, dtype=np.float32)
            self.step += 1
            p = adamw.param_type(n=g.size, step=self.step, **ADAMW)
            adamw.reference(np, [self.w.reshape(-1), g.reshape(-1), self.m.reshape(-1), self.v.reshape(-1)], p)
            losses.append(loss)
        return losses

    def save(self, path):
        save_checkpoint(path, params={"w": self.w}, adam_m={"w": self.m}, adam_v={"w": self.v}, step=self.step,
                        sampler_state=self.sampler.state(), rng_state=self.noise.bit_generator.state,
                        model=MODEL, tiling={})

    def restore(self, path):
        c = load_checkpoint(path, model=MODEL)
        self.w, self.m, self.v = c.params["w"].copy(), c.adam_m["w"].copy(), c.adam_v["w"].copy()
        self.step = c.step
        self.sampler.set_state(c.sampler_state)
        self.noise.bit_generator.state = c.rng_state


def test_resumed_run_has_the_losses_of_an_uninterrupted_one(corpus, tmp_path):
    straight = Run(corpus).train(30)
    first = Run(corpus)
    losses = first.train(12)
    path = str(tmp_path / "ckpt.npz")
    first.save(path)
    second = Run(corpus, seed=123)       # a fresh process: different seeds until restored
    second.restore(path)
    losses += second.train(18)
    assert losses == straight            # exactly, not approximately
    assert straight[0] == pytest.approx(math.log(VOCAB_SIZE), rel=1e-6)
    assert straight[-1] < 0.8 * straight[0]   # it learns
    val = [loss_and_grad(second.w, i, t)[0] for i, t in validation_batches(corpus.val, 8, 64, max_batches=4)]
    assert np.mean(val) < 0.85 * math.log(VOCAB_SIZE)
    assert os.listdir(tmp_path) == ["ckpt.npz"]
