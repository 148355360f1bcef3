"""The simulated InfiniLM server: `python -m tuner.sim` over HTTP, or `simulate(...)` in-process."""

from tuner.sim.api import SimCellResult, simulate
from tuner.sim.engine import StartupFailure

__all__ = ["SimCellResult", "StartupFailure", "simulate"]
