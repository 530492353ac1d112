"""One GPT-2 training step (forward, loss, backward, AdamW) as a tiled task graph.

The computation follows Hugging Face transformers' ``GPT2LMHeadModel`` with
dropout off: token + learned position embeddings; pre-LayerNorm blocks with
causal multi-head attention (fused QKV projection, here three projections of
whole heads; scaling 1/sqrt(head_dim); output projection) and a 4x MLP with the
tanh GELU; final LayerNorm; LM head tied to the token embedding; mean
next-token cross-entropy. Then the backward pass and a ``torch.optim.AdamW``
update of every parameter, each layer's update submitted as soon as its
gradients are complete. With activation recompute (``recompute``, see
:mod:`tilecast.graph.recompute`) some forward tasks are issued again in the
backward pass, into new tiles, instead of keeping their outputs.

Parameter names (``gpt2_parameters``) are tilecast's; ``verify`` maps them to
transformers' names.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilecast.graph import ops
from tilecast.graph.builder import GraphBuilder
from tilecast.graph.graph import Graph
from tilecast.graph.model_config import ModelConfig
from tilecast.graph.recompute import PREFIX, check_recompute
from tilecast.graph.tiling import Tiling
from tilecast.errors import FieldError


@dataclass(frozen=True)
class AdamWConfig:
    """torch.optim.AdamW's defaults, except the learning rate."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01


def gpt2_parameters(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple]]:
    """Parameter name -> (shape, tiling dims), in a fixed order."""
    E, H, D, I = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.n_inner
    params = {
        "wte": ((cfg.vocab_size, E), ("vocab", "embd")),
        "wpe": ((cfg.n_positions, E), ("seq", "embd")),
    }
    for layer in range(cfg.n_layer):
        p = f"h.{layer}."
        params.update({
            p + "ln_1.g": ((E,), ("embd",)),
            p + "ln_1.b": ((E,), ("embd",)),
            p + "attn.wq": ((E, H, D), ("embd", "head", None)),
            p + "attn.wk": ((E, H, D), ("embd", "head", None)),
            p + "attn.wv": ((E, H, D), ("embd", "head", None)),
            p + "attn.bq": ((H, D), ("head", None)),
            p + "attn.bk": ((H, D), ("head", None)),
            p + "attn.bv": ((H, D), ("head", None)),
            p + "attn.wo": ((H, D, E), ("head", None, "embd")),
            p + "attn.bo": ((E,), ("embd",)),
            p + "ln_2.g": ((E,), ("embd",)),
            p + "ln_2.b": ((E,), ("embd",)),
            p + "mlp.wfc": ((E, I), ("embd", "inner")),
            p + "mlp.bfc": ((I,), ("inner",)),
            p + "mlp.wproj": ((I, E), ("inner", "embd")),
            p + "mlp.bproj": ((E,), ("embd",)),
        })
    params["ln_f.g"] = ((E,), ("embd",))
    params["ln_f.b"] = ((E,), ("embd",))
    return params


def grad_name(param: str) -> str:
    return f"grad:{param}"


def adam_names(param: str) -> tuple[str, str]:
    return f"adam_m:{param}", f"adam_v:{param}"


class _Step:
    """Builds the step; one method per part of the model."""

    def __init__(self, cfg: ModelConfig, batch: int, seq: int, tiling: Tiling, adamw: AdamWConfig, step: int,
                 dtype, forward_only: bool = False, recompute: str = "none"):
        self.cfg, self.B, self.S, self.opt, self.step = cfg, batch, seq, adamw, step
        self.forward_only = forward_only
        self.recompute = check_recompute(recompute)
        self.eps = cfg.layer_norm_epsilon
        self.prefix = ""  # PREFIX while a layer's forward is replayed: its activations are new tensors
        self.bld = GraphBuilder(tiling, meta=dict(
            model=cfg.to_dict(), batch=batch, seq=seq, tiling=tiling.describe(), adamw=adamw.__dict__, step=step,
            dtype=np.dtype(dtype).name, recompute=self.recompute), dtype=dtype)
        self.p, self.g = {}, {}
        for name, (shape, dims) in self.parameters().items():
            tile = self.param_tiles(name)
            self.p[name] = self._tensor(name, shape, dims, "param", tile)
            if forward_only:
                continue
            self.g[name] = self._tensor(grad_name(name), shape, dims, "grad", tile)
            for state in adam_names(name):
                self._tensor(state, shape, dims, "optim", tile)

    def parameters(self) -> dict:
        return gpt2_parameters(self.cfg)

    def param_tiles(self, name) -> dict | None:
        """Tile sizes that differ from the tiling's for one parameter (and its gradient and moments)."""
        if name == "wpe":
            # Position tiles line up with the sequence tiles of the activations.
            return {"seq": self.bld.tiling.tile("seq", self.S)}
        return None

    def _tensor(self, name, shape, dims, kind, tile=None):
        return self.bld.tensor(name, shape, dims, kind, tiles=tile)

    def act(self, name, *features):
        """An activation (batch, seq, features...) tensor."""
        shape = (self.B, self.S) + tuple(f[0] for f in features)
        return self.act_tensor(name, shape, ("batch", "seq") + tuple(f[1] for f in features))

    def act_tensor(self, name, shape, dims, tiles=None):
        """An activation tensor of any layout (named ``recompute:name`` in a replayed forward)."""
        return self.bld.tensor(self.prefix + name, shape, dims, "activation", tiles=tiles)

    def probs_tensor(self, n):
        """A layer's attention probabilities (batch, head, seq, seq)."""
        H, B, S = self.cfg.n_head, self.B, self.S
        return self.act_tensor(n + "attn.probs", (B, H, S, S), ("batch", "head", "seq", "seq"))

    def softmax_stats_tensor(self, n):
        """A layer's per-row softmax statistics (max, sum) of its attention scores."""
        H, B, S = self.cfg.n_head, self.B, self.S
        return self.act_tensor(n + "attn.stats", (B, H, S, 2), ("batch", "head", "seq", None))

    # --- forward -------------------------------------------------------------
    def embeddings(self):
        bld, cfg = self.bld, self.cfg
        self.ids = bld.tensor("ids", (self.B, self.S), ("batch", "seq"), "input", np.int64)
        self.targets = bld.tensor("targets", (self.B, self.S), ("batch", "seq"), "input", np.int64)
        x = self.act("x.0", (cfg.n_embd, "embd"))
        wte, wpe = self.p["wte"], self.p["wpe"]
        with bld.tagged("embed.fwd"):
            b, s, e, v = ops.mesh(*x.grid, wte.grid[0])
            out = x.tile_ids(b, s, e)
            beta, mode = bld.accumulate(out)
            bld.add("embed", [self.ids.tile_ids(b, s), wte.tile_ids(v, e), out],
                    dict(tokens=x.extent(0, b) * x.extent(1, s), vt=wte.extent(0, v), et=x.extent(2, e),
                         v0=wte.start(0, v), beta=beta), modes=[None, None, mode])
            b, s, e = ops.mesh(*x.grid)
            bld.add("pos_add", [wpe.tile_ids(s, e), x.tile_ids(b, s, e)],
                    dict(bt=x.extent(0, b), st=x.extent(1, s), et=x.extent(2, e)))
        return x

    def block(self, layer: int, x, replay: bool = False):
        """The layer's forward from input ``x``: (output, activations the backward pass reads).

        ``replay``: the forward issued again in the backward pass (full recompute), tagged
        ``recompute``, into new tensors, without the last projection (output None).
        """
        bld, cfg, P = self.bld, self.cfg, self.p
        E, H, D, I = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.n_inner
        n = f"h.{layer}."
        t = {"x": x}
        phase = "recompute" if replay else "fwd"
        with bld.tagged(f"h{layer}.attn.{phase}"):
            t["st1"] = self.act(n + "ln_1.stats", (2, None))
            t["a"] = self.act(n + "ln_1.out", (E, "embd"))
            ops.layernorm(bld, x, P[n + "ln_1.g"], P[n + "ln_1.b"], t["st1"], t["a"], self.eps)
            for c in "qkv":
                t[c] = self.act(n + f"attn.{c}", (H, "head"), (D, None))
                ops.linear(bld, t["a"], P[n + f"attn.w{c}"], P[n + f"attn.b{c}"], t[c])
            t["p"], t["sst"] = self.probs_tensor(n), self.softmax_stats_tensor(n)
            t["o"] = self.act(n + "attn.o", (H, "head"), (D, None))
            ops.attention(bld, t["q"], t["k"], t["v"], t["p"], t["sst"], t["o"])
            t["xm"] = self.act(n + "x_mid", (E, "embd"))
            ops.linear(bld, t["o"], P[n + "attn.wo"], P[n + "attn.bo"], t["xm"])
            ops.add_into(bld, x, t["xm"])
        with bld.tagged(f"h{layer}.mlp.{phase}"):
            t["st2"] = self.act(n + "ln_2.stats", (2, None))
            t["m"] = self.act(n + "ln_2.out", (E, "embd"))
            ops.layernorm(bld, t["xm"], P[n + "ln_2.g"], P[n + "ln_2.b"], t["st2"], t["m"], self.eps)
            t["f"] = self.act(n + "mlp.fc", (I, "inner"))
            ops.linear(bld, t["m"], P[n + "mlp.wfc"], P[n + "mlp.bfc"], t["f"])
            t["gelu"] = self.act(n + "mlp.gelu", (I, "inner"))
            ops.gelu(bld, t["f"], t["gelu"])
            if replay:
                return None, t
            y = self.act(f"x.{layer + 1}", (E, "embd"))
            ops.linear(bld, t["gelu"], P[n + "mlp.wproj"], P[n + "mlp.bproj"], y)
            ops.add_into(bld, t["xm"], y)
        return y, t

    def recomputed(self, layer: int, t: dict) -> dict:
        """The activations layer ``layer``'s backward reads, after issuing what the recompute setting
        recomputes (:mod:`tilecast.graph.recompute`); ``t`` is what its forward returned."""
        if self.recompute == "none":
            return t
        self.prefix = PREFIX
        try:
            if self.recompute == "full":
                return self.block(layer, t["x"], replay=True)[1]
            p, stats = self.probs_tensor(f"h.{layer}."), self.softmax_stats_tensor(f"h.{layer}.")
        finally:
            self.prefix = ""
        with self.bld.tagged(f"h{layer}.attn.recompute"):
            ops.attention_probs(self.bld, t["q"], t.get("kx", t["k"]), p, stats)
        return {**t, "p": p, "sst": stats}

    def head_and_loss(self, x):
        bld, cfg = self.bld, self.cfg
        E = cfg.n_embd
        with bld.tagged("head.fwd"):
            self.stf = self.act("ln_f.stats", (2, None))
            self.hf = self.act("ln_f.out", (E, "embd"))
            ops.layernorm(bld, x, self.p["ln_f.g"], self.p["ln_f.b"], self.stf, self.hf, self.eps)
            self.lm_head(self.hf, self.p["wte"])
        self.loss_tasks()

    def lm_head(self, h, w):
        """logits = h w^T, w stored (vocab, embd)."""
        bld = self.bld
        self.logits = self.act("logits", (self.cfg.vocab_size, "vocab"))
        b, s, v, e = ops.mesh(*self.logits.grid, h.grid[2])
        ops.gemm(bld, h.tile_ids(b, s, e), w.tile_ids(v, e), self.logits.tile_ids(b, s, v), 0, 1,
                 ops._tok(h, b, s), w.extent(0, v), h.extent(2, e))

    def loss_tasks(self):
        """Mean next-token cross-entropy of ``self.logits`` into tensor ``loss``."""
        bld = self.bld
        with bld.tagged("loss"):
            lg = self.logits
            self.cst = self.act("loss.stats", (2, None))
            picked = self.act("loss.picked")
            self.loss = bld.tensor("loss", (1,), (None,), "loss")
            b, s, v = ops.mesh(*lg.grid)
            rows, vt, v0 = ops._tok(lg, b, s), lg.extent(2, v), lg.start(2, v)
            st_ids = self.cst.tile_ids(b, s, 0)
            beta, mode = bld.accumulate(st_ids)
            bld.add("softmax_stats", [lg.tile_ids(b, s, v), st_ids], dict(rows=rows, cols=vt, beta=beta),
                    modes=[None, mode])
            pk = picked.tile_ids(b, s)
            beta, mode = bld.accumulate(pk)
            bld.add("ce_target", [lg.tile_ids(b, s, v), self.targets.tile_ids(b, s), pk],
                    dict(rows=rows, vt=vt, v0=v0, beta=beta), modes=[None, None, mode])
            b, s = ops.mesh(*lg.grid[:2])
            loss_ids = np.zeros(len(b), dtype=np.int64) + self.loss.first_tile
            beta, mode = bld.accumulate(loss_ids)
            scale = 1.0 / (self.B * self.S)
            bld.add("ce_loss", [self.cst.tile_ids(b, s, 0), picked.tile_ids(b, s), loss_ids],
                    dict(rows=ops._tok(lg, b, s), scale=scale, beta=beta), modes=[None, None, mode])

    # --- backward ------------------------------------------------------------
    def loss_backward(self):
        """d loss / d logits, in place of the logits."""
        bld, lg = self.bld, self.logits
        with bld.tagged("loss"):
            b, s, v = ops.mesh(*lg.grid)
            bld.add("ce_grad", [lg.tile_ids(b, s, v), self.cst.tile_ids(b, s, 0), self.targets.tile_ids(b, s)],
                    dict(rows=ops._tok(lg, b, s), vt=lg.extent(2, v), v0=lg.start(2, v), scale=1.0 / (self.B * self.S)))

    def lm_head_backward(self, h, w, gw, dh):
        """dh = dlogits w; gw (+)= dlogits^T h."""
        bld, lg = self.bld, self.logits
        b, s, e, v = ops.mesh(*h.grid, lg.grid[2])
        ops.gemm(bld, lg.tile_ids(b, s, v), w.tile_ids(v, e), dh.tile_ids(b, s, e), 0, 0,
                 ops._tok(h, b, s), h.extent(2, e), lg.extent(2, v))
        v, e, b, s = ops.mesh(lg.grid[2], h.grid[2], *h.grid[:2])
        ops.gemm(bld, lg.tile_ids(b, s, v), h.tile_ids(b, s, e), gw.tile_ids(v, e), 1, 0,
                 lg.extent(2, v), h.extent(2, e), ops._tok(h, b, s))

    def head_backward(self, x_last):
        bld, cfg = self.bld, self.cfg
        self.loss_backward()
        with bld.tagged("head.bwd"):
            hf = self.hf
            dhf = self.act("ln_f.dout", (cfg.n_embd, "embd"))
            self.lm_head_backward(hf, self.p["wte"], self.g["wte"], dhf)
            self.dres = self.act("dx", (cfg.n_embd, "embd"))
            sums = self.act("ln_f.sums", (2, None))
            ops.layernorm_backward(bld, x_last, self.p["ln_f.g"], self.stf, dhf, sums, self.dres,
                                   self.g["ln_f.g"], self.g["ln_f.b"], self.eps)

    def block_backward(self, layer: int, t):
        bld, cfg, P, G = self.bld, self.cfg, self.p, self.g
        E, H, D, I = cfg.n_embd, cfg.n_head, cfg.head_dim, cfg.n_inner
        n = f"h.{layer}."
        dres = self.dres
        with bld.tagged(f"h{layer}.mlp.bwd"):
            dg = self.act(n + "mlp.dgelu", (I, "inner"))
            ops.linear_backward(bld, t["gelu"], P[n + "mlp.wproj"], dres, dg, G[n + "mlp.wproj"], G[n + "mlp.bproj"])
            ops.gelu_backward(bld, t["f"], dg)
            dm = self.act(n + "ln_2.dout", (E, "embd"))
            ops.linear_backward(bld, t["m"], P[n + "mlp.wfc"], dg, dm, G[n + "mlp.wfc"], G[n + "mlp.bfc"])
            sums = self.act(n + "ln_2.sums", (2, None))
            ops.layernorm_backward(bld, t["xm"], P[n + "ln_2.g"], t["st2"], dm, sums, dres,
                                   G[n + "ln_2.g"], G[n + "ln_2.b"], self.eps)
        with bld.tagged(f"h{layer}.attn.bwd"):
            do = self.act(n + "attn.do", (H, "head"), (D, None))
            ops.linear_backward(bld, t["o"], P[n + "attn.wo"], dres, do, G[n + "attn.wo"], G[n + "attn.bo"])
            rowdot = bld.tensor(n + "attn.rowdot", (self.B, H, self.S), ("batch", "head", "seq"), "activation")
            dprobs = bld.tensor(n + "attn.dprobs", (self.B, H, self.S, self.S), ("batch", "head", "seq", "seq"),
                                "activation")
            d = {c: self.act(n + f"attn.d{c}", (H, "head"), (D, None)) for c in "qkv"}
            ops.attention_backward(bld, t["q"], t["k"], t["v"], t["p"], t["o"], do, rowdot, dprobs,
                                   d["q"], d["k"], d["v"])
            da = self.act(n + "ln_1.dout", (E, "embd"))
            for c in "qkv":
                ops.linear_backward(bld, t["a"], P[n + f"attn.w{c}"], d[c], da, G[n + f"attn.w{c}"],
                                    G[n + f"attn.b{c}"])
            sums = self.act(n + "ln_1.sums", (2, None))
            ops.layernorm_backward(bld, t["x"], P[n + "ln_1.g"], t["st1"], da, sums, dres,
                                   G[n + "ln_1.g"], G[n + "ln_1.b"], self.eps)

    def token_embedding_backward(self):
        """The token embedding's gradient (accumulated onto what a tied LM head wrote)."""
        bld, dx = self.bld, self.dres
        wte, gwte = self.p["wte"], self.g["wte"]
        with bld.tagged("embed.bwd"):
            v, e, b, s = ops.mesh(wte.grid[0], dx.grid[2], *dx.grid[:2])
            out = gwte.tile_ids(v, e)
            beta, mode = bld.accumulate(out)
            bld.add("embed_bwd", [self.ids.tile_ids(b, s), dx.tile_ids(b, s, e), out],
                    dict(tokens=dx.extent(0, b) * dx.extent(1, s), vt=wte.extent(0, v), et=dx.extent(2, e),
                         v0=wte.start(0, v), beta=beta), modes=[None, None, mode])

    def embeddings_backward(self):
        self.token_embedding_backward()
        bld, dx, gwpe = self.bld, self.dres, self.g["wpe"]
        with bld.tagged("embed.bwd"):
            ops.fill(bld, ops.all_tiles(gwpe), ops.tile_sizes(gwpe))
            s, e, b = ops.mesh(dx.grid[1], dx.grid[2], dx.grid[0])
            bld.add("pos_bwd", [dx.tile_ids(b, s, e), gwpe.tile_ids(s, e)],
                    dict(bt=dx.extent(0, b), st=dx.extent(1, s), et=dx.extent(2, e), beta=1.0))

    def adamw(self, names, tag):
        bld, o = self.bld, self.opt
        with bld.tagged(tag):
            for name in names:
                p = self.p[name]
                g = self.g[name]
                left = bld.unwritten(g)
                if len(left):
                    sizes = np.prod(g.tile_shapes(), axis=1)[left - g.first_tile]
                    ops.fill(bld, left, sizes)
                m, v = (bld.tensors_by_name[s] for s in adam_names(name))
                bld.add("adamw", [ops.all_tiles(p), ops.all_tiles(g), ops.all_tiles(m), ops.all_tiles(v)],
                        dict(n=ops.tile_sizes(p), lr=o.lr, beta1=o.beta1, beta2=o.beta2, eps=o.eps,
                             weight_decay=o.weight_decay, step=self.step))

    def head_params(self) -> list:
        """Parameters updated right after the head's backward, their gradients complete (GPT-2: none; its
        final norm and tied head are updated with the embeddings)."""
        return []

    def embedding_params(self) -> list:
        """Parameters updated last, after the embeddings' backward."""
        return ["wte", "wpe", "ln_f.g", "ln_f.b"]

    def build(self) -> Graph:
        cfg = self.cfg
        x = self.embeddings()
        saved = []
        for layer in range(cfg.n_layer):
            x, t = self.block(layer, x)
            saved.append(t)
        self.head_and_loss(x)
        if self.forward_only:
            return self.bld.build()
        self.head_backward(x)
        if self.head_params():
            self.adamw(self.head_params(), "head.adamw")
        layer_params = {l: [n for n in self.p if n.startswith(f"h.{l}.")] for l in range(cfg.n_layer)}
        for layer in reversed(range(cfg.n_layer)):
            self.block_backward(layer, self.recomputed(layer, saved[layer]))
            self.adamw(layer_params[layer], f"h{layer}.adamw")
        self.embeddings_backward()
        self.adamw(self.embedding_params(), "embed.adamw")
        return self.bld.build()


def _check_shape(cfg: ModelConfig, batch: int, seq: int, dtype) -> np.dtype:
    cfg.check_batch_seq(batch, seq)
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise FieldError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


def build_gpt2_forward(cfg: ModelConfig, batch: int, seq: int, tiling: Tiling | None = None,
                       dtype=np.float32) -> Graph:
    """The forward pass and mean cross-entropy only (evaluation): tensor ``loss`` from ``ids`` and ``targets``.

    Its parameter tensors have the same names and tiles as those of
    :func:`build_gpt2_step` with the same tiling, so an executor can point them
    at a training step's parameter tiles without copying. No gradient or
    optimizer tensors are declared.
    """
    dtype = _check_shape(cfg, batch, seq, dtype)
    return _Step(cfg, batch, seq, tiling or Tiling(), AdamWConfig(), 1, dtype, forward_only=True).build()


def build_gpt2_step(cfg: ModelConfig, batch: int, seq: int, tiling: Tiling | None = None,
                    adamw: AdamWConfig | None = None, step: int = 1, dtype=np.float32,
                    recompute: str = "none") -> Graph:
    """The task graph of one training step of ``cfg`` on a (batch, seq) batch of tokens.

    ``step`` is AdamW's 1-based step number (bias correction); change it on a
    built graph with ``graph.set_param("adamw", "step", t)``. ``dtype`` is the
    floating-point type of every tensor (float32; float64 for numerical checks).
    ``recompute`` (none, selective, full) chooses which activations are recomputed
    in the backward pass instead of kept (:mod:`tilecast.graph.recompute`).
    """
    dtype = _check_shape(cfg, batch, seq, dtype)
    return _Step(cfg, batch, seq, tiling or Tiling(), adamw or AdamWConfig(), step, dtype,
                 recompute=recompute).build()
