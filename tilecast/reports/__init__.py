"""Comparison of a predicted (simulated) trace with a measured one of the same graph.

Imports only :mod:`tilecast.trace` and libraries: a report does not know how a
trace was produced.
"""

from tilecast.reports.comparison import Comparison, compare
from tilecast.reports.pairing import ComparisonError
from tilecast.reports.ranking import ranking_accuracy

__all__ = ["Comparison", "ComparisonError", "compare", "ranking_accuracy"]
