"""Tile owners by distribution, and where StarPU-MPI's insert-task rule runs tasks and moves tiles."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tilecast.cli import main
from tilecast.graph import Tiling
from tilecast.graph.distribution import distribute, param_of, prepare, rank_grid
from tilecast.graph.model_config import load_model
from tilecast.graph.models import build_step
from tilecast.graph.owner_computes import plan, rank_figures
from tilecast.kernels.registry import R, W


@pytest.fixture(scope="module")
def graph():
    cfg = load_model('{"n_layer":3,"n_embd":32,"n_head":2,"vocab_size":64,"n_positions":32}')
    return build_step(cfg, 4, 16, Tiling.parse("16,batch=1"))


def reference_plan(graph, owner, ranks):
    """StarPU-MPI 1.3.10's rule, task by task with an explicit cache (starpu_mpi_task_insert.c)."""
    cached = set()  # (tile, rank) holding a received copy
    rank_of, moves = [], []
    for i in range(graph.n_tasks):
        a, b = graph.acc_ptr[i], graph.acc_ptr[i + 1]
        tiles, modes = graph.acc_tile[a:b].tolist(), graph.acc_mode[a:b].tolist()
        writers = {int(owner[t]) for t, m in zip(tiles, modes) if m & W}
        if len(writers) == 1:
            x = writers.pop()
        else:  # _starpu_mpi_select_node_with_most_data
            score = [0] * ranks
            for t, m in zip(tiles, modes):
                score[owner[t]] += graph.tile_nbytes[t] * (bool(m & R) + bool(m & W))
            x = max(range(ranks), key=lambda r: (score[r], -r)) if max(score) > 0 else 0
        rank_of.append(x)
        for t, m in zip(tiles, modes):
            if m & R and owner[t] != x and (t, x) not in cached:
                cached.add((t, x))
                moves.append((i, t, int(owner[t]), x))
        for t, m in zip(tiles, modes):
            if m & W and owner[t] != x:
                moves.append((i, t, x, int(owner[t])))
        for t, m in zip(tiles, modes):
            if m & W:
                cached = {c for c in cached if c[0] != t}
    return np.array(rank_of), sorted(moves)


@pytest.mark.parametrize("name,ranks", [("data", 2), ("data", 4), ("layer", 2), ("layer", 3), ("cyclic", 2),
                                        ("cyclic", 4), ("random", 3)])
def test_plan_follows_starpu_mpi_rule(graph, name, ranks):
    if name == "random":  # owners that split tasks' written tiles: the most-data policy and sends back
        owner = np.random.default_rng(1).integers(0, ranks, graph.n_tiles).astype(np.int32)
    else:
        graph, dist = prepare(graph, ranks, name)
        owner = dist.owner
    p = plan(graph, owner, ranks)
    want_rank, want_moves = reference_plan(graph, owner, ranks)
    assert np.array_equal(p.task_rank, want_rank)
    t = p.transfers
    got = sorted(zip(t.task.tolist(), t.tile.tolist(), t.src.tolist(), t.dst.tolist()))
    assert got == want_moves
    assert (p.inconsistent > 0) == (name == "random") and (t.back.any() == (name == "random"))


def test_owners(graph):
    ranks = 2
    data = distribute(graph, ranks, "data").owner
    ids = graph.tensor("ids")
    assert data[ids.first_tile:ids.first_tile + ids.n_tiles].tolist() == [0, 0, 1, 1]  # 4 batch tiles, blocks
    owners = [distribute(graph, ranks, dist).owner for dist in ("data", "layer", "cyclic")]
    for t in graph.tensors:  # a gradient and its moments live with their parameter, tile by tile
        if t.kind in ("grad", "optim"):
            p = graph.tensor(param_of(t.name))
            for o in owners:
                assert np.array_equal(o[t.first_tile:t.first_tile + t.n_tiles], o[p.first_tile:p.first_tile + p.n_tiles])
    params = np.concatenate([np.arange(t.first_tile, t.first_tile + t.n_tiles) for t in graph.tensors
                             if t.kind == "param"])
    load = np.bincount(data[params], weights=graph.tile_nbytes[params], minlength=ranks)
    assert load.min() > 0.6 * load.max()  # sharded, not all on one rank
    layer = distribute(graph, 3, "layer").owner
    for name, rank in (("h.0.mlp.wfc", 0), ("h.1.attn.wq", 1), ("grad:h.2.ln_1.g", 2), ("x.3", 2), ("x.0", 0),
                       ("wte", 0), ("logits", 2), ("loss", 2)):
        t = graph.tensor(name)
        assert set(layer[t.first_tile:t.first_tile + t.n_tiles].tolist()) == {rank}, name
    assert rank_grid(6) == (2, 3) and rank_grid(7) == (1, 7) and rank_grid(4) == (2, 2)
    cyc = distribute(graph, 4, "cyclic").owner
    w = graph.tensor("h.0.mlp.wfc")  # (embd, inner): tile (i, j) on rank (i % 2) * 2 + j % 2
    i, j = np.unravel_index(np.arange(w.n_tiles), w.grid)
    assert np.array_equal(cyc[w.first_tile:w.first_tile + w.n_tiles], (i % 2) * 2 + j % 2)


def test_one_rank_moves_nothing(graph):
    for name in ("data", "layer", "cyclic"):
        fig = rank_figures(graph, distribute(graph, 1, name))
        assert fig["bytes_moved"] == 0 and fig["per_rank"][0]["tasks"] == graph.n_tasks


def test_ranks_that_do_not_fit(graph):
    with pytest.raises(ValueError, match="^ranks: the layer distribution needs a layer per rank"):
        distribute(graph, 4, "layer")
    with pytest.raises(ValueError, match="^ranks: the data distribution needs a batch tile per rank"):
        distribute(graph, 5, "data")
    with pytest.raises(ValueError, match="^distribution: unknown"):
        distribute(graph, 2, "rows")


def test_graph_cli_ranks_json(capsys):
    args = ["graph", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--tile", "32,batch=1", "--json"]
    assert main(args + ["--ranks", "2", "--distribution", "layer"]) == 0
    fig = json.loads(capsys.readouterr().out)["ranks"]
    assert set(fig) == {"distribution", "ranks", "rank_grid", "tasks", "bytes_moved", "messages", "bytes_sent_back",
                        "tasks_placed_by_most_data", "per_rank", "bytes_matrix"}
    rows = fig["per_rank"]
    assert sum(r["tasks"] for r in rows) == fig["tasks"]
    assert sum(r["bytes_sent"] for r in rows) == sum(r["bytes_received"] for r in rows) == fig["bytes_moved"] > 0
    assert np.array(fig["bytes_matrix"]).sum() == fig["bytes_moved"]


@pytest.mark.parametrize("args,flag", [(["--ranks", "3", "--distribution", "layer"], "--ranks"),
                                       (["--ranks", "2", "--distribution", "rows"], "--distribution"),
                                       (["--ranks", "0"], "--ranks")])
def test_graph_cli_bad_ranks_one_line(args, flag):
    p = subprocess.run([sys.executable, "-m", "tilecast", "graph", "--model", "gpt2-tiny", "--seq", "32", *args],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith(f"tilecast graph: {flag}"), p.stderr


def test_data_partial_gradients_same_step_less_traffic():
    """The data distribution's rewrite (per-rank partial gradients summed on the owner) computes the same step
    (float64 reference, GPT-2 and Llama), and moves less than owner-computes on the graph as built."""
    from tilecast.reference.step import TrainState, init_params, reference_step

    for shape in ('{"n_layer":2,"n_embd":32,"n_head":2,"vocab_size":64,"n_positions":32}',
                  '{"family":"llama","n_layer":1,"n_embd":32,"n_head":4,"n_kv_head":2,"vocab_size":64,'
                  '"n_positions":32,"tie_word_embeddings":false}'):
        cfg = load_model(shape)
        built = build_step(cfg, 4, 16, Tiling.parse("16,batch=1"), dtype=np.float64)
        run, dist = prepare(built, 3, "data")
        names = [t.name for t in run.tensors if t.name.startswith("partial")]
        assert {n.split(":")[0] for n in names} == {"partial0", "partial1", "partial2"}
        params = {k: v.astype(np.float64) for k, v in init_params(cfg, 0).items()}
        ids = np.random.default_rng(0).integers(0, 64, (4, 17))
        results = []
        for g in (built, run):
            state = TrainState({k: v.copy() for k, v in params.items()})
            results.append((reference_step(g, state, ids[:, :-1], ids[:, 1:]), state))
        (r1, s1), (r2, s2) = results
        assert r1.loss == pytest.approx(r2.loss, rel=1e-12)
        for k in r1.grads:
            assert np.allclose(r1.grads[k], r2.grads[k], rtol=1e-10, atol=1e-14), k
            assert np.allclose(s1.params[k], s2.params[k], rtol=1e-10, atol=1e-14), k
        whole = rank_figures(built, distribute(built, 3, "data"))
        split = rank_figures(run, dist)
        assert split["bytes_moved"] < whole["bytes_moved"]
