"""Tune for a smaller card on a bigger one: hold the rest of the GPU with a ballast process.

Why: `--gpu-memory-cap 24GiB` must make the OOMs of a 24 GiB card real on an 80 or 141 GB card.
Servers started through tuner's own launchers cap themselves (TUNER_GPU_MEMORY_CAP_GIB), but most
servers (InfiniLM, vLLM, SGLang) offer no per-process limit, and a KV pool sized for a small
card fits the big one.  So the tuner starts one process that allocates the memory above the cap
and sleeps; every server then sees the small card's free memory, and its cudaMalloc fails where
it would fail there.  The ballast lives in its own process group, dies with the tuner
(PR_SET_PDEATHSIG), and is stopped on every exit path.

Run as `python -m tuner.server.memcap --gpu N --leave BYTES`: allocates until the device's free
memory
is at most BYTES, prints `ready HELD_BYTES FREE_BYTES` and sleeps until it is killed.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tuner.errors import UsageError
from tuner.search.bounds import parse_size
from tuner.search.space import SearchSpace
from tuner.server.gpu import GpuState, read_gpu
from tuner.server.process import die_with_parent, stop_group

CHUNK_BYTES = 1 << 30
MIN_CHUNK_BYTES = 16 << 20
READY_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Held:
    """The card as the servers will see it while the ballast holds the rest."""

    held_bytes: int
    free_bytes: int
    state: (
        GpuState | None
    )  # NVML after the ballast is up: its pids and used memory are the new idle


@dataclass(frozen=True)
class CapSetup:
    """What `--gpu-memory-cap` gives the trials."""

    env: dict[str, str]          # added to every server's environment
    idle: GpuState | None        # the card trials start from: idle memory and the tuner's own pids
    held_bytes: int = 0          # held by the ballast (0: none)
    free_bytes: int = 0          # what the servers find free while it holds

    def trial_fields(self) -> dict[str, Any]:
        """The TrialContext fields that come from the cap: server env, and the idle card to
        wait for between trials."""
        idle = self.idle
        return {"extra_env": self.env, "gpu_index": idle.index if idle else None,
                "gpu_baseline_bytes": idle.used_bytes if idle else 0,
                "gpu_known_pids": idle.pids if idle else ()}


def cap_env(cap: str | None) -> dict[str, str]:
    """The server environment that makes tuner's launchers cap GPU memory at `cap`."""
    return {"TUNER_GPU_MEMORY_CAP_GIB": f"{parse_size(cap) / 2**30:g}"} if cap else {}


@contextmanager
def memory_cap(space: SearchSpace, cap: str | None, gpu: GpuState | None,
               simulate: bool = False) -> Iterator[CapSetup]:
    """The cap as the space's server takes it: a variable for servers that cap themselves
    (`server.memory_cap: env`), else a ballast holding the card above the cap."""
    if not cap or simulate or space.server.memory_cap == "env":
        yield CapSetup(env=cap_env(cap), idle=gpu)
        return
    if gpu is None:
        raise UsageError("--gpu-memory-cap: NVML does not see the GPU, so the memory above the "
                         "cap cannot be held (or use --simulate)")
    with hold(gpu, parse_size(cap)) as held:
        yield CapSetup(
            env={}, idle=held.state, held_bytes=held.held_bytes, free_bytes=held.free_bytes
        )


def target_free(cap_bytes: int, state: GpuState) -> int:
    """Free memory that makes the card look like a `cap_bytes` card: a real small card also
    loses what the driver keeps (the used memory of the idle big card)."""
    if cap_bytes >= state.total_bytes:
        raise UsageError(f"--gpu-memory-cap {cap_bytes / 2**30:.1f} GiB is not below the card's "
                         f"{state.total_bytes / 2**30:.1f} GiB")
    return cap_bytes - state.used_bytes


@contextmanager
def hold(state: GpuState, cap_bytes: int, python: str = sys.executable) -> Iterator[Held]:
    """Hold the GPU of `state` (NVML, idle) down to `cap_bytes` for the duration of the block."""
    gpu_index = state.index
    leave = target_free(cap_bytes, state)
    # NVML numbers GPUs by PCI bus; CUDA does too only when told
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu_index)}
    proc = subprocess.Popen(
        [python, "-m", "tuner.server.memcap", "--gpu", "0", "--leave", str(leave)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )
    try:
        held, free = _wait_ready(proc)
        yield Held(held_bytes=held, free_bytes=free, state=read_gpu(gpu_index))
    finally:
        stop_group(proc.pid, child=proc)


def _wait_ready(proc: subprocess.Popen[bytes]) -> tuple[int, int]:
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline().decode(errors="replace").split()
            if len(line) == 3 and line[0] == "ready":
                return int(line[1]), int(line[2])
            if not line:  # EOF: the ballast died
                break
        elif proc.poll() is not None:
            break
    try:
        proc.wait(timeout=5.0)
        err = proc.stderr.read().decode(errors="replace").strip().splitlines()
    except subprocess.TimeoutExpired:  # alive but silent: the caller stops its group
        err = []
    reason = err[-1] if err else f"no 'ready' within {READY_TIMEOUT_S:.0f} s"
    raise UsageError(f"--gpu-memory-cap: the ballast process could not hold the GPU: {reason}")


def _fill(leave: int) -> list[Any]:
    """Allocate in shrinking chunks until the device's free memory is at most `leave`; the
    tensors must stay referenced for as long as the memory is to be held."""
    import torch

    blocks, chunk = [], CHUNK_BYTES
    while chunk >= MIN_CHUNK_BYTES:
        free, _ = torch.cuda.mem_get_info()
        if free <= leave:
            break
        size = min(chunk, free - leave)
        if size < MIN_CHUNK_BYTES:
            break
        try:
            blocks.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            chunk //= 2
    return blocks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tuner.server.memcap", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--gpu", type=int, default=0, help="CUDA device index (default: %(default)s)")
    p.add_argument("--leave", type=int, required=True, help="bytes of free memory to leave")
    args = p.parse_args(argv)
    if args.leave < 0:
        print(
            "--leave must be >= 0 (the cap is below what the idle card already uses)",
            file=sys.stderr,
        )
        return 2
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device visible to torch", file=sys.stderr)
        return 2
    torch.cuda.set_device(args.gpu)
    blocks = _fill(args.leave)
    free, _ = torch.cuda.mem_get_info()
    print(f"ready {sum(b.numel() for b in blocks)} {free}", flush=True)
    while True:  # SIGTERM/SIGKILL from the tuner ends it; the memory goes with the process
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
