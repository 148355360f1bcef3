"""One worker process per GPU on one host, all sharing the study's storage.

Scale-out is Optuna's: workers only share a storage (SQLite on one host, PostgreSQL across
hosts) and the storage hands out trial numbers.  This module just starts `tuner tune` once per
GPU with CUDA_VISIBLE_DEVICES set, and stops them all if the parent is interrupted.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tuner.errors import UsageError
from tuner.server.process import die_with_parent, stop_group


def parse_gpus(text: str) -> list[int]:
    try:
        gpus = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(
            f"--gpus: expected a comma-separated list of GPU indices, got '{text}'"
        ) from None
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise UsageError(f"--gpus: expected distinct non-negative GPU indices, got '{text}'")
    return gpus


def run_workers(worker_argv: list[str], gpus: list[int]) -> int:
    """Run `tuner <worker_argv> --gpu-index I` per GPU; the worst exit status wins."""
    procs = []
    try:
        for gpu in gpus:
            env = {
                **os.environ,
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "CUDA_VISIBLE_DEVICES": str(gpu),
            }
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "tuner.cli", *worker_argv, "--gpu-index", str(gpu)],
                env=env, start_new_session=True, preexec_fn=die_with_parent()))
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                stop_group(p.pid, grace_s=10.0, child=p)
    return max(codes, key=lambda c: (c != 0, abs(c)))
