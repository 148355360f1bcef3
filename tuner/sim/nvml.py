"""A simulated NVML: one JSON file standing for one GPU, so GPU faults can be tested on CPUs.

`TUNER_SIM_NVML=<file>` makes `tuner.server.gpu.read_gpu` read the card from the file instead
of NVML: `{"name", "total_bytes", "used_bytes", "processes": {"<pid>": bytes}}`.  As with NVML,
a process that has exited holds nothing, so only live pids are listed and counted as used.
The simulated server's `gpu_grab` fault adds a foreign process here (tuner.sim.faults).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from tuner.server.gpu import GpuState
from tuner.server.process import pid_alive

SIM_NVML_ENV = "TUNER_SIM_NVML"


def sim_nvml_path() -> Path | None:
    raw = os.environ.get(SIM_NVML_ENV)
    return Path(raw) if raw else None


def create(path: Path, name: str = "simulated GPU", total_bytes: int = 24 * 2**30,
           used_bytes: int = 400 * 2**20) -> None:
    """A fresh card with nothing on it but the driver's `used_bytes`."""
    path.write_text(json.dumps({"name": name, "total_bytes": total_bytes,
                                "used_bytes": used_bytes, "processes": {}}))


def read_state(path: Path, index: int = 0) -> GpuState:
    with open(path) as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        card = json.load(f)
    live = {int(pid): int(b) for pid, b in card["processes"].items() if pid_alive(int(pid))}
    return GpuState(index=index, name=card["name"], total_bytes=int(card["total_bytes"]),
                    used_bytes=int(card["used_bytes"]) + sum(live.values()), pids=tuple(live))


def add_process(path: Path, pid: int, used_bytes: int) -> None:
    """A process now holds `used_bytes` of the card (until it exits)."""
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        card = json.load(f)
        card["processes"][str(pid)] = used_bytes
        f.seek(0)
        f.truncate()
        f.write(json.dumps(card))
        f.flush()
        os.fsync(f.fileno())
