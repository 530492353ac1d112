"""The fitted figures in the cluster files are what the fit gives on the calibration rows; folds are fresh."""

import pytest

from tilecast.cluster.calibrate import ATTENTION_RATIOS, fit, used_params
from tilecast.cluster.hardware import load_cluster
from tilecast.cluster.lopo import StaleFoldsError, stored_folds
from tilecast.cluster.validation import EXCLUDED, load_runs


def test_cluster_files_hold_the_fit_of_the_calibration_rows():
    runs = load_runs()
    fits = fit([r for r in runs if r.role == "calibration"])
    for name, f in fits.items():
        gpu = load_cluster(name).gpu
        p = f["params"]
        assert max(gpu.matmul_efficiency["bf16"].fraction) == pytest.approx(p["e_max.bf16"], abs=2e-3)
        assert gpu.gemm_half_dim == pytest.approx(p["gemm_half_dim"], abs=5)
        for k in ("flash", "cudnn"):
            if f"attention.{k}" in p and k in gpu.attention_efficiency:
                assert gpu.attention_efficiency[k] == pytest.approx(p[f"attention.{k}"], rel=0.01)
        assert f["rms_log_error"] < 0.08
        if "attention.cudnn" in p:  # tied, not fitted: FlashAttention-3's generation, 1.5x FlashAttention-2
            assert p["attention.cudnn"] == pytest.approx(ATTENTION_RATIOS["cudnn"][1] * p["attention.flash"], abs=2e-4)
    assert load_cluster("dgx-h200").gpu.gemm_half_dim == load_cluster("dgx-h100").gpu.gemm_half_dim


def test_no_fitted_row_cites_an_excluded_publication_and_folds_match_the_table(tmp_path):
    runs = load_runs()
    assert not any(bad in (r.source + r.id).lower() for r in runs for bad in EXCLUDED)
    folds = stored_folds()
    assert set(folds) == {r.source for r in runs}
    changed = tmp_path / "runs.yaml"
    from tilecast.cluster.validation import RUNS

    changed.write_text(open(RUNS).read() + "\n# edited\n")
    with pytest.raises(StaleFoldsError, match="rerun"):
        stored_folds(table=str(changed))


def test_a_preset_changed_under_the_table_makes_the_folds_stale(monkeypatch):
    from tilecast.graph.presets import PRESETS

    stored_folds()  # fresh as shipped
    monkeypatch.setitem(PRESETS, "mpt-30b", {**PRESETS["mpt-30b"], "n_head": 64})  # the released checkpoint's heads
    with pytest.raises(StaleFoldsError, match="rerun"):
        stored_folds()


def test_an_fp8_cudnn_row_informs_the_bf16_plateau_and_the_flash_figure():
    runs = {r.id: r for r in load_runs()}
    nemo = runs["nemo-llama2-7b-8"]  # fp8 GEMMs, cuDNN attention
    assert (nemo.strategy.dtype, nemo.strategy.attention) == ("fp8", "cudnn")
    assert used_params([nemo]) == {"e_max.bf16", "attention.flash", "gemm_half_dim"}
    assert used_params([runs["mtnlg-2240"]]) == {"e_max.bf16", "gemm_half_dim"}  # unfused attention


def test_leave_one_publication_out_meets_its_target():
    from tilecast.cluster.lopo import lopo_errors
    from tilecast.cluster.validation import median_abs_error

    df = lopo_errors(load_runs())
    by = {s: median_abs_error(g) for s, g in df.groupby("source")}
    assert median_abs_error(df) <= 0.12, by  # the target; 17.7% with fp8's own plateau and untied kernels
    assert by["mosaic"] <= 0.12 and by["nemo"] <= 0.12, by
