"""Discrete-event simulation of a task graph on a machine model (see docs/design.md)."""

from tilecast.simulator.engine import Engine, SimulationError
from tilecast.simulator.streams import simulate_streams

__all__ = ["Engine", "SimulationError", "simulate_streams"]
