"""Twenty training steps on StarPU track transformers' GPT2LMHeadModel with torch's AdamW.

Same initial weights, same batches, same AdamW settings (torch's defaults,
lr 1e-3): the loss must agree at every step to 1e-4 relative.
"""

import numpy as np
import pytest

from tilecast.reference.hf_mapping import from_hf
from tilecast.executor.starpu_run import StarPUTraining
from tilecast.executor.starpu_session import StarPUSession
from tilecast.reference.step import TrainState
from tilecast.graph import Tiling
from tilecast.graph.gpt2 import AdamWConfig, build_gpt2_step
from tilecast.graph.model_config import load_model

torch = pytest.importorskip("torch", reason="torch is needed as the numeric reference")
pytest.importorskip("transformers", reason="transformers is needed as the numeric reference")

STEPS, BATCH, SEQ = 20, 4, 32


def test_twenty_steps_track_transformers():
    from tilecast.reference.verify import hf_model

    cfg = load_model("gpt2-tiny")
    torch.set_num_threads(1)
    model = hf_model(cfg, seed=0)
    init = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    # Two batches of random tokens, alternating: something the model can learn (memorise) in 20 steps.
    batches = np.random.default_rng(7).integers(0, cfg.vocab_size, size=(2, BATCH, SEQ + 1))
    data = batches[np.arange(STEPS) % 2]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    theirs = []
    for t in range(STEPS):
        logits = model(torch.from_numpy(data[t, :, :-1])).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size),
                                                 torch.from_numpy(data[t, :, 1:]).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        theirs.append(float(loss.detach()))

    graph = build_gpt2_step(cfg, BATCH, SEQ, Tiling.parse("seq=16,head=2,inner=128,vocab=96"),
                            AdamWConfig(lr=1e-3))
    ours = []
    with StarPUSession("lws", 2) as session:
        training = StarPUTraining(session, graph, TrainState(from_hf(cfg, init)), data)
        for _ in range(STEPS):
            ours.append(training.step()[1])
    ours, theirs = np.array(ours), np.array(theirs)
    assert theirs[-1] < theirs[0] - 0.5, "the reference run should learn the two batches"
    rel = np.abs(ours - theirs) / np.abs(theirs)
    assert rel.max() <= 1e-4, f"worst step {rel.argmax()}: {ours[rel.argmax()]} vs {theirs[rel.argmax()]}"
