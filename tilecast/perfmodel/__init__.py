"""Performance models: machine descriptions, kernel durations, transfers, calibration."""

from tilecast.perfmodel.machine import Machine, MachineError, list_machines, load_machine, parse_machine

__all__ = ["Machine", "MachineError", "list_machines", "load_machine", "parse_machine"]
