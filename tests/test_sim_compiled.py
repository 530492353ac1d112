"""The Cython-compiled fused loop: used where it can be built, and equal to the interpreted one bit for bit.

test_sim_fused.py and test_sim_reference.py run whichever loop the simulator
picks (the compiled one where Cython and a C compiler are present); here both
run on the same random cases (hypothesis, test_sim_fused's strategy).
"""

import importlib.util
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from test_sim_fused import _outcome, assert_same_outcome, cases

from tilecast.simulator import compiled
from tilecast.simulator import fused_deque_model as interpreted

CAN_BUILD = importlib.util.find_spec("Cython") is not None and bool(shutil.which("cc") or shutil.which("gcc"))
needs_build = pytest.mark.skipif(not CAN_BUILD, reason="Cython or a C compiler is missing")


@needs_build
def test_the_compiled_loop_is_used_where_it_can_be_built(monkeypatch):
    monkeypatch.delenv(compiled.ENV, raising=False)
    module = compiled.fused_loop_module()
    assert module is not interpreted and module.COMPILED
    assert not interpreted.COMPILED


def test_the_interpreted_loop_can_be_forced(monkeypatch):
    monkeypatch.setenv(compiled.ENV, "0")
    assert compiled.fused_loop_module() is interpreted


def _with(monkeypatch, flag: str, case):
    monkeypatch.setenv(compiled.ENV, flag)
    return _outcome(*case, fused=True)


@needs_build
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(cases())
def test_compiled_equals_interpreted(monkeypatch, case):
    assert_same_outcome(_with(monkeypatch, "0", case), _with(monkeypatch, "1", case))


def test_a_failed_build_falls_back_with_one_line(monkeypatch, capsys):
    def fail():
        raise compiled.NativeUnavailable("the Cython package is missing (install: pip install cython)")

    monkeypatch.delenv(compiled.ENV, raising=False)
    monkeypatch.setattr(compiled, "_compiled", None)
    monkeypatch.setattr(compiled, "_failed", None)
    monkeypatch.setattr(compiled, "_build", fail)
    assert compiled.fused_loop_module() is interpreted
    assert compiled.fused_loop_module() is interpreted  # tried once, said once
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interpreted loop" in err and "pip install cython" in err
