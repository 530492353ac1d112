import json

import pytest

from tilecast.graph.model_config import PRESETS, ModelConfigError, load_model


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_load(name):
    cfg = load_model(name)
    assert cfg.n_embd % cfg.n_head == 0


def test_gpt2_parameter_count_matches_published_124m():
    # 124,439,808 parameters (tied LM head): the figure transformers reports for "gpt2".
    assert load_model("gpt2").n_params() == 124_439_808


def test_inline_json_and_file(tmp_path):
    shape = {"n_layer": 1, "n_embd": 6, "n_head": 3, "vocab_size": 7, "n_positions": 5}
    assert load_model(json.dumps(shape)).n_embd == 6
    f = tmp_path / "m.json"
    f.write_text(json.dumps(shape))
    assert load_model(str(f)).name == "m"


@pytest.mark.parametrize("shape, field", [
    ({"n_layer": 1, "n_embd": 10, "n_head": 3, "vocab_size": 7, "n_positions": 5}, "n_head"),
    ({"n_layer": 0, "n_embd": 6, "n_head": 3, "vocab_size": 7, "n_positions": 5}, "n_layer"),
    ({"n_layer": 1, "n_embd": 6, "n_head": 3, "vocab_size": -7, "n_positions": 5}, "vocab_size"),
    ({"n_layer": 1, "n_embd": 6, "n_head": 3, "vocab_size": 7}, "n_positions"),
])
def test_bad_shapes_name_the_field(shape, field):
    with pytest.raises(ModelConfigError, match=field):
        load_model(json.dumps(shape))
