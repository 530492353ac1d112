"""How fast a small GPT-2 learns the standard-library byte corpus (PyTorch as the trainer).

Answers, for sizing ``tilecast train``: which model shape, batch and step count
take the validation loss from ln 256 ~ 5.5 below 2.0 within a time budget on
this machine. Trains transformers' GPT2LMHeadModel (float32, AdamW) on
:class:`~tilecast.data.corpus.BatchSampler` batches and evaluates on fixed
:func:`~tilecast.data.corpus.validation_batches`.

    python3 benchmarks/corpus_learnability.py --model '{"n_layer":4,"n_embd":128,"n_head":4,"vocab_size":256,"n_positions":128}' \
        --batch 16 --seq 128 --minutes 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from tilecast.perfmodel.local import conditions_line, run_conditions

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-tiny")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    conditions = run_conditions()
    print(conditions_line(conditions))

    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from tilecast.data.corpus import BatchSampler, load_corpus, validation_batches
    from tilecast.graph.model_config import load_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = load_model(args.model)
    model = GPT2LMHeadModel(GPT2Config(n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head,
                                       vocab_size=cfg.vocab_size, n_positions=cfg.n_positions,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                       bos_token_id=0, eos_token_id=0))  # unused; inside the byte vocabulary
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    corpus = load_corpus()
    sampler = BatchSampler(corpus.train, args.batch, args.seq, seed=0)
    val = [(torch.from_numpy(i), torch.from_numpy(t))
           for i, t in validation_batches(corpus.val, args.batch, args.seq, max_batches=8)]

    def val_loss():
        model.eval()
        with torch.no_grad():
            out = float(np.mean([torch.nn.functional.cross_entropy(
                model(i).logits.reshape(-1, cfg.vocab_size), t.reshape(-1)).item() for i, t in val]))
        model.train()
        return out

    rows = [(0, 0.0, val_loss())]
    print(f"{'step':>6} {'seconds':>8} {'val loss':>9}", file=sys.stderr)
    print(f"{0:>6} {0.0:>8.1f} {rows[0][2]:>9.3f}", file=sys.stderr)
    t0, step, below2 = time.perf_counter(), 0, None
    while time.perf_counter() - t0 < args.minutes * 60:
        ids, targets = (torch.from_numpy(a) for a in sampler.next())
        loss = torch.nn.functional.cross_entropy(model(ids).logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % args.eval_every == 0:
            v = val_loss()
            rows.append((step, time.perf_counter() - t0, v))
            print(f"{step:>6} {rows[-1][1]:>8.1f} {v:>9.3f}", file=sys.stderr)
            if below2 is None and v < 2.0:
                below2 = rows[-1][1]
    tokens = step * args.batch * args.seq
    elapsed = time.perf_counter() - t0
    print(f"{'step':>6} {'seconds':>8} {'val loss':>9}")
    for s, t, v in rows:
        print(f"{s:>6} {t:>8.1f} {v:>9.3f}")
    print(f"{cfg.n_params() / 1e6:.2f}M parameters, {step} steps, {tokens / elapsed:.0f} tokens/s, "
          f"final val loss {rows[-1][2]:.3f}, below 2.0 after "
          f"{'never' if below2 is None else f'{below2:.0f} s'} (threads {args.threads})")
    print(json.dumps({"model": cfg.shape(), "batch": args.batch, "seq": args.seq, "lr": args.lr,
                      "threads": args.threads, "steps": step, "tokens_per_s": tokens / elapsed,
                      "initial_val_loss": rows[0][2], "final_val_loss": rows[-1][2],
                      "seconds_to_val_below_2": below2, "ln256": math.log(256),
                      "curve": [{"step": s, "seconds": t, "val_loss": v} for s, t, v in rows],
                      "conditions": conditions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
