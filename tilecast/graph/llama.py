"""One Llama training step (forward, loss, backward, AdamW) as a tiled task graph.

The computation follows Hugging Face transformers' ``LlamaForCausalLM`` with
eager attention and dropout off: token embedding; pre-RMSNorm blocks with
causal grouped-query attention (query, key and value projections without
biases; RoPE on queries and keys; scaling 1/sqrt(head_dim); output
projection) and a SwiGLU MLP (down(silu(gate(x)) * up(x))); final RMSNorm; LM
head, untied or tied to the token embedding; mean next-token cross-entropy.
Then the backward pass and a ``torch.optim.AdamW`` update of every parameter.
Activation recompute (none, selective, full) as for GPT-2
(:mod:`tilecast.graph.recompute`).

Grouped-query attention: a ``head`` tile counts query heads, as for GPT-2, and
holds whole groups of query heads that share key/value heads, so a tile of
``h`` query heads meets a tile of ``h / group`` key/value heads of the same
index. Each key/value tile is copied to its query heads (``kv_expand``) for
the attention products, whose key and value gradients are summed back per
group (``kv_reduce``). A head tile that would split a group is refused.

The tiling machinery, the LM head, the cross-entropy and AdamW are those of
:mod:`tilecast.graph.gpt2`; dependencies come from access modes as there.
"""

from __future__ import annotations

import numpy as np

from tilecast.graph import ops
from tilecast.graph.builder import GraphBuilder
from tilecast.graph.gpt2 import AdamWConfig, _check_shape, _Step
from tilecast.graph.graph import Graph
from tilecast.graph.model_config import ModelConfig
from tilecast.graph.tensor import Tensor
from tilecast.graph.tiling import Tiling, TilingError


def llama_parameters(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple]]:
    """Parameter name -> (shape, tiling dims), in a fixed order."""
    E, H, KV, D, I = cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.n_inner
    params = {"wte": ((cfg.vocab_size, E), ("vocab", "embd"))}
    for layer in range(cfg.n_layer):
        p = f"h.{layer}."
        params.update({
            p + "attn_norm.g": ((E,), ("embd",)),
            p + "attn.wq": ((E, H, D), ("embd", "head", None)),
            p + "attn.wk": ((E, KV, D), ("embd", "head", None)),
            p + "attn.wv": ((E, KV, D), ("embd", "head", None)),
            p + "attn.wo": ((H, D, E), ("head", None, "embd")),
            p + "mlp_norm.g": ((E,), ("embd",)),
            p + "mlp.wgate": ((E, I), ("embd", "inner")),
            p + "mlp.wup": ((E, I), ("embd", "inner")),
            p + "mlp.wdown": ((I, E), ("inner", "embd")),
        })
    params["norm.g"] = ((E,), ("embd",))
    if not cfg.tie_word_embeddings:
        params["lm_head"] = ((cfg.vocab_size, E), ("vocab", "embd"))
    return params


def kv_head_tile(cfg: ModelConfig, tiling: Tiling) -> int:
    """Key/value heads per head tile; TilingError when a tile of query heads would split a group."""
    ht, g = tiling.tile("head", cfg.n_head), cfg.group_size
    if ht == cfg.n_head:
        return cfg.n_kv_head
    if ht % g:
        raise TilingError(
            f"tile: head={ht} splits the groups of {g} query heads that share a key/value head "
            f"({cfg.n_head} query heads, {cfg.n_kv_head} key/value heads in {cfg.name}); "
            f"use a multiple of {g}")
    return ht // g


# --- Llama's tiled operations ------------------------------------------------------

def rmsnorm(bld: GraphBuilder, x: Tensor, gamma: Tensor, stats: Tensor, y: Tensor, eps: float) -> None:
    b, s, e = ops.mesh(*x.grid)
    out = ops._ids(stats, b, s)
    beta, mode = bld.accumulate(out)
    rows, cols = ops._tok(x, b, s), x.extent(2, e)
    xs = ops._ids(x, b, s, e)
    bld.add("rms_stats", [xs, out], dict(rows=rows, cols=cols, beta=beta), modes=[None, mode])
    bld.add("rms_apply", [xs, out, ops._ids(gamma, e), ops._ids(y, b, s, e)],
            dict(rows=rows, cols=cols, n=x.shape[2], eps=eps))


def rmsnorm_backward(bld: GraphBuilder, x: Tensor, gamma: Tensor, stats: Tensor, dy: Tensor, sums: Tensor,
                     dx: Tensor, dgamma: Tensor, eps: float) -> None:
    nb, ns, ne = x.grid
    b, s, e = ops.mesh(nb, ns, ne)
    rows, cols = ops._tok(x, b, s), x.extent(2, e)
    xs, st, g, d = ops._ids(x, b, s, e), ops._ids(stats, b, s), ops._ids(gamma, e), ops._ids(dy, b, s, e)
    sum_ids = ops._ids(sums, b, s)
    beta, mode = bld.accumulate(sum_ids)
    bld.add("rms_bwd_sums", [xs, g, d, sum_ids], dict(rows=rows, cols=cols, beta=beta), modes=[None] * 3 + [mode])
    dx_ids = ops._ids(dx, b, s, e)
    beta, mode = bld.accumulate(dx_ids)
    bld.add("rms_bwd_dx", [xs, st, g, d, sum_ids, dx_ids], dict(rows=rows, cols=cols, n=x.shape[2], eps=eps, beta=beta),
            modes=[None] * 5 + [mode])
    e, b, s = ops.mesh(ne, nb, ns)
    dg = ops._ids(dgamma, e)
    beta, mode = bld.accumulate(dg)
    bld.add("rms_bwd_gamma", [ops._ids(x, b, s, e), ops._ids(stats, b, s), ops._ids(dy, b, s, e), dg],
            dict(rows=ops._tok(x, b, s), cols=x.extent(2, e), n=x.shape[2], eps=eps, beta=beta),
            modes=[None, None, None, mode])


def rope_frequencies(cfg: ModelConfig) -> dict:
    """The ``rope`` kernel's frequency parameters for ``cfg`` (see ``rope_inv_freq`` in the kernel definitions):
    theta, and the rescaling of its rope_scaling ("linear", "llama3"; none for "dynamic", whose frequencies
    change only beyond n_positions)."""
    out = dict(theta=cfg.rope_theta, factor=1.0, low_freq=0.0, high_freq=0.0, orig_pos=0.0)
    if cfg.rope_scaling == "linear":
        out.update(factor=float(cfg.rope_factor))
    elif cfg.rope_scaling == "llama3":
        out.update(factor=float(cfg.rope_factor), low_freq=float(cfg.rope_low_freq_factor),
                   high_freq=float(cfg.rope_high_freq_factor), orig_pos=float(cfg.rope_original_positions))
    return out


def rope(bld: GraphBuilder, x: Tensor, freqs: dict, sign: float) -> None:
    """Rotate a (batch, seq, heads, head_dim) tensor in place, tile by tile, at frequencies ``freqs``
    (:func:`rope_frequencies`)."""
    b, s, h = ops.mesh(*x.grid[:3])
    bld.add("rope", [ops._ids(x, b, s, h)], dict(bt=x.extent(0, b), st=x.extent(1, s), ht=x.extent(2, h),
                                                   d=x.shape[3], s0=x.start(1, s), sign=sign, **freqs))


def kv_expand(bld: GraphBuilder, kv: Tensor, full: Tensor, group: int) -> None:
    b, s, h = ops.mesh(*kv.grid[:3])
    bld.add("kv_expand", [ops._ids(kv, b, s, h), ops._ids(full, b, s, h)],
            dict(bt=kv.extent(0, b), st=kv.extent(1, s), kt=kv.extent(2, h), g=group, d=kv.shape[3]))


def kv_reduce(bld: GraphBuilder, full: Tensor, kv: Tensor, group: int) -> None:
    b, s, h = ops.mesh(*kv.grid[:3])
    out = ops._ids(kv, b, s, h)
    beta, mode = bld.accumulate(out)
    bld.add("kv_reduce", [ops._ids(full, b, s, h), out],
            dict(bt=kv.extent(0, b), st=kv.extent(1, s), kt=kv.extent(2, h), g=group, d=kv.shape[3], beta=beta),
            modes=[None, mode])


class _LlamaStep(_Step):
    def __init__(self, cfg: ModelConfig, batch, seq, tiling: Tiling, adamw, step, dtype, forward_only=False,
                 recompute="none"):
        self.kt = kv_head_tile(cfg, tiling)
        super().__init__(cfg, batch, seq, tiling, adamw, step, dtype, forward_only, recompute)

    def parameters(self) -> dict:
        return llama_parameters(self.cfg)

    def param_tiles(self, name):
        if name.endswith(("attn.wk", "attn.wv")):
            return {"head": self.kt}
        return None

    def kv_act(self, name):
        cfg = self.cfg
        return self.act_tensor(name, (self.B, self.S, cfg.n_kv_head, cfg.head_dim), ("batch", "seq", "head", None),
                               tiles={"head": self.kt})

    # --- forward -------------------------------------------------------------
    def embeddings(self):
        bld, cfg = self.bld, self.cfg
        self.ids = bld.tensor("ids", (self.B, self.S), ("batch", "seq"), "input", np.int64)
        self.targets = bld.tensor("targets", (self.B, self.S), ("batch", "seq"), "input", np.int64)
        x = self.act("x.0", (cfg.n_embd, "embd"))
        wte = self.p["wte"]
        with bld.tagged("embed.fwd"):
            b, s, e, v = ops.mesh(*x.grid, wte.grid[0])
            out = x.tile_ids(b, s, e)
            beta, mode = bld.accumulate(out)
            bld.add("embed", [self.ids.tile_ids(b, s), wte.tile_ids(v, e), out],
                    dict(tokens=x.extent(0, b) * x.extent(1, s), vt=wte.extent(0, v), et=x.extent(2, e),
                         v0=wte.start(0, v), beta=beta), modes=[None, None, mode])
        return x

    def block(self, layer: int, x, replay: bool = False):
        bld, cfg, P = self.bld, self.cfg, self.p
        E, H, D, I, G = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.n_inner, cfg.group_size
        n = f"h.{layer}."
        t = {"x": x}
        phase = "recompute" if replay else "fwd"
        with bld.tagged(f"h{layer}.attn.{phase}"):
            t["st1"] = self.act(n + "attn_norm.stats", (1, None))
            t["a"] = self.act(n + "attn_norm.out", (E, "embd"))
            rmsnorm(bld, x, P[n + "attn_norm.g"], t["st1"], t["a"], self.eps)
            t["q"] = self.act(n + "attn.q", (H, "head"), (D, None))
            ops.linear(bld, t["a"], P[n + "attn.wq"], None, t["q"])
            for c in "kv":
                t[c] = self.kv_act(n + f"attn.{c}")
                ops.linear(bld, t["a"], P[n + f"attn.w{c}"], None, t[c])
            rope(bld, t["q"], rope_frequencies(cfg), 1.0)
            rope(bld, t["k"], rope_frequencies(cfg), 1.0)
            for c in "kv":
                if G == 1:
                    t[c + "x"] = t[c]
                else:
                    t[c + "x"] = self.act(n + f"attn.{c}_heads", (H, "head"), (D, None))
                    kv_expand(bld, t[c], t[c + "x"], G)
            t["p"], t["sst"] = self.probs_tensor(n), self.softmax_stats_tensor(n)
            t["o"] = self.act(n + "attn.o", (H, "head"), (D, None))
            ops.attention(bld, t["q"], t["kx"], t["vx"], t["p"], t["sst"], t["o"])
            t["xm"] = self.act(n + "x_mid", (E, "embd"))
            ops.linear(bld, t["o"], P[n + "attn.wo"], None, t["xm"])
            ops.add_into(bld, x, t["xm"])
        with bld.tagged(f"h{layer}.mlp.{phase}"):
            t["st2"] = self.act(n + "mlp_norm.stats", (1, None))
            t["m"] = self.act(n + "mlp_norm.out", (E, "embd"))
            rmsnorm(bld, t["xm"], P[n + "mlp_norm.g"], t["st2"], t["m"], self.eps)
            t["gate"] = self.act(n + "mlp.gate", (I, "inner"))
            ops.linear(bld, t["m"], P[n + "mlp.wgate"], None, t["gate"])
            t["up"] = self.act(n + "mlp.up", (I, "inner"))
            ops.linear(bld, t["m"], P[n + "mlp.wup"], None, t["up"])
            t["act"] = self.act(n + "mlp.act", (I, "inner"))
            bld.add("swiglu", [ops.all_tiles(t["gate"]), ops.all_tiles(t["up"]), ops.all_tiles(t["act"])],
                    dict(n=ops.tile_sizes(t["act"])))
            if replay:
                return None, t
            y = self.act(f"x.{layer + 1}", (E, "embd"))
            ops.linear(bld, t["act"], P[n + "mlp.wdown"], None, y)
            ops.add_into(bld, t["xm"], y)
        return y, t

    def head_weight(self):
        return ("wte" if self.cfg.tie_word_embeddings else "lm_head")

    def head_and_loss(self, x):
        bld, cfg = self.bld, self.cfg
        with bld.tagged("head.fwd"):
            self.stf = self.act("norm.stats", (1, None))
            self.hf = self.act("norm.out", (cfg.n_embd, "embd"))
            rmsnorm(bld, x, self.p["norm.g"], self.stf, self.hf, self.eps)
            self.lm_head(self.hf, self.p[self.head_weight()])
        self.loss_tasks()

    # --- backward ------------------------------------------------------------
    def head_backward(self, x_last):
        bld, cfg = self.bld, self.cfg
        self.loss_backward()
        with bld.tagged("head.bwd"):
            dhf = self.act("norm.dout", (cfg.n_embd, "embd"))
            w = self.head_weight()
            self.lm_head_backward(self.hf, self.p[w], self.g[w], dhf)
            self.dres = self.act("dx", (cfg.n_embd, "embd"))
            sums = self.act("norm.sums", (1, None))
            rmsnorm_backward(bld, x_last, self.p["norm.g"], self.stf, dhf, sums, self.dres, self.g["norm.g"],
                             self.eps)

    def block_backward(self, layer: int, t):
        bld, cfg, P, G = self.bld, self.cfg, self.p, self.g
        E, H, D, I, grp = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.n_inner, cfg.group_size
        n = f"h.{layer}."
        dres = self.dres
        with bld.tagged(f"h{layer}.mlp.bwd"):
            dact = self.act(n + "mlp.dact", (I, "inner"))
            ops.linear_backward(bld, t["act"], P[n + "mlp.wdown"], dres, dact, G[n + "mlp.wdown"], None)
            dgate = self.act(n + "mlp.dgate", (I, "inner"))
            dup = self.act(n + "mlp.dup", (I, "inner"))
            bld.add("swiglu_bwd", [ops.all_tiles(t["gate"]), ops.all_tiles(t["up"]), ops.all_tiles(dact),
                                   ops.all_tiles(dgate), ops.all_tiles(dup)], dict(n=ops.tile_sizes(dact)))
            dm = self.act(n + "mlp_norm.dout", (E, "embd"))
            ops.linear_backward(bld, t["m"], P[n + "mlp.wgate"], dgate, dm, G[n + "mlp.wgate"], None)
            ops.linear_backward(bld, t["m"], P[n + "mlp.wup"], dup, dm, G[n + "mlp.wup"], None)
            sums = self.act(n + "mlp_norm.sums", (1, None))
            rmsnorm_backward(bld, t["xm"], P[n + "mlp_norm.g"], t["st2"], dm, sums, dres, G[n + "mlp_norm.g"],
                             self.eps)
        with bld.tagged(f"h{layer}.attn.bwd"):
            do = self.act(n + "attn.do", (H, "head"), (D, None))
            ops.linear_backward(bld, t["o"], P[n + "attn.wo"], dres, do, G[n + "attn.wo"], None)
            rowdot = bld.tensor(n + "attn.rowdot", (self.B, H, self.S), ("batch", "head", "seq"), "activation")
            dprobs = bld.tensor(n + "attn.dprobs", (self.B, H, self.S, self.S), ("batch", "head", "seq", "seq"),
                                "activation")
            dq = self.act(n + "attn.dq", (H, "head"), (D, None))
            if grp == 1:
                dk, dv = self.kv_act(n + "attn.dk"), self.kv_act(n + "attn.dv")
                dkx, dvx = dk, dv
            else:
                dkx = self.act(n + "attn.dk_heads", (H, "head"), (D, None))
                dvx = self.act(n + "attn.dv_heads", (H, "head"), (D, None))
            ops.attention_backward(bld, t["q"], t["kx"], t["vx"], t["p"], t["o"], do, rowdot, dprobs, dq, dkx, dvx)
            if grp != 1:
                dk, dv = self.kv_act(n + "attn.dk"), self.kv_act(n + "attn.dv")
                kv_reduce(bld, dkx, dk, grp)
                kv_reduce(bld, dvx, dv, grp)
            rope(bld, dq, rope_frequencies(cfg), -1.0)
            rope(bld, dk, rope_frequencies(cfg), -1.0)
            da = self.act(n + "attn_norm.dout", (E, "embd"))
            for c, d in (("q", dq), ("k", dk), ("v", dv)):
                ops.linear_backward(bld, t["a"], P[n + f"attn.w{c}"], d, da, G[n + f"attn.w{c}"], None)
            sums = self.act(n + "attn_norm.sums", (1, None))
            rmsnorm_backward(bld, t["x"], P[n + "attn_norm.g"], t["st1"], da, sums, dres, G[n + "attn_norm.g"],
                             self.eps)

    def embeddings_backward(self):
        self.token_embedding_backward()  # no position embedding

    def head_params(self) -> list:
        # the final norm's (and an untied head's) gradients are complete after the head's backward
        return ["norm.g"] + ([] if self.cfg.tie_word_embeddings else ["lm_head"])

    def embedding_params(self) -> list:
        return ["wte"]


def _check(cfg: ModelConfig, batch, seq, tiling, dtype):
    if cfg.family != "llama":
        raise ValueError(f"model {cfg.name} is of family {cfg.family}, not llama")
    dtype = _check_shape(cfg, batch, seq, dtype)
    kv_head_tile(cfg, tiling or Tiling())
    return dtype


def build_llama_step(cfg: ModelConfig, batch: int, seq: int, tiling: Tiling | None = None,
                     adamw: AdamWConfig | None = None, step: int = 1, dtype=np.float32,
                     recompute: str = "none") -> Graph:
    """The task graph of one Llama training step of ``cfg`` on a (batch, seq) batch of tokens.

    Same conventions as :func:`tilecast.graph.gpt2.build_gpt2_step`, ``recompute`` included.
    """
    dtype = _check(cfg, batch, seq, tiling, dtype)
    return _LlamaStep(cfg, batch, seq, tiling or Tiling(), adamw or AdamWConfig(), step, dtype,
                      recompute=recompute).build()


def build_llama_forward(cfg: ModelConfig, batch: int, seq: int, tiling: Tiling | None = None,
                        dtype=np.float32) -> Graph:
    """The forward pass and mean cross-entropy only, with the step's parameter names and tiles."""
    dtype = _check(cfg, batch, seq, tiling, dtype)
    return _LlamaStep(cfg, batch, seq, tiling or Tiling(), AdamWConfig(), 1, dtype, forward_only=True).build()
