"""A step's task count from the model and tiling alone, and the one-line refusal of a step too large."""

import subprocess
import sys
import time
from dataclasses import replace

import pytest

from tilecast.graph import Tiling
from tilecast.graph.model_config import from_dict, load_model
from tilecast.graph.models import build_step
from tilecast.graph.size_estimate import (
    StepTooLarge,
    check_step_size,
    fitting_tile,
    step_tasks,
)

ODD_LLAMA = {"family": "llama", "n_layer": 2, "n_embd": 36, "n_head": 6, "n_kv_head": 3, "intermediate_size": 50,
             "vocab_size": 101, "n_positions": 32}
TIED_MHA = {"family": "llama", "n_layer": 1, "n_embd": 32, "n_head": 4, "n_kv_head": 4, "vocab_size": 70,
            "n_positions": 16, "tie_word_embeddings": True}
CASES = [  # (model, batch, seq, tiling): untiled, even, uneven, size-1 and mixed tiles, grouped or not, tied or not
    ("gpt2-tiny", 2, 12, ""), ("gpt2-tiny", 2, 12, "8"), ("gpt2-tiny", 3, 13, "batch=2,seq=5,embd=7,inner=9,vocab=11"),
    ("gpt2-tiny", 2, 12, "batch=1,seq=1,head=1"), ("llama-tiny", 2, 12, "4"), ("llama-tiny", 3, 9, "1,head=2"),
    (ODD_LLAMA, 3, 13, "seq=4,embd=5,head=4,inner=7,vocab=13"), (ODD_LLAMA, 1, 13, ""),
    (TIED_MHA, 2, 10, "3,head=1"), ("smollm2-135m", 1, 16, "seq=8,embd=192,head=3,inner=512,vocab=8192"),
]


def _cfg(m):
    return from_dict(m) if isinstance(m, dict) else load_model(m)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("model,batch,seq,tile", CASES)
def test_the_estimate_is_the_builders_count(model, batch, seq, tile, recompute):
    cfg, tiling = _cfg(model), Tiling.parse(tile)
    assert step_tasks(cfg, batch, seq, tiling, recompute) == build_step(cfg, batch, seq, tiling,
                                                                        recompute=recompute).n_tasks


def test_a_cluster_scale_step_is_counted_per_layer():
    """gpt3-175b at batch 4 x 256 (docs/graph.md): one layer 135,057 tasks at tile 256, 76,529 more a layer;
    146,758 tasks for the whole step at tile 2048, counted in well under a second."""
    cfg = load_model("gpt3-175b")
    t0 = time.perf_counter()
    one, two = (step_tasks(replace(cfg, n_layer=n), 4, 256, Tiling.parse("256")) for n in (1, 2))
    assert (one, two - one) == (135_057, 76_529)
    assert step_tasks(cfg, 4, 256, Tiling.parse("256")) == one + 95 * (two - one)
    assert step_tasks(cfg, 4, 256, Tiling.parse("2048")) == 146_758
    elapsed = time.perf_counter() - t0
    print(f"four counts: {elapsed:.3f} s")
    assert elapsed < 1.0
    assert build_step(replace(cfg, n_layer=1), 4, 256, Tiling.parse("2048")).n_tasks == step_tasks(
        replace(cfg, n_layer=1), 4, 256, Tiling.parse("2048"))


def test_refusal_names_tasks_memory_and_a_tile_that_fits():
    cfg = load_model("gpt3-175b")
    with pytest.raises(StepTooLarge) as e:
        check_step_size(cfg, 4, 256, Tiling.parse("256"), use="graph", available=64 * 2**30)
    assert e.value.field == "tile" and "7,405,312 tasks, over the 5,000,000" in str(e.value)
    assert "GB" in str(e.value) and "tile 512 gives 1,919,890 tasks" in str(e.value)
    # memory alone: 1 GiB available refuses a 1.9 M-task simulation and suggests a coarser tile that fits
    with pytest.raises(StepTooLarge) as e:
        check_step_size(cfg, 4, 256, Tiling.parse("512"), available=2**30)
    assert "1,919,890 tasks, which need about" in str(e.value) and "1.1 GB is available" in str(e.value)
    fit = fitting_tile(cfg, 4, 256, available=2**30)
    assert fit is not None and "tile " + str(fit[0].sizes["embd"]) + f" gives {fit[1]:,} tasks" in str(e.value)
    assert check_step_size(cfg, 4, 256, Tiling.parse("2048"), available=64 * 2**30) == 146_758


@pytest.mark.parametrize("argv", [["graph"], ["simulate"], ["simulate", "--ranks", "2"], ["tune", "--tile", "256"]])
def test_commands_refuse_gpt3_175b_at_tile_256_in_one_line(argv, capsys, tmp_path, monkeypatch):
    """No graph built: the refusal comes in seconds of CPU, as one line naming the flag, the tasks and a tile (in
    an empty home, so that no note about what the machine's home holds comes before it)."""
    from tilecast.cli import main

    monkeypatch.setenv("TILECAST_HOME", str(tmp_path))

    t0, c0 = time.perf_counter(), time.process_time()
    rc = main([argv[0], "--model", "gpt3-175b", "--batch", "4", "--seq", "256", *argv[1:]])
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    with capsys.disabled():
        print(f"{argv[0]} refused in {elapsed:.2f} s, {cpu:.2f} s of CPU")
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("tilecast")]
    assert rc == 2 and len(err) == 1, err
    assert "7405312 tasks" in err[0].replace(",", ""), err  # tune: its per-candidate reason, without commas
    assert ("--tile: " in err[0] or "--tiles: " in err[0]) and " gives " in err[0], err
    # CPU time, not wall-clock: in an empty home simulate detects the machine first, and at load average 10 on the
    # 2-core AMD EPYC (2026-12-01) its refusal took 15.5-27.4 s of wall-clock time for 1.9 s of CPU (graph 2.3-3.0 s,
    # tune 2.8-4.4 s); a graph of 7.4 M tasks built before refusing costs far more CPU than the bound, loaded or not
    assert cpu < 30, (cpu, elapsed)


def test_memory_available_under_an_address_space_limit_refuses_in_one_line():
    """Under ``ulimit -v`` the 2 M-task gpt2-xl step's graph (about 1.5 GB) is refused before it is built."""
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, resource.RLIM_INFINITY));"
            "from tilecast.cli import main; sys.exit(main(['graph', '--model', 'gpt2-xl', '--batch', '8', "
            "'--seq', '1024', '--tile', '128']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "2,023,375 tasks, which need about 1.5 GB to graph" in lines[0] and "tile 256 gives" in lines[0]


def test_a_memory_error_is_one_line_at_the_command_boundary(monkeypatch, capsys):
    """The last resort, for memory that runs out where no estimate foresaw it."""
    from tilecast.cli import main
    from tilecast.graph import models

    def exhausted(*a, **k):
        raise MemoryError

    monkeypatch.setattr(models, "build_step", exhausted)
    assert main(["graph", "--model", "gpt2-tiny", "--batch", "2", "--seq", "16", "--tile", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tilecast graph: out of memory"), err
