"""What the real GPU looks like, through NVML (nvidia-ml-py), and waiting for it to be free.

A trial measured while another process holds the card, or before the previous server's memory
was released, measures the wrong thing or OOMs for the wrong reason.  So before each trial the
card must hold no foreign compute process and be back at its idle baseline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import FaultError, UsageError


@dataclass(frozen=True)
class GpuState:
    index: int
    name: str
    total_bytes: int
    used_bytes: int
    pids: tuple[int, ...]

    @property
    def describe(self) -> str:
        return f"{self.name} ({self.total_bytes / 2**30:.1f} GiB)"


def _nvml():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - no driver, no library, no GPU: all mean "no NVML here"
        return None


def visible_gpu_index(environ: Mapping[str, str] | None = None) -> int:
    """The NVML index of the GPU a CUDA program started now would use as device 0.

    A tuner started with CUDA_VISIBLE_DEVICES=1 runs its servers on the second card; its checks
    (idle memory, foreign processes, the ballast) must read that card, not NVML's first.  NVML
    numbers cards by PCI bus, as CUDA does with CUDA_DEVICE_ORDER=PCI_BUS_ID (and as it does by
    default on a host of identical cards).  A UUID entry is looked up (a MIG instance reads its
    parent card); anything else reads 0.
    """
    env = os.environ if environ is None else environ
    first = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.isdigit():
        return int(first)
    if first.startswith(("GPU-", "MIG-")) and (nv := _nvml()) is not None:
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(first)
            if first.startswith("MIG-"):  # NVML gives no index for a MIG instance's handle
                handle = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            return int(nv.nvmlDeviceGetIndex(handle))
        except Exception:  # noqa: BLE001 - an unknown UUID: CUDA itself would see no GPU
            return 0
        finally:
            nv.nvmlShutdown()
    return 0


def read_gpu(index: int = 0) -> GpuState | None:
    """The GPU's name, memory and compute processes, or None where NVML is unavailable.
    With TUNER_SIM_NVML set, the simulated card of that file (tuner.sim.nvml)."""
    if os.environ.get("TUNER_SIM_NVML"):
        from tuner.sim.nvml import read_state  # the simulated card imports this module
        return read_state(Path(os.environ["TUNER_SIM_NVML"]), index)
    nv = _nvml()
    if nv is None:
        return None
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
        name = nv.nvmlDeviceGetName(handle)
        procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
        return GpuState(index=index, name=name.decode() if isinstance(name, bytes) else str(name),
                        total_bytes=int(mem.total), used_bytes=int(mem.used),
                        pids=tuple(int(p.pid) for p in procs))
    except Exception as exc:  # noqa: BLE001 - NVML raises its own error type per failure
        raise UsageError(f"cannot read GPU {index} through NVML: {exc}") from None
    finally:
        nv.nvmlShutdown()


@contextmanager
def used_reader(index: int) -> Iterator[Callable[[], int | None]]:
    """A cheap repeated read of GPU `index`'s used bytes (NVML initialised once, for a poller;
    the simulated card's file with TUNER_SIM_NVML); it reads None where there is no NVML."""
    if os.environ.get("TUNER_SIM_NVML"):
        yield lambda: (s.used_bytes if (s := read_gpu(index)) is not None else None)
        return
    nv = _nvml()
    if nv is None:
        yield lambda: None
        return
    try:
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # noqa: BLE001 - no such card: nothing to watch, as without NVML
            yield lambda: None
            return
        yield lambda: int(nv.nvmlDeviceGetMemoryInfo(handle).used)
    finally:
        nv.nvmlShutdown()


def wait_until_free(
    index: int,
    baseline_used: int,
    timeout_s: float,
    slack_bytes: int = 512 * 2**20,
    poll_s: float = 1.0,
    known_pids: tuple[int, ...] = (),
) -> GpuState | None:
    """Wait until no compute process but `known_pids` (the tuner's own ballast, as NVML names
    it) holds GPU `index` and its memory is back near baseline."""
    deadline = time.monotonic() + timeout_s
    state = read_gpu(index)
    while state is not None:
        if (
            not set(state.pids) - set(known_pids)
            and state.used_bytes <= baseline_used + slack_bytes
        ):
            return state
        if time.monotonic() > deadline:  # the machine's state, not the input: exit 3, re-queued
            raise FaultError(
                f"GPU {index} is busy after {timeout_s:.0f} s: processes {list(state.pids)}, "
                f"{state.used_bytes / 2**20:.0f} MiB used (idle baseline "
                f"{baseline_used / 2**20:.0f} MiB); stop them or raise --gpu-wait")
        time.sleep(poll_s)
        state = read_gpu(index)
    return None


def foreign_pids(index: int, known_pids: tuple[int, ...] = (), settle_s: float = 1.0,
                 poll_s: float = 0.25) -> tuple[int, ...]:
    """Processes other than `known_pids` on GPU `index` right after a trial's server stopped.

    The server's group is gone by then; a process the driver still lists a moment later (its
    context is being torn down) is given `settle_s` to leave.  What stays is someone else's:
    it held part of the card while the trial ran, so the trial measured the wrong thing.
    """
    deadline = time.monotonic() + settle_s
    while True:
        state = read_gpu(index)
        left = tuple(sorted(set(state.pids) - set(known_pids))) if state is not None else ()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(poll_s)
