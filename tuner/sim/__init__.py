"""The simulated InfiniLM server: `python -m tuner.sim` over HTTP, or `simulate(...)` in-process.

Modules, one job each: `profiles` (GPU spec numbers and quirks), `config` (InfiniLM flags and
`INFINILM_*` env -> SimConfig), `memory` (the one memory mechanism behind every OOM), `timing`
(roofline step times), `engine` (scheduler + KV block pool, event-driven), `prompts` (token
counting without a tokenizer), `api` (in-process closed-loop driver), `server` (aiohttp, the
simulated-time protocol of docs/architecture.md), `__main__` (CLI and start-up failures).
"""

from tuner.sim.api import SimCellResult, simulate
from tuner.sim.engine import StartupFailure

__all__ = ["SimCellResult", "StartupFailure", "simulate"]
