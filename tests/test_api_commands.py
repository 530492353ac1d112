"""Every command is a thin shell over a tc.* call: the call returns frames with the command's figures, and a bad
argument is one message, worded by field in the library and by flag on the command line."""

import json

import pandas as pd
import pytest

import tilecast as tc
from tilecast.cli import main

TINY = dict(model="gpt2-tiny", batch=2, seq=32, tile="32")
TINY_ARGS = ["--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32"]
GPU = "h100-sxm5-80gb-8"  # a shipped machine: no calibration needed, so these stay fast


def cli_json(capsys, argv):
    capsys.readouterr()
    rc = main(argv)
    return rc, json.loads(capsys.readouterr().out)


def test_graph_compares_recompute_settings_and_ranks_as_the_command(capsys):
    tiny = {**TINY, "tile": "32,batch=1"}  # a batch tile per rank
    g = tc.graph(**tiny, compare_recompute=True, ranks=2, distribution="data")
    rc, doc = cli_json(capsys, ["graph", *TINY_ARGS[:-1], "32,batch=1", "--ranks", "2", "--json"])
    assert rc == 0 and g.summary == doc
    frame = g.recompute_frame()
    assert list(frame["recompute"]) == ["none", "selective", "full"]
    assert frame.set_index("recompute").loc["full", "tasks"] > g.tasks  # full replays each layer's forward
    assert [r["rank"] for r in g.ranks["per_rank"]] == [0, 1]
    assert tc.graph(**TINY).recompute_settings.keys() == {"none"}  # compared only when asked


def test_simulate_policies_equals_compare_policies(capsys):
    p = tc.simulate_policies(**TINY, machine=GPU)
    rc, doc = cli_json(capsys, ["simulate", *TINY_ARGS, "--machine", GPU, "--compare-policies", "--json"])
    frame = p.to_frame()
    assert rc == 0 and list(frame["sched"]) == [r["sched"] for r in doc["policies"]]
    assert list(frame["step_s"]) == [r["step_s"] for r in doc["policies"]]
    one = tc.simulate(**TINY, machine=GPU, sched="dmda")  # the same prediction as the single-policy call
    assert frame.set_index("sched").loc["dmda", "step_s"] == one.step_s
    assert p.duration_sources == doc["duration_sources"]


def test_tune_ranking_and_summary_equal_the_command(capsys):
    t = tc.tune("gpt2-tiny", batch=2, seq=32, machine=GPU, scheds=["eager", "dmda"], workers=[1, 8], tiles=["32"])
    rc, doc = cli_json(capsys, ["tune", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--machine", GPU,
                                "--scheds", "eager,dmda", "--worker-counts", "1,8", "--tiles", "32", "--json"])
    frame = t.to_frame()
    assert rc == 0 and len(frame) == 4 == doc["configurations"]
    assert json.loads(json.dumps(t.summary, default=float)) == doc
    assert list(frame["pred_step_s"]) == [r["pred_step_s"] for r in doc["ranking"]] == sorted(frame["pred_step_s"])


def test_whatif_search_and_inference_equal_the_command(capsys):
    from tilecast.cluster.strategy import Strategy

    base = Strategy(tp=4, pp=1, dp=2, seq=1024, global_batch=8)
    s = tc.whatif_search("gpt2", "dgx-h100", gpus=8, seq=1024, top=3, baseline=base)
    rc, doc = cli_json(capsys, ["whatif", "--model", "gpt2", "--cluster", "dgx-h100", "--gpus", "8", "--seq", "1024",
                                "--search", "--top", "3", "--baseline", "tp=4", "--json"])
    assert rc == 0 and list(s.to_frame()["step_s"]) == [r["step_s"] for r in doc["top"]]
    assert s.gain == doc["gain"] and s.evaluated == doc["evaluated"] > 3
    i = tc.whatif_inference("llama3-70b", "dgx-h100", tp=8, gpus=16, batch=8)
    rc, doc = cli_json(capsys, ["whatif", "--inference", "--model", "llama3-70b", "--cluster", "dgx-h100", "--tp", "8",
                                "--gpus", "16", "--batch", "8", "--json"])
    assert rc == 0 and i.config.dp == 2 == doc["config"]["dp"] and i.tokens_per_s == doc["tokens_per_s"]
    assert i.to_frame().loc[0, "tokens_per_s"] == doc["tokens_per_s"]


def test_validate_inference_equals_the_command(capsys):
    v = tc.validate_inference(role="validation")
    rc, doc = cli_json(capsys, ["validate", "--role", "validation", "--json"])
    frame = v.to_frame()
    assert set(frame["role"]) == {"validation"} and len(frame) == len(doc["inference"]["runs"])
    assert v.summary == doc["inference"] and v.ok == doc["inference"]["ok"]


def test_run_forecast_under_a_memory_limit_equals_the_command(capsys, tmp_path, monkeypatch):
    from tilecast.kernels.native_build import NativeUnavailable

    # the page cache a forecast gives the disk node is what MemAvailable leaves now, which moves between the calls
    monkeypatch.setattr("tilecast.perfmodel.page_cache.mem_available_bytes", lambda *a, **k: 16 << 30)
    step = dict(model="gpt2-tiny", batch=1, seq=16, tile="16", sched="eager", workers=1, steps=1)
    try:
        r = tc.run(**step, memory_limit="4MiB", offload_dir=str(tmp_path), forecast=True)
    except NativeUnavailable as e:
        pytest.skip(f"StarPU or the C kernels are not available: {e}")
    rc, doc = cli_json(capsys, ["run", "--model", "gpt2-tiny", "--batch", "1", "--seq", "16", "--tile", "16", "--sched",
                                "eager", "--workers", "1", "--steps", "1", "--memory-limit", "4MiB", "--offload-dir",
                                str(tmp_path), "--json"])
    assert rc == 0 and r.predicted == doc["predicted"] and r.predicted["step_s"] > 0  # one forecast, simulated
    assert tc.run(**step).predicted is None  # no limit, nothing forecast


def test_verify_frame_has_a_row_per_tensor():
    pytest.importorskip("torch", reason="torch is the numeric reference; install tilecast[test]")
    pytest.importorskip("transformers", reason="transformers is the numeric reference; install tilecast[test]")
    v = tc.verify("gpt2-tiny", batch=1, seq=8, tile="8")
    frame = v.to_frame()
    assert v.ok and len(frame) == len(v.result.grads) and (frame["gradient_error"] <= 1e-4).all()


def test_train_frame_has_a_row_per_step(tmp_path):
    from tilecast.kernels.native_build import NativeUnavailable

    try:
        t = tc.train("gpt2-tiny", batch=2, seq=16, tile="batch=1", steps=2, eval_every=0, workers=1,
                     log=lambda line: None)
    except NativeUnavailable as e:
        pytest.skip(f"StarPU or the C kernels are not available: {e}")
    frame = t.to_frame()
    assert list(frame["step"]) == [1, 2] and frame["loss"].notna().all() and t.steps == 2
    assert isinstance(frame, pd.DataFrame) and t.workers == 1


RANK_STEP = dict(model="gpt2-tiny", batch=4, seq=16, tile="16,batch=1")
RANK_ARGS = ["--model", "gpt2-tiny", "--batch", "4", "--seq", "16", "--tile", "16,batch=1"]
NETWORK = (20, 30, 1)  # latency us, cost per message us, GB/s: no stored network needed


def test_simulate_ranks_equals_the_command(capsys):
    s = tc.simulate_ranks(**RANK_STEP, ranks=2, distribution="layer", network=NETWORK)
    rc, doc = cli_json(capsys, ["simulate", *RANK_ARGS, "--ranks", "2", "--distribution", "layer", "--network",
                                "20,30,1", "--json"])
    assert rc == 0 and s.to_frame().equals(pd.DataFrame(doc["per_rank"]))
    assert {k: v for k, v in s.summary.items() if k != "simulation_s"} == \
        {k: v for k, v in doc.items() if k != "simulation_s"}
    assert s.step_s == doc["pred_step_s"] and s.messages == doc["messages"] > 0


def test_tune_ranks_equals_the_command(capsys):
    t = tc.tune_ranks("gpt2-tiny", 4, 16, ranks=2, tiles=["16,batch=1", "32,batch=1"], scheds=["lws"],
                      network=NETWORK)
    rc, doc = cli_json(capsys, ["tune", "--model", "gpt2-tiny", "--batch", "4", "--seq", "16", "--tiles",
                                "16,batch=1;32,batch=1", "--ranks", "2", "--scheds", "lws", "--network", "20,30,1",
                                "--json"])
    frame = t.to_frame()
    assert rc == 0 and json.loads(json.dumps(t.summary, default=float)) == doc
    assert list(frame["pred_step_s"]) == [r["pred_step_s"] for r in doc["ranking"]] == sorted(frame["pred_step_s"])
    assert set(frame["distribution"]) == {"data", "layer", "cyclic"} and len(frame) == 6


def test_whatif_sweep_equals_the_command(capsys):
    w = tc.whatif_sweep("gpt2", "dgx-h100", {"network_bw": "x0.5..x2", "tp": [1, 2, 4]}, gpus=8, seq=1024, tp=2)
    rc, doc = cli_json(capsys, ["whatif", "--model", "gpt2", "--cluster", "dgx-h100", "--gpus", "8", "--seq", "1024",
                                "--tp", "2", "--sweep", "network_bw=x0.5..x2", "--sweep", "tp=1,2,4", "--json"])
    frame = w.to_frame()
    assert rc == 0 and w.summary["sweeps"] == doc["sweeps"] and w.base.step_s == doc["step_s"]
    assert list(frame["param"]) == ["network_bw"] * 3 + ["tp"] * 3
    assert list(frame["tokens_per_s"]) == [r["tokens_per_s"] for p in ("network_bw", "tp") for r in doc["sweeps"][p]]


def test_whatif_search_and_inference_sweeps_equal_the_command(capsys):
    s = tc.whatif_search("gpt2", "dgx-h100", gpus=8, seq=1024, top=3, sweeps={"network_bw": "1,2"})
    rc, doc = cli_json(capsys, ["whatif", "--model", "gpt2", "--cluster", "dgx-h100", "--gpus", "8", "--seq", "1024",
                                "--search", "--top", "3", "--sweep", "network_bw=1,2", "--json"])
    rows = json.loads(s.sweeps["network_bw"].to_json(orient="records"))
    assert rc == 0 and rows == doc["search_sweeps"]["network_bw"] and len(rows) == 2
    i = tc.whatif_inference("llama3-70b", "dgx-h100", tp=8, gpus=16, batch=8, sweeps={"batch": [1, 8]})
    rc, doc = cli_json(capsys, ["whatif", "--inference", "--model", "llama3-70b", "--cluster", "dgx-h100", "--tp", "8",
                                "--gpus", "16", "--batch", "8", "--sweep", "batch=1,8", "--json"])
    assert rc == 0 and json.loads(i.sweeps["batch"].to_json(orient="records")) == doc["sweeps"]["batch"]


def test_whatif_inference_search_equals_the_command(capsys):
    f = tc.whatif_inference_search("llama3-70b", "dgx-h100", gpus=16, top=3, baseline={"tp": 8}, batch=8)
    rc, doc = cli_json(capsys, ["whatif", "--inference", "--search", "--model", "llama3-70b", "--cluster", "dgx-h100",
                                "--gpus", "16", "--batch", "8", "--top", "3", "--baseline", "tp=8", "--json"])
    frame = f.to_frame()
    assert rc == 0 and list(frame["tokens_per_s"]) == [r["tokens_per_s"] for r in doc["top"]]
    assert f.gain == doc["gain"] and f.candidates == doc["candidates"] and len(frame) == 3
    assert f.baseline.to_dict() == doc["baseline"] and doc["baseline"]["config"]["dp"] == 2


def test_calibrate_equals_the_command(capsys, tmp_path):
    settings = dict(model="gpt2-tiny", batch=1, seq=16, tile="16", tiles=["8"], repeats=1, timer="c",
                    probe=False, offload_dir=str(tmp_path))
    try:
        c = tc.calibrate(**settings, output=str(tmp_path / "a.json"))
    except RuntimeError as e:  # NativeUnavailable: no C compiler or BLAS here
        pytest.skip(f"the C kernels are not available: {e}")
    rc, doc = cli_json(capsys, ["calibrate", "--model", "gpt2-tiny", "--batch", "1", "--seq", "16", "--tile", "16",
                                "--tiles", "8", "--repeats", "1", "--timer", "c", "--no-probe", "--offload-dir",
                                str(tmp_path), "--output", str(tmp_path / "b.json"), "--json"])
    assert rc == 0 and c.summary.keys() == doc.keys()
    same = ("machine", "fingerprint", "timer", "shapes", "shapes_seen", "shapes_predicted", "kernels", "cache_bytes",
            "blas")  # the rest are timings, measured twice
    assert {k: c.summary[k] for k in same} == {k: doc[k] for k in same}
    frame = c.to_frame()
    assert len(frame) == len(doc["heldout"]) + len(doc["heldout_hot"]) and c.timer == "c-kernels"
    assert set(frame.loc[frame["lane"] == "cold", "kernel"]) == set(doc["heldout"])
    assert c.shapes > 0 and c._repr_html_().startswith("<p><b>")


# (library call, its message's start, command line, the command's message's start)
BAD = [
    (lambda: tc.graph("gpt2-tiny", 1, 16, 16, ranks=2, distribution="nope"), "distribution: unknown",
     ["graph", "--model", "gpt2-tiny", "--batch", "1", "--seq", "16", "--tile", "16", "--ranks", "2",
      "--distribution", "nope"], "--distribution: unknown"),
    (lambda: tc.simulate_policies(**TINY, machine=GPU, memory_limit="1KiB"), "memory_limit: 1.00 KiB is below",
     ["simulate", *TINY_ARGS, "--machine", GPU, "--compare-policies", "--memory-limit", "1KiB"],
     "--memory-limit: 1.00 KiB is below"),
    (lambda: tc.simulate(**TINY, machine=GPU, memory_limit="64MiB"), "memory_limit: applies to a machine of one",
     ["simulate", *TINY_ARGS, "--machine", GPU, "--memory-limit", "64MiB"], "--memory-limit: applies to a machine"),
    (lambda: tc.tune("gpt2-tiny", machine=GPU, memory_limit="4MiB"), "memory_limit: applies to a machine of one",
     ["tune", "--machine", GPU, "--memory-limit", "4MiB"], "--memory-limit: applies to a machine"),
    (lambda: tc.simulate(**TINY, machine=GPU, offload_dir="/tmp"), "offload_dir needs memory_limit",
     ["simulate", *TINY_ARGS, "--machine", GPU, "--offload-dir", "/tmp"], "--offload-dir needs --memory-limit"),
    (lambda: tc.tune("gpt2-tiny", machine=GPU, execute=1), "execute: only the local machine",
     ["tune", "--machine", GPU, "--execute", "1"], "--execute: only the local machine"),
    (lambda: tc.tune("gpt2-tiny", memory_limit="1GiB", execute=1, recalibrate=True),
     "recalibrate/memory_limit: not available together",
     ["tune", "--memory-limit", "1GiB", "--execute", "1", "--recalibrate"],
     "--recalibrate/--memory-limit: not available together"),
    (lambda: tc.whatif(gpus=10, tp=4), "gpus: 10 is not a multiple", ["whatif", "--gpus", "10", "--tp", "4"],
     "--gpus: 10 is not a multiple"),
    (lambda: tc.whatif_search("gpt2", "dgx-h100", 8, attention="nope"), "attention: must be flash",
     ["whatif", "--model", "gpt2", "--cluster", "dgx-h100", "--gpus", "8", "--search", "--attention", "nope"],
     "--attention: must be flash"),
    (lambda: tc.whatif_inference(engine="nope"), "engine: unknown serving engine",
     ["whatif", "--inference", "--model", "llama3-70b", "--cluster", "dgx-h100", "--engine", "nope"],
     "--engine: unknown serving engine"),
    (lambda: tc.whatif(cluster="/"), "cluster: cannot read /", ["whatif", "--cluster", "/"],
     "--cluster: cannot read /"),
    (lambda: tc.validate(table="/nonexistent.yaml"), "table: no such file",
     ["validate", "--table", "/nonexistent.yaml"], "--table: no such file"),
    (lambda: tc.validate(target=0), "target: must be positive", ["validate", "--target", "0"],
     "--target: must be positive"),
    (lambda: tc.validate_inference(table="/nonexistent.yaml"), "table: no such file",
     ["validate", "--inference-table", "/nonexistent.yaml"], "--inference-table: no such file"),
    (lambda: tc.verify("gpt2-xl", 1, 8, 8), "model: gpt2-xl is too large",
     ["verify", "--model", "gpt2-xl", "--batch", "1", "--seq", "8", "--tile", "8"], "--model: gpt2-xl is too large"),
    (lambda: tc.accuracy(max_wait_s=-1), "max_wait must be between", ["accuracy", "--max-wait", "-1"],
     "--max-wait must be between"),
    (lambda: tc.accuracy(suite="quick", workers=[99]), "workers must be at most",
     ["accuracy", "--suite", "quick", "--worker-counts", "99"], "--worker-counts must be at most"),
    (lambda: tc.demo(execute=0), "execute must be at least 1", ["demo", "--execute", "0"],
     "--execute must be at least 1"),
    (lambda: tc.train(lr=-1.0, steps=1), "lr must be a positive number", ["train", "--lr", "-1", "--steps", "1"],
     "--lr must be a positive number"),
    (lambda: tc.run("gpt2-tiny", offload_dir="/tmp"), "offload_dir needs memory_limit",
     ["run", "--offload-dir", "/tmp"], "--offload-dir needs --memory-limit"),
    (lambda: tc.run("gpt2-tiny", memory_limit="1GiB", offload_io="direct"), "offload_io needs offload_dir",
     ["run", "--memory-limit", "1GiB", "--offload-io", "direct"], "--offload-io needs --offload-dir"),
    (lambda: tc.run_ranks("gpt2-tiny", 2, 16, "16,batch=1", timeout_s=0), "timeout_s must be positive",
     ["run", "--model", "gpt2-tiny", "--batch", "2", "--seq", "16", "--tile", "16,batch=1", "--ranks", "2",
      "--timeout", "0"], "--timeout must be positive"),
    (lambda: tc.train_ranks(steps=2, resume=True), "resume needs a checkpoint path",
     ["train", "--ranks", "2", "--steps", "2", "--resume"], "--resume needs a checkpoint path"),
    (lambda: tc.simulate_ranks(**RANK_STEP, network=NETWORK, background_threads=-1), "background_threads: expected",
     ["simulate", *RANK_ARGS, "--ranks", "2", "--network", "20,30,1", "--background-threads", "-1"],
     "--background-threads: expected"),
    (lambda: tc.tune_ranks("gpt2-tiny", 4, 16, distributions=["nope"]), "distributions: unknown distribution",
     ["tune", "--model", "gpt2-tiny", "--batch", "4", "--seq", "16", "--ranks", "2", "--distributions", "nope"],
     "--distributions: unknown distribution"),
    (lambda: tc.calibrate(offload_io="direct"), "offload_io needs offload_dir", ["calibrate", "--offload-io", "direct"],
     "--offload-io needs --offload-dir"),
    (lambda: tc.calibrate(repeats=0), "repeats must be at least 1", ["calibrate", "--repeats", "0"],
     "--repeats must be at least 1"),
    (lambda: tc.calibrate_network(sizes=[8]), "sizes: at least two distinct", ["calibrate", "--ranks", "2", "--sizes",
     "8"], "--sizes: at least two distinct"),
    (lambda: tc.whatif_search("gpt2", "dgx-h100", 8, sweeps={"tp": [1]}), "sweep: unknown parameter 'tp' with search",
     ["whatif", "--model", "gpt2", "--cluster", "dgx-h100", "--gpus", "8", "--search", "--sweep", "tp=1"],
     "--sweep: unknown parameter 'tp' with search"),
    (lambda: tc.whatif_inference_search(gpus=16, request_rate=1.0), "request_rate: the search compares fixed",
     ["whatif", "--inference", "--search", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "16",
      "--request-rate", "1"], "--request-rate: the search compares fixed"),
    (lambda: tc.whatif_sweep(sweeps={"nope": [1]}), "sweep: unknown parameter 'nope'", ["whatif", "--sweep", "nope=1"],
     "--sweep: unknown parameter 'nope'"),
]


@pytest.mark.parametrize("call, library, argv, command", BAD, ids=[f"{b[2][0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_in_library_and_command_wording(call, library, argv, command, capsys):
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value).startswith(library) and "--" not in str(e.value), str(e.value)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()  # (progress lines before it, for a step being built)
    assert err[-1].startswith(f"tilecast {argv[0]}: {command}") and "Traceback" not in "\n".join(err), err
