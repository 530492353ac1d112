"""Llama models through the commands: graph, simulate and run take them; the others say so in one line."""

import json

import numpy as np
import pytest

from tilecast.cli import main
from tilecast.graph import Tiling
from tilecast.graph.llama import build_llama_forward, build_llama_step, llama_parameters
from tilecast.graph.model_config import load_model
from tilecast.kernels import all_kernels


def test_step_graph_declares_every_parameter_with_grads_and_moments():
    cfg = load_model("llama-tiny")
    g = build_llama_step(cfg, 2, 8, Tiling.parse("seq=4,embd=16,head=2,inner=48,vocab=100"))
    names = {t.name for t in g.tensors}
    for p in llama_parameters(cfg):
        assert {p, f"grad:{p}", f"adam_m:{p}", f"adam_v:{p}"} <= names
    assert g.tensor("h.0.attn.wk").tile[1] == 1  # a tile of 2 query heads meets 1 key/value head
    names = [k.name for k in all_kernels()]
    used = {names[k] for k in np.unique(g.kernel)}
    assert {"rms_stats", "rms_bwd_dx", "rope", "swiglu", "swiglu_bwd", "kv_expand", "kv_reduce"} <= used
    assert not {"ln_stats", "gelu", "bias_add", "pos_add"} & used
    fwd = build_llama_forward(cfg, 2, 8, Tiling.parse("seq=4"))
    assert not any(t.kind in ("grad", "optim") for t in fwd.tensors)


def test_graph_and_simulate_take_a_llama(capsys, tmp_path):
    assert main(["graph", "--model", "llama-tiny", "--batch", "1", "--seq", "8", "--tile", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tasks"] > 0
    rc = main(["simulate", "--model", "llama-tiny", "--batch", "1", "--seq", "8", "--tile", "8", "--json",
               "--no-trace"])
    assert rc == 0 and json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("command", ["train", "tune", "calibrate"])
def test_commands_without_llama_say_so_in_one_line(command, capsys):
    assert main([command, "--model", "llama-tiny"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GPT-2 models only" in err[0]


def test_run_on_starpu_matches_the_reference(capsys):
    rc = main(["run", "--model", "llama-tiny", "--batch", "2", "--seq", "8", "--tile", "seq=4,embd=32,head=2",
               "--workers", "1", "--steps", "2", "--check", "--json"])
    out = capsys.readouterr().out
    if rc == 2 and "StarPU" in out + capsys.readouterr().err:
        pytest.skip("StarPU is not available here")
    res = json.loads(out)
    assert rc == 0 and res["check"]["ok"]
    assert res["losses"][0] == pytest.approx(np.log(256), abs=0.15)  # 16 tokens of a fresh model
