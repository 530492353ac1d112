"""Twenty training steps on StarPU track transformers' GPT2LMHeadModel (or LlamaForCausalLM, eager
attention) trained with torch.optim.AdamW from the same weights on the same byte-corpus batches: the loss
agrees to 1e-4 relative at every step, and so does the validation loss (StarPU's forward-only graph) before
and after training."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the numeric reference needs torch")
pytest.importorskip("transformers", reason="the numeric reference needs transformers")

from tilecast.data.corpus import BatchSampler, load_corpus, validation_batches  # noqa: E402
from tilecast.training.loop import TrainOptions, train  # noqa: E402
from tilecast.reference import hf_mapping, hf_mapping_llama  # noqa: E402
from tilecast.reference.verify import hf_model  # noqa: E402
from tilecast.graph import Tiling  # noqa: E402
from tilecast.graph.gpt2 import AdamWConfig  # noqa: E402
from tilecast.graph.model_config import load_model  # noqa: E402

STEPS, BATCH, SEQ, LR, SEED, EVAL_BATCHES = 20, 4, 32, 3e-3, 5, 3


def validation_loss(cfg, model, corpus):
    with torch.no_grad():
        losses = [torch.nn.functional.cross_entropy(model(torch.from_numpy(ids)).logits.reshape(-1, cfg.vocab_size),
                                                    torch.from_numpy(targets).reshape(-1)).item()
                  for ids, targets in validation_batches(corpus.val, BATCH, SEQ, EVAL_BATCHES)]
    return sum(losses) / len(losses)


def transformers_losses(cfg, corpus):
    model = hf_model(cfg, SEED)
    init = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    a = AdamWConfig(lr=LR)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                            weight_decay=a.weight_decay)
    sampler, losses = BatchSampler(corpus.train, BATCH, SEQ, seed=SEED), []
    val = [validation_loss(cfg, model, corpus)]
    for _ in range(STEPS):
        ids, targets = (torch.from_numpy(x) for x in sampler.next())
        logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    val.append(validation_loss(cfg, model, corpus))
    return init, losses, val


# llama-tiny: tiles of 2 query heads meet 1 key/value head (grouped-query attention split across tiles), the
# sequence untiled as in tilecast train's default tiling (each batch tile one contiguous run of the batch)
@pytest.mark.parametrize("model,tiling,mapping", [("gpt2-tiny", "16,batch=2", hf_mapping),
                                                  ("llama-tiny", "batch=2,head=2,inner=64", hf_mapping_llama)],
                         ids=["gpt2-tiny", "llama-tiny"])
def test_twenty_starpu_steps_track_transformers(model, tiling, mapping):
    cfg = load_model(model)
    corpus = load_corpus()
    torch.set_num_threads(1)
    init, want, want_val = transformers_losses(cfg, corpus)
    res = train(TrainOptions(cfg=cfg, batch=BATCH, seq=SEQ, tiling=Tiling.parse(tiling), steps=STEPS, lr=LR,
                             sched="lws", workers=2, eval_batches=EVAL_BATCHES, eval_every=STEPS, seed=SEED,
                             initial_params=mapping.from_hf(cfg, init)),
                log=lambda line: None)
    got = np.array(res.losses)
    assert len(got) == STEPS
    assert want[-1] < want[0] - 0.5  # the reference run learns, so the comparison spans real progress
    rel = np.abs(got - want) / np.abs(want)
    assert rel.max() <= 1e-4, f"step {rel.argmax() + 1}: {got[rel.argmax()]} vs {want[rel.argmax()]}"
    assert [s for s, _ in res.val] == [0, STEPS]
    assert np.allclose([v for _, v in res.val], want_val, rtol=1e-4, atol=0)
    assert want_val[1] < want_val[0] - 0.5
