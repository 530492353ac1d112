import json
import subprocess
import sys

from tilecast.cli import main


def test_graph_json_keys(capsys):
    assert main(["graph", "--model", "gpt2-tiny", "--batch", "2", "--seq", "16", "--tile", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"tasks", "tiles", "flops", "bytes", "live_bytes", "live_persistent_bytes",
                        "live_activation_bytes", "live_peak_tag", "critical_path_flops", "kernels", "recompute",
                        "recompute_settings"}
    assert out["tasks"] == sum(k["tasks"] for k in out["kernels"].values())
    assert 0 < out["critical_path_flops"] < out["flops"]


def test_graph_table_and_dot(tmp_path, capsys):
    dot = tmp_path / "g.dot"
    assert main(["graph", "--model", "gpt2-tiny", "--batch", "1", "--seq", "4", "--tile", "64",
                 "--dot", str(dot)]) == 0
    text = capsys.readouterr().out
    assert "gemm" in text and "critical path" in text
    assert dot.read_text().startswith("digraph") and "->" in dot.read_text()


def test_dot_refused_for_large_graphs(capsys):
    assert main(["graph", "--model", "gpt2", "--dot", "-"]) == 2
    assert "at most" in capsys.readouterr().err


def test_bad_input_is_one_line_and_exit_2():
    for args in (["--tile", "embd=0"], ["--model", "nope"], ["--batch", "0"], ["--seq", "5000"],
                 ["--model", '{"n_layer":1,"n_embd":10,"n_head":3,"vocab_size":5,"n_positions":8}']):
        p = subprocess.run([sys.executable, "-m", "tilecast", "graph", *args], capture_output=True, text=True)
        assert p.returncode == 2, args
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "Traceback" not in p.stderr
