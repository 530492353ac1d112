"""The C kernels' BLAS: which library they link, which core it runs, and the fallback warning."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tilecast.kernels import blas, native
from tilecast.perfmodel.local import hardware, run_conditions


def _info(core: str, cpu: str, forced=None) -> blas.BlasInfo:
    return blas.BlasInfo(library="scipy-openblas32", version="0.3.34", core=core, config="", cpu_isa=cpu,
                         core_isa=blas.core_isa(core), forced_core=forced)


def test_cpu_isa_from_flags():
    assert blas.cpu_isa({"sse3", "avx", "avx2", "fma", "avx512f", "avx512vl"}) == "avx512"
    assert blas.cpu_isa({"sse3", "avx", "avx2", "fma", "avx512f"}) == "avx2"  # no VL: SkylakeX kernels need it
    assert blas.cpu_isa({"sse3", "avx", "avx2"}) == "avx"  # AVX2 without FMA
    assert blas.cpu_isa({"sse3", "sse4_2"}) == "sse"


def test_generic_cores_are_fallbacks_on_wider_cpus():
    assert _info("Prescott", "avx512").fallback and _info("Katmai", "avx2").fallback
    assert _info("Haswell", "avx512").fallback  # AVX2 kernels on an AVX-512 CPU
    assert not _info("SkylakeX", "avx512").fallback and not _info("Zen", "avx2").fallback
    assert not _info("Prescott", "sse").fallback  # nothing better exists there
    line = _info("Prescott", "avx512").warning()
    assert "\n" not in line and "Prescott" in line and "AVX512" in line and "did not recognise" in line
    forced = _info("Prescott", "avx512", forced="Prescott").warning()
    assert "OPENBLAS_CORETYPE=Prescott" in forced
    assert _info("SkylakeX", "avx512").warning() is None


def test_kernels_link_the_wheels_openblas_and_report_its_core():
    info = blas.blas_info()
    assert info.library == "scipy-openblas32" and info.core and info.version.startswith("0.3.")
    assert info.core in info.config  # the library's own configuration string names the core it chose
    native.library()
    maps = Path("/proc/self/maps").read_text()
    lib_dir = blas.build_flags()["library_dirs"][0]
    assert any(line.endswith(os.path.join(lib_dir, "libscipy_openblas.so")) for line in maps.splitlines())
    # the kernels' GEMM is that library's: same result as numpy on a shape that uses its blocked kernels
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(96 * 80, dtype=np.float32), rng.standard_normal(80 * 72, dtype=np.float32)
    c = np.zeros(96 * 72, dtype=np.float32)
    native.run_kernel("gemm", [0, 0, 96, 72, 80, 1.0, 0.0], [a, b, c])
    np.testing.assert_allclose(c.reshape(96, 72), a.reshape(96, 80) @ b.reshape(80, 72), rtol=1e-4, atol=1e-4)


def test_fingerprint_and_conditions_name_the_core():
    core = blas.blas_info().core
    assert hardware()["blas"].endswith(core)  # part of the local machine's fingerprint: a new core recalibrates
    c = run_conditions()
    assert core in c["kernels_blas"] and c["kernels_blas_fallback"] is blas.blas_info().fallback


def test_forced_generic_core_is_warned_about_in_one_line():
    """OPENBLAS_CORETYPE (set in the child only) forces a generic core: reported in JSON, warned on stderr."""
    code = ("import json; from tilecast.cli.common import blas_summary; d, line = blas_summary(); "
            "blas_summary(); print(json.dumps(d))")
    env = {**os.environ, "OPENBLAS_CORETYPE": "Prescott"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["forced_core"] == "Prescott" and d["core_isa"] == "sse"
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    if d["cpu_isa"] == "sse":
        assert not d["fallback"] and not warnings
    else:
        assert d["fallback"] and len(warnings) == 1 and "OPENBLAS_CORETYPE=Prescott" in warnings[0]
