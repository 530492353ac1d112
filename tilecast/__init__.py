"""tilecast: forecast, then run, tiled training of GPT language models.

The Python API (docs/api.md): ``import tilecast as tc`` then ``tc.model``,
``tc.graph``, ``tc.simulate``, ``tc.simulate_policies``, ``tc.tune``, ``tc.run``,
``tc.train``, ``tc.compare``, ``tc.verify``, ``tc.accuracy``, ``tc.demo``,
``tc.whatif``, ``tc.whatif_search``, ``tc.whatif_inference``, ``tc.validate``,
``tc.validate_inference``, ``tc.calibrate``, ``tc.calibrate_network``, ``tc.check_speed``,
``tc.whatif_sweep``, ``tc.whatif_inference_search`` and the ``--ranks``
calls ``tc.run_ranks``, ``tc.train_ranks``, ``tc.simulate_ranks``,
``tc.tune_ranks``, and ``tc.gantt``, ``tc.kernel_times``, ``tc.recalibrate``, ``tc.memory``,
``tc.load_cluster``, defined in :mod:`tilecast.api` and loaded on
first use, so that importing tilecast stays fast (no pandas, no simulator).
"""

import types

__version__ = "0.1.0"

ENTRY_POINTS = ("model", "graph", "simulate", "tune", "run", "compare", "whatif", "validate", "whatif_inference",
                "validate_inference", "whatif_search",
                "simulate_policies", "verify", "accuracy", "demo", "train", "calibrate", "calibrate_network",
                "check_speed", "whatif_sweep", "whatif_inference_search", "run_ranks", "train_ranks", "simulate_ranks",
                "tune_ranks", "gantt", "kernel_times", "recalibrate", "memory", "load_cluster")


class EntryPointPackage(types.ModuleType):
    """A subpackage whose name is also an entry point of the API: calling it calls the entry point.

    ``tilecast.graph`` is both the graph package and ``tc.graph(...)``: Python's import system sets the
    package as the attribute ``graph`` of ``tilecast``, so the package itself answers the call.
    """

    def __call__(self, *args, **kwargs):
        from tilecast import api

        return getattr(api, self.__name__.rpartition(".")[2])(*args, **kwargs)


def __getattr__(name):
    if name in ENTRY_POINTS:
        from tilecast import api

        if name == "graph":  # the package, callable (EntryPointPackage)
            import importlib

            return importlib.import_module("tilecast.graph")
        return getattr(api, name)
    raise AttributeError(f"module 'tilecast' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(ENTRY_POINTS))
