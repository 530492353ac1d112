"""Llama models through the commands: graph, simulate, run, calibrate and tune take them as they take GPT-2."""

import dataclasses
import json

import numpy as np
import pytest

from tilecast.cli import main
from tilecast.graph import Tiling
from tilecast.graph.llama import build_llama_forward, build_llama_step, llama_parameters
from tilecast.graph.model_config import load_model
from tilecast.kernels import all_kernels
from tilecast.loop.execute import execute
from tilecast.loop.tune import starpu_policies, tune

from loop_home import loop_home, loop_home_dir  # noqa: F401


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


def test_calibrate_times_the_llama_kernels(loop_home, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "cal.json"
    assert main(["calibrate", "--model", "llama-tiny", "--batch", "1", "--seq", "16", "--tile", "8", "--tiles", "16",
                 "--repeats", "1", "--per-kernel", "2", "--output", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    timed = set(json.loads(out.read_text())["points"])
    assert res["kernels"] == len(timed)
    # RMSNorm, RoPE, SwiGLU and grouped-query attention's key/value expansion, forward and backward
    assert {"rms_stats", "rms_apply", "rms_bwd_dx", "rms_bwd_gamma", "rope", "swiglu", "swiglu_bwd", "kv_expand",
            "kv_reduce", "attn_qk"} <= timed
    # GPT-2's own kernels only for the step probe (a GPT-2 shape, tilecast.loop.step_probe): its shapes alone
    from tilecast.loop.kernel_calibration import missing_cases
    from tilecast.loop.step_probe import probe_graph
    from tilecast.perfmodel.calibration import Calibration

    doc = json.loads(out.read_text())
    gpt2_only = {k: v for k, v in doc["points"].items() if k in ("ln_stats", "gelu")}
    probe = {(name, tuple(float(x) for x in row)) for name, row in missing_cases(None, [probe_graph()])}
    assert all((k, tuple(float(x) for x in shape)) in probe for k, e in gpt2_only.items() for shape in e["shapes"])
    assert res["in_step_source"] == Calibration.load(str(out)).in_step_source
    assert res["llc_source"] == Calibration.load(str(out)).llc_source and res["llc_source"]  # sysfs's, measured or not
    # timed in StarPU: the probe ran and was fitted
    assert bool(gpt2_only) == res["in_step_source"].startswith("measured"), res["in_step_source"]
    back = Calibration.load(str(out))
    assert (res["in_step_hot"], res["in_step_byte_s"]) == (back.in_step_hot, back.in_step_byte_s)


def test_tune_ranks_and_executes_a_llama(loop_home):  # noqa: F811
    # head=1 would split llama-tiny's groups of 2 query heads: skipped with the reason, the others ranked
    tilings = [Tiling.parse(t) for t in ("8", "16,head=2", "head=1")]
    res = tune(load_model("llama-tiny"), 2, 16, scheds=("eager",), workers=[2], tilings=tilings, host=False,
               progress=False)
    assert len(res.ranking) == 2 and res.ranking[0].config.model.name == "llama-tiny"
    assert [s["tiling"] for s in res.skipped] == ["head=1"] and "splits the groups" in res.skipped[0]["reason"]
    if starpu_policies() is None:
        pytest.skip("StarPU is not available here: ranked by simulation only")
    ex = execute(res.ranking[:1], res.ranking, res.machine, res.calibration, res.host_costs, steps=1, warmup=1,
                 progress=False)
    (best,) = ex.checked
    assert best.measurement.median_s > 0 and best.prediction.step_s > 0


def test_no_candidate_tiling_says_why_in_one_line(capsys):
    assert main(["tune", "--model", "llama-tiny", "--machine", "h100-sxm5-80gb-8", "--tiles", "head=1;head=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no candidate tiling can be built" in err[0] and "splits the groups" in err[0]


def test_run_on_starpu_matches_the_reference(capsys):
    rc = main(["run", "--model", "llama-tiny", "--batch", "2", "--seq", "8", "--tile", "seq=4,embd=32,head=2",
               "--workers", "1", "--steps", "2", "--check", "--json"])
    out = capsys.readouterr().out
    if rc == 2 and "StarPU" in out + capsys.readouterr().err:
        pytest.skip("StarPU is not available here")
    res = json.loads(out)
    assert rc == 0 and res["check"]["ok"]
    assert res["losses"][0] == pytest.approx(np.log(256), abs=0.15)  # 16 tokens of a fresh model


@pytest.mark.parametrize("command", ["run", "train"])
def test_a_model_larger_than_memory_is_refused_with_what_it_needs(command, capsys):
    """llama3-405b's weights, gradients and moments (6.5 TB) fit no test machine: one line, before any graph."""
    assert main([command, "--model", "llama3-405b", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "llama3-405b needs at least 6.49 TB" in err[0] and "this machine has" in err[0]


@pytest.mark.parametrize("command", ["run", "train"])
def test_an_unapplied_rope_scaling_is_refused_by_the_commands_that_train(command, tmp_path, capsys):
    # YaRN rescales RoPE in a way the kernels do not apply: its shapes are modelled, its numbers would not be
    # transformers'
    spec = json.dumps({**load_model("llama-tiny").shape(), "rope_scaling": "yarn", "name": "yarn-tiny"})
    argv = [command, "--model", spec, "--batch", "1", "--seq", "8", "--tile", "64", "--steps", "1"]
    if command == "train":
        argv += ["--checkpoint", str(tmp_path / "ck")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "yarn-tiny" in err[0] and "rope_type 'yarn'" in err[0], err
    assert main(["graph", "--model", spec, "--batch", "1", "--seq", "8", "--tile", "512", "--json"]) == 0


def test_an_unapplied_rope_scaling_is_refused_by_the_library_too():
    from tilecast.reference.step import init_params
    from tilecast.graph.model_config import ModelConfigError

    cfg = load_model("llama-tiny")
    init_params(cfg)  # unscaled: fine
    init_params(dataclasses.replace(cfg, rope_scaling="linear", rope_factor=4.0))  # applied: fine
    with pytest.raises(ModelConfigError, match="rope_type 'yarn'"):
        init_params(dataclasses.replace(cfg, rope_scaling="yarn"))
    with pytest.raises(ModelConfigError, match="'llama3' RoPE scaling needs rope_low_freq_factor"):
        init_params(dataclasses.replace(cfg, rope_scaling="llama3", rope_factor=8.0))
