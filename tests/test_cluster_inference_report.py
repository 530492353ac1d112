"""The generated inference tables of tilecast/cluster/validation/README.md are what the model gives now."""

import re

import pytest

from tilecast.cluster import inference_report


def test_readme_blocks_are_what_the_model_gives():
    with open(inference_report.README) as f:
        text = f.read()
    generated = inference_report.blocks()
    assert set(generated) == {"rows", "summary", "transfer"}
    assert generated["summary"].count("\n") >= 10 and "| trt09-h200-mistral7b-120-128-2048 |" in generated["rows"]
    for name, body in generated.items():
        m = re.search(rf"<!-- inference_report {name} -->\n(.*?)\n<!-- /inference_report -->", text, re.S)
        assert m, f"README lacks the block {name}"
        assert m.group(1) == body, (f"block {name} of {inference_report.README} is stale: "
                                    "python3 -m tilecast.cluster.inference_report --write")


def test_write_replaces_marked_blocks_only_and_names_a_missing_one():
    text = "a\n<!-- inference_report rows -->\nold\n<!-- /inference_report -->\nb\n"
    assert inference_report.write(text, {"rows": "new"}) == \
        "a\n<!-- inference_report rows -->\nnew\n<!-- /inference_report -->\nb\n"
    with pytest.raises(ValueError, match="inference_report summary"):
        inference_report.write(text, {"summary": "x"})
