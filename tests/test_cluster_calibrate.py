"""The fitted figures in the cluster files are what the fit gives on the calibration rows; folds are fresh."""

import pytest

from tilecast.cluster.calibrate import fit
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
