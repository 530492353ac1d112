"""The Python API (import tilecast as tc): every entry point gives the figures its command gives."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import tilecast as tc
from tilecast.cli import main

from loop_home import loop_home, loop_home_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(model="gpt2-tiny", batch=2, seq=32, tile="32")
TINY_ARGS = ["--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32"]


def cli_json(capsys, argv):
    capsys.readouterr()
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out)


def test_import_is_light_and_graph_is_both_package_and_entry_point():
    code = ("import sys, tilecast as tc; heavy = [m for m in ('pandas', 'numpy', 'tilecast.simulator', 'tilecast.api')"
            " if m in sys.modules]; print(heavy, sorted(set(tc.ENTRY_POINTS) - set(dir(tc))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.split() == ["[]", "[]"]
    from tilecast.graph import Tiling

    assert callable(tc.graph) and tc.graph.Tiling is Tiling
    with pytest.raises(AttributeError):
        tc.nothing_here  # noqa: B018


# entry points that hand back a plain object rather than a result: a figure, a DataFrame, a cluster description
NOT_RESULTS = {"gantt": "a matplotlib figure", "kernel_times": "a DataFrame", "load_cluster": "a Cluster"}


def test_every_entry_point_returns_a_typed_result():
    """Each tc.* call (but NOT_RESULTS) is annotated to return a dataclass result with its own to_frame() and
    the shared to_dict() and _repr_html_() (tilecast.api.base._Result); --ranks runs: or None on ranks other
    than 0 under the user's mpirun."""
    import dataclasses
    import typing

    from tilecast import api
    from tilecast.api.base import _Result

    wrong = []
    for name in set(tc.ENTRY_POINTS) - set(NOT_RESULTS):
        returned = typing.get_type_hints(getattr(api, name)).get("return")
        kinds = [t for t in typing.get_args(returned) if t is not type(None)] or [returned]
        cls = kinds[0] if len(kinds) == 1 else None
        if not (isinstance(cls, type) and issubclass(cls, _Result) and dataclasses.is_dataclass(cls)
                and cls.to_frame is not _Result.to_frame and dataclasses.fields(cls)):
            wrong.append(f"{name} -> {returned}")
    assert not wrong, f"entry points without a typed result: {wrong}"


def test_model():
    m = tc.model("gpt2-tiny")
    assert (m.n_layer, m.n_embd, m.n_head) == (2, 64, 4) and m.params == m.config.n_params()
    assert m.to_frame().loc[0, "params"] == m.params and "gpt2-tiny" in m._repr_html_()
    custom = tc.model({"n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 11, "n_positions": 16})
    assert custom.n_embd == 8
    with pytest.raises(ValueError, match="^model: 'gpt9'"):
        tc.model("gpt9")


def test_graph_equals_the_graph_command(capsys):
    g = tc.graph(**TINY)
    rc, doc = cli_json(capsys, ["graph", *TINY_ARGS, "--json"])
    assert rc == 0
    assert (g.tasks, g.tiles, g.flops, g.bytes, g.live_bytes, g.critical_path_flops) == (
        doc["tasks"], doc["tiles"], doc["flops"], doc["bytes"], doc["live_bytes"], doc["critical_path_flops"])
    frame = g.to_frame()
    assert frame["tasks"].sum() == g.tasks == g.graph.n_tasks and set(frame["kernel"]) == set(doc["kernels"])
    assert f"{g.tasks} tasks" in g._repr_html_()


@pytest.mark.parametrize("kw, field", [(dict(batch=0), "^batch must"), (dict(seq=999), "^seq 999 exceeds"),
                                       (dict(tile="foo=2"), "^tile: unknown dimension"),
                                       (dict(model="nope"), "^model: ")])
def test_bad_arguments_name_the_argument_not_a_flag(kw, field):
    with pytest.raises(ValueError, match=field):
        tc.graph(**{**TINY, **kw})


def test_simulate_equals_the_simulate_command(capsys):
    s = tc.simulate(**TINY, machine="h100-sxm5-80gb-8", sched="dmda", workers=2)
    rc, doc = cli_json(capsys, ["simulate", *TINY_ARGS, "--machine", "h100-sxm5-80gb-8", "--workers", "2",
                                "--no-trace", "--json"])
    assert rc == 0
    frame = s.to_frame()
    assert len(frame) == 1 and frame.loc[0, "step_s"] == doc["step_s"] == s.step_s
    for k in ("makespan_s", "host_s", "host_known", "tasks", "tiles", "utilization", "critical_path_s", "workers"):
        assert getattr(s, k) == doc[k], k
    trace = s.trace()
    assert trace["end_s"].max() == pytest.approx(s.makespan_s) and trace.attrs["step_s"] == s.step_s
    assert "predicted step" in s._repr_html_()
    with pytest.raises(ValueError, match="^sched must be one of"):
        tc.simulate(**TINY, machine="h100-sxm5-80gb-8", sched="fastest")
    with pytest.raises(ValueError, match="workers must be between 1 and 8, got 9"):
        tc.simulate(**TINY, machine="h100-sxm5-80gb-8", workers=9)


def test_run_then_compare_equal_the_commands(tmp_path, capsys):
    r = tc.run(**TINY, sched="eager", workers=1, steps=2, check=True)
    assert r.check["ok"] and r.tasks == tc.graph(**TINY).tasks and r.workers == 1
    frame = r.to_frame()
    assert list(frame["step"]) == [1, 2] and list(frame["loss"]) == r.losses
    assert r.step_s == r.step_times_s[1] and isinstance(r.trace, pd.DataFrame)
    s = tc.simulate(**TINY, machine="h100-sxm5-80gb-8", sched="eager", workers=1)
    c = tc.compare(s, r)
    assert c.tasks_matched == r.tasks and c.pred_step_s == s.step_s and c.real_step_s == r.step_times_s[-1]
    assert set(c.to_frame()["kernel"]) == set(tc.graph(**TINY).kernels)
    s.trace().to_parquet(tmp_path / "pred.parquet")
    r.trace.to_parquet(tmp_path / "real.parquet")
    rc, doc = cli_json(capsys, ["compare", str(tmp_path / "pred.parquet"), str(tmp_path / "real.parquet"),
                                "--out", str(tmp_path / "report"), "--no-chrome", "--json"])
    assert rc == 0 and doc["makespan"]["error"] == pytest.approx(c.makespan_error)
    assert doc["step"]["error"] == pytest.approx(c.step_error)
    with pytest.raises(ValueError, match="^steps must be"):
        tc.run(**TINY, steps=0)


def test_tune_ranks_as_the_tune_command_and_simulate_agrees(loop_home, capsys):  # noqa: F811
    t = tc.tune("gpt2-tiny", batch=2, seq=32, workers=[1], scheds=["eager"], tiles=["32", "64"])
    frame = t.to_frame()
    assert len(frame) == t.configurations == 2 and list(frame["pred_step_s"]) == sorted(frame["pred_step_s"])
    assert t.best == t.ranking[0].row()
    rc, doc = cli_json(capsys, ["tune", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--workers", "1",
                                "--scheds", "eager", "--tiles", "32;64", "--json"])
    assert rc == 0 and [r["pred_step_s"] for r in doc["ranking"]] == list(frame["pred_step_s"])
    best = t.ranking[0].config
    s = tc.simulate("gpt2-tiny", batch=2, seq=32, tile=best.tiling, sched="eager", workers=1)
    assert s.step_s == pytest.approx(t.ranking[0].step_s, rel=1e-12) and s.host_known == t.host_cost


def test_whatif_equals_the_whatif_command(capsys):
    w = tc.whatif(gpus=64, tp=8, pp=8, schedule="1f1b", zero=1)
    rc, doc = cli_json(capsys, ["whatif", "--gpus", "64", "--tp", "8", "--pp", "8", "--zero", "1", "--json"])
    assert rc == 0 and w.step_s == doc["step_s"] and w.mfu == doc["mfu"] and w.strategy == doc["strategy"]
    assert w.hfu == doc["hfu"] and w.to_frame().loc[0, "hfu"] == doc["hfu"]
    assert w.to_frame().loc[0, "tokens_per_s"] == doc["tokens_per_s"]
    found = tc.whatif(model="gpt2", cluster="dgx-h100", gpus=8, seq=1024, search=True, top=3)
    rc, doc = cli_json(capsys, ["whatif", "--model", "gpt2", "--cluster", "dgx-h100", "--gpus", "8", "--seq", "1024",
                                "--search", "--top", "3", "--json"])
    assert [r["step_s"] for r in doc["top"]] == list(found.to_frame()["step_s"]) and found.searched["evaluated"] > 3
    with pytest.raises(ValueError, match="^gpus: 10 is not a multiple of tp x pp = 4"):
        tc.whatif(gpus=10, tp=4)
    with pytest.raises(ValueError, match="^tp: 3 does not divide"):
        tc.whatif(tp=3)


def test_validate_equals_the_validate_command(capsys):
    v = tc.validate()
    rc, doc = cli_json(capsys, ["validate", "--json"])
    assert (rc == 0) == v.ok and v.median_abs_error_heldout == doc["median_abs_error_heldout"]
    assert v.median_abs_error_lopo == doc["median_abs_error_lopo"] and v.sources == doc["sources"]
    assert len(v.to_frame()) == len(doc["runs"]) and "median |error|" in v._repr_html_()
