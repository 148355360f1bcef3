"""`python -m tuner.sim`: a simulated InfiniLM server process (flags as `inference_server.py`).

Start-up mirrors InfiniLM: load the model (simulated: the weights read at LOAD_GBPS, scaled by
--time-scale), allocate the KV pool (fail with InfiniLM's three log lines and exit status 3 when
it does not fit, or when the card's profile cannot compile the block size), then serve.  A port
that cannot be bound ends the process with exit status 1, as uvicorn does.  `--faults` injects
seeded faults (tuner.sim.faults).
"""

from __future__ import annotations

import os
import sys
import time

from tuner.errors import UsageError
from tuner.search.model import load_model_info
from tuner.sim.config import parse_config
from tuner.sim.engine import Engine, StartupFailure
from tuner.sim.faults import ServerFaults, parse_spec
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
        spec = parse_spec(cfg.faults)
    except UsageError as exc:
        log(f"error: {exc}")
        return 2
    faults = ServerFaults(spec, cfg.port) if spec.rates else None
    if faults is not None and faults.kind is not None:
        log(faults.describe())
    log(f"Loading model {model.name} ({model.params / 1e9:.2f} B params) on simulated {gpu.name}")
    load_s = model.weight_bytes / cfg.tp / (LOAD_GBPS * 1e9)
    if faults is not None and faults.kind == "slow_start":
        load_s += spec.opt("slow_start_s")
    time.sleep(load_s / cfg.time_scale)
    try:
        engine = Engine(model, gpu, cfg, log)
    except StartupFailure as exc:
        for line in exc.log_lines:
            log(line)
        return STARTUP_EXIT
    log(f"KV cache: {cfg.num_blocks} blocks x {cfg.block_size} tokens, "
        f"idle memory {engine.memory.idle_bytes >> 20} MiB of {gpu.memory_mib} MiB")
    holder = faults.take_port(cfg.host, cfg.port) if faults is not None else None
    server = SimServer(engine, cfg.time_scale, model.name, cfg.max_new_tokens, faults, log)
    try:
        serve(server, cfg.host, cfg.port, ready=lambda: log(
            f"Uvicorn running on http://{cfg.host}:{cfg.port} (time scale {cfg.time_scale})"))
    except OSError as exc:
        log(f"ERROR: {exc}")
        return 1
    finally:
        if holder is not None:
            holder.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
