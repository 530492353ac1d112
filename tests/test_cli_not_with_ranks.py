"""Flags a step on several ranks does not take yet are refused in one line, not ignored."""

import pytest

from tilecast.cli import main
from tilecast.cli.ranks_table import NOT_WITH_RANKS

TINY = ["--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--ranks", "2"]
VALUE = {"--memory-limit": "1GiB", "--offload-dir": "/tmp", "--eval-every": "5", "--eval-batches": "2"}
TAKES = {"run": ("--memory-limit", "--offload-dir"), "simulate": ("--memory-limit", "--offload-dir"),
         "tune": ("--memory-limit", "--offload-dir"), "train": tuple(VALUE)}


@pytest.mark.parametrize("command,flag", [(c, f) for c, flags in TAKES.items() for f in flags])
def test_refused_with_ranks_in_one_line(command, flag, capsys, monkeypatch):
    import tilecast

    def must_not_run(*a, **k):
        raise AssertionError("ran despite a flag it ignores")

    for name in ("run_ranks", "train_ranks", "simulate_ranks", "tune_ranks"):
        monkeypatch.setattr(tilecast, name, must_not_run)
    rc = main([command, *TINY, flag, VALUE[flag]])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"tilecast {command}: {flag}: not with --ranks"), lines[0]


def test_every_refused_flag_is_one_of_the_commands():
    assert {f for _, f, _ in NOT_WITH_RANKS} == set(VALUE)


def test_train_without_ranks_keeps_its_evaluation_defaults():
    from tilecast.cli import build_parser
    from tilecast.training.loop import TrainOptions

    args = build_parser().parse_args(["train", "--model", "gpt2-tiny"])
    assert args.eval_every is None and args.eval_batches is None  # given or not is told apart
    helps = {a.dest: a.help for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions}
    assert f"default: {TrainOptions.eval_every})" in helps["eval_every"]  # --help states what runs
    assert f"default: {TrainOptions.eval_batches})" in helps["eval_batches"]
