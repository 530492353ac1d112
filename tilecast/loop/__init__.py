"""The closed loop: candidate configurations -> simulate -> rank -> execute on StarPU -> compare -> recalibrate.

- :func:`tune` ranks tilings, schedulers and worker counts of a step by simulation;
- :func:`execute` runs chosen configurations on StarPU, predicted beside measured;
- :func:`run_suite` (:mod:`tilecast.loop.accuracy`) checks the predictions over a fixed suite.
"""

from tilecast.loop.config import StepConfig
from tilecast.loop.execute import Checked, Execution, execute
from tilecast.loop.measure import Measurement, measure
from tilecast.loop.predict import Prediction, predict, rank
from tilecast.loop.tune import TuneResult, pick_for_execution, tune

__all__ = ["Checked", "Execution", "Measurement", "Prediction", "StepConfig", "TuneResult", "execute", "measure",
           "pick_for_execution", "predict", "rank", "tune"]
