"""Kernel models from StarPU history-based performance-model files (the 1.3 file layout)."""

import numpy as np
import pytest
from sim_graphs import gemm_chain_graph

from tilecast.perfmodel import load_machine
from tilecast.perfmodel.kernel_model import DurationModel
from tilecast.perfmodel.starpu_history import calibration_from_history, read_history

HEADER = """##################
# Performance Model Version
45

####################
# COMBs
# number of combinations
{ncomb}
"""
COMB = """####################
# COMB_{c}
# number of types devices
1
####################
# DEV_0
# device type (CPU - 0, CUDA - 1, OPENCL - 2, MIC - 3, MPI_MS - 5)
{device}
####################
# DEV_0
# device id 
0
####################
# DEV_0
# number of cores 
1
##########
# number of implementations
1
#####
# Model for cpu0_impl0 (Comb{c})
# number of entries
{n}
# sumlnx	sumlnx2		sumlny		sumlnxlny	alpha		beta		n	minx		maxx
0.000000e+00   	0.000000e+00   	0.000000e+00   	0.000000e+00   	nan            	nan            	0	0              	0              
# a		b		c
nan            	nan            	nan            
# not multiple-regression-base
0
# hash		size		flops		mean (us)	dev (us)	sum		sum2		n
{rows}

"""


def _row(h, size, mean_us, n):
    return f"{h:08x}\t{size}           \t0.000000e+00   \t{mean_us:e}   \t1.0e-01   \t{mean_us * n:e}   \t0   \t{n}"


def test_history_rows_become_points_for_matching_shapes(tmp_path):
    g = gemm_chain_graph(n_layers=1, tiles=2, tile=32)
    size = 3 * 32 * 32 * 4  # every gemm task touches three 32x32 float32 tiles
    cpu = COMB.format(c=0, device=0, n=3, rows="\n".join([_row(1, size, 40.0, 3), _row(2, size, 80.0, 1),
                                                           _row(3, 999, 5.0, 2)]))
    cuda = COMB.format(c=1, device=1, n=1, rows=_row(4, size, 2.0, 9))
    d = tmp_path / "45"
    d.mkdir()
    (d / "gemm.myhost").write_text(HEADER.format(ncomb=2) + cpu + cuda)
    rows = read_history(str(d / "gemm.myhost"))
    assert [(r.device, r.size, r.n) for r in rows] == [(0, size, 3), (0, size, 1), (0, 999, 2), (1, size, 9)]
    m = load_machine("local")
    cal = calibration_from_history(str(tmp_path), g, m)
    assert cal.timer == "starpu-history"
    expected = (3 * 40e-6 + 1 * 80e-6) / 4  # rows of the same size pooled by sample count
    assert cal.points["gemm"]["median_s"] == pytest.approx([expected] * len(cal.points["gemm"]["shapes"]))
    np.testing.assert_allclose(DurationModel(m, cal).durations(g)[0], expected)


def test_a_missing_directory_is_reported():
    with pytest.raises(ValueError, match="no such directory"):
        calibration_from_history("/nonexistent/codelets", gemm_chain_graph(1, 1, 8), load_machine("local"))
