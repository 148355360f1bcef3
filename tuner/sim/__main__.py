"""`python -m tuner.sim`: a simulated InfiniLM server process (flags as `inference_server.py`).

Start-up mirrors InfiniLM: load the model (simulated: the weights read at LOAD_GBPS, scaled by
--time-scale), allocate the KV pool (fail with InfiniLM's three log lines and exit status 3 when
it does not fit, or when the card's profile cannot compile the block size), then serve.
"""

from __future__ import annotations

import os
import sys
import time

from tuner.errors import UsageError
from tuner.search.model import load_model_info
from tuner.sim.config import parse_config
from tuner.sim.engine import Engine, StartupFailure
from tuner.sim.profiles import get_profile
from tuner.sim.server import SimServer, serve

LOAD_GBPS = 2.0
STARTUP_EXIT = 3


def log(line: str) -> None:
    """InfiniLM logs to stderr; flush so a supervisor's log file sees failures at once."""
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_config(sys.argv[1:] if argv is None else argv, os.environ)
        model = load_model_info(cfg.model)
        gpu = get_profile(cfg.gpu, os.environ)
    except UsageError as exc:
        log(f"error: {exc}")
        return 2
    log(f"Loading model {model.name} ({model.params / 1e9:.2f} B params) on simulated {gpu.name}")
    time.sleep(model.weight_bytes / cfg.tp / (LOAD_GBPS * 1e9) / cfg.time_scale)
    try:
        engine = Engine(model, gpu, cfg, log)
    except StartupFailure as exc:
        for line in exc.log_lines:
            log(line)
        return STARTUP_EXIT
    log(f"KV cache: {cfg.num_blocks} blocks x {cfg.block_size} tokens, "
        f"idle memory {engine.memory.idle_bytes >> 20} MiB of {gpu.memory_mib} MiB")
    log(f"Uvicorn running on http://{cfg.host}:{cfg.port} (time scale {cfg.time_scale})")
    serve(SimServer(engine, cfg.time_scale, model.name, cfg.max_new_tokens), cfg.host, cfg.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
