"""One model description for every command: a Llama's config.json, as transformers writes it, given to graph,
simulate, tune, verify, run, train (and resume) and whatif as --model (its folder), each answering for that model."""

import json

import pytest

from tilecast.cli import main
from tilecast.graph.model_config import load_model

transformers = pytest.importorskip("transformers", reason="transformers writes the config.json; install tilecast[test]")

# 2 layers, 32 wide, 4 query heads on 2 key/value heads, MLP 48, byte vocabulary (train reads bytes), untied
SHAPE = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, vocab_size=256, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
             tie_word_embeddings=False)
NAME = "tiny-llama-cfg"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / NAME
    transformers.LlamaConfig(**SHAPE).save_pretrained(out)  # config.json, every field transformers writes
    return out


def _json(capsys, argv):
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_the_description_read_from_transformers_config(folder):
    cfg = load_model(str(folder))
    assert cfg.name == NAME and cfg.family == "llama"
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_kv_head, cfg.intermediate_size, cfg.vocab_size,
            cfg.n_positions) == (2, 32, 4, 2, 48, 256, 64)
    assert (cfg.norm, cfg.activation, cfg.position_embedding, cfg.tie_word_embeddings, cfg.bias) == (
        "rmsnorm", "swiglu", "rope", False, False)


def test_graph_simulate_tune_and_whatif_model_it(folder, capsys):
    m = ["--model", str(folder)]
    rc, out, err = _json(capsys, ["graph", *m, "--batch", "2", "--seq", "8", "--tile", "8", "--json"])
    assert rc == 0, err
    graph = json.loads(out)
    # the same step as the description written field by field
    same = json.dumps(dict(family="llama", n_layer=2, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48,
                           vocab_size=256, n_positions=64, tie_word_embeddings=False))
    rc, out, err = _json(capsys, ["graph", "--model", same, "--batch", "2", "--seq", "8", "--tile", "8", "--json"])
    assert rc == 0 and graph["tasks"] > 0
    assert {k: graph[k] for k in ("tasks", "tiles", "flops", "kernels")} == {k: json.loads(out)[k] for k in (
        "tasks", "tiles", "flops", "kernels")}
    rc, out, err = _json(capsys, ["simulate", *m, "--batch", "2", "--seq", "8", "--tile", "8",
                                  "--machine", "h100-sxm5-80gb-8", "--no-trace", "--json"])
    assert rc == 0, err
    assert json.loads(out)["model"] == NAME
    rc, out, err = _json(capsys, ["tune", *m, "--batch", "2", "--seq", "8", "--machine", "h100-sxm5-80gb-8",
                                  "--tiles", "8;16,head=2", "--scheds", "eager", "--json"])
    assert rc == 0, err
    assert json.loads(out)["model"] == NAME
    rc, out, err = _json(capsys, ["whatif", *m, "--cluster", "dgx-h100", "--gpus", "1", "--seq", "64", "--json"])
    assert rc == 0, err
    assert json.loads(out)["model"] == NAME


def test_verify_run_and_train_compute_it(folder, tmp_path, capsys):
    m = ["--model", str(folder)]
    rc, out, err = _json(capsys, ["verify", *m, "--batch", "2", "--seq", "7", "--tile", "seq=3,embd=12,head=2,inner=20",
                                  "--json"])
    assert rc == 0 and json.loads(out)["ok"], err
    rc, out, err = _json(capsys, ["run", *m, "--batch", "2", "--seq", "8", "--tile", "seq=4,head=2", "--workers", "1",
                                  "--steps", "1", "--check", "--json"])
    if rc == 2 and "StarPU" in err:
        pytest.skip("StarPU is not available here: " + err.strip())
    res = json.loads(out)
    assert rc == 0 and res["model"] == NAME and res["check"]["ok"]
    rc, out, err = _json(capsys, ["train", *m, "--batch", "2", "--seq", "16", "--tile", "batch=1", "--workers", "1",
                                  "--steps", "2", "--eval-every", "0", "--checkpoint", str(tmp_path / "ck"), "--json"])
    assert rc == 0, err
    res = json.loads(out)
    assert res["model"] == NAME and (tmp_path / "ck").exists()
    rc, out, err = _json(capsys, ["train", *m, "--batch", "2", "--seq", "16", "--tile", "batch=1", "--workers", "1",
                                  "--steps", "3", "--eval-every", "0", "--checkpoint", str(tmp_path / "ck"), "--resume",
                                  "--json"])
    assert rc == 0, err  # the checkpoint's model is the config.json's
