"""The kernels extension builds on first use, once, into $TILECAST_HOME, even with two processes at once."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = """
from tilecast.kernels.native import library, run_kernel
import numpy as np
library()
y = np.ones(4, np.float32)
run_kernel("axpy", dict(n=4, alpha=2.0), [np.arange(4, dtype=np.float32), y])
print(y.tolist())
"""


def test_two_processes_build_once_and_reuse(tmp_path):
    env = dict(os.environ, TILECAST_HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", CODE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == "[1.0, 3.0, 5.0, 7.0]"  # stdout carries no compiler output
    builds = sorted(p.name for p in (tmp_path / "native").iterdir() if p.is_dir())
    assert len(builds) == 1 and builds[0].startswith("_tilecast_kernels-"), builds
    stamp = next((tmp_path / "native" / builds[0]).glob("*.so")).stat().st_mtime
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and next((tmp_path / "native" / builds[0]).glob("*.so")).stat().st_mtime == stamp
