"""Open-loop sends on time: Poisson arrivals or a trace's own offsets, each request written when
the schedule says, within a fraction of a millisecond.

Where late sends came from (benchmarks/trace_fidelity.py, 50 req/s on 2 shared cores), and what
is done about each:

- asyncio's timers wake up to a millisecond late (epoll's timeout is in whole ms), so the old
  loop spun the last 2 ms before each send.  A process that spins is a CPU hog to the kernel's
  scheduler: on a busy machine it lost its slice mid-spin and the send waited a whole slice
  (~4 ms).  Here a timerfd (Linux) wakes the loop at the absolute send time to the microsecond,
  so the process sleeps until `LEAD_S` before the send and spins only that short tail.
- a send used to start in a task created after the wake-up, one more loop iteration (other
  streams' reads) later; now the request's task exists before its time and sends from its own
  spin, in the same step as the clock check.
- a full garbage collection of a benchmark's objects took up to 60 ms; during an open-loop cell
  the objects that exist before it are frozen out of collection and the collector is paused,
  then everything is collected once the cell ends.
- asking the kernel for a short scheduler slice (Linux 6.12+ sched_setattr) so that wake-ups
  preempt CPU-bound neighbours sooner was tried and measured: no better, p50 and p99 slightly
  worse (benchmarks/README.md), so it is not done.

What stays out of our hands is CPU starvation by other processes (more runnable work than
cores): `benchmarks/trace_fidelity.py` reports the client's run-queue wait next to the send error.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import itertools
import os
import random
import struct
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from tuner.aio import cancel_and_wait

if TYPE_CHECKING:
    from tuner.bench.runner import _CellRun

# How long before a send its task stops sleeping and spins on the clock: covers the two loop
# iterations between the timer firing and the task running (tens to hundreds of microseconds).
LEAD_S = 0.0005
# Without a timerfd, asyncio's timers wake up to a millisecond late: spin longer.
COARSE_LEAD_S = 0.002
SPARE_CONNECTIONS = 2  # idle connections an open loop keeps ready (see ConnectionPool.top_up)
_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK, _TFD_CLOEXEC, _TFD_TIMER_ABSTIME = os.O_NONBLOCK, os.O_CLOEXEC, 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    """libc with timerfd, when perf_counter() is CLOCK_MONOTONIC (Linux): else None."""
    if not sys.platform.startswith("linux") or \
            "CLOCK_MONOTONIC" not in time.get_clock_info("perf_counter").implementation:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create  # noqa: B018 -- raises AttributeError when absent
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


class SendClock:
    """Sleeps until an absolute `perf_counter()` time: on a timerfd read by the event loop
    where there is one, else on asyncio's timer.  One waiter at a time (the open loop's
    dispatcher)."""

    def __init__(self) -> None:
        self.lead_s = COARSE_LEAD_S
        self._fd = -1
        self._waiter: asyncio.Future | None = None
        if _LIBC is not None:
            fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self._fd, self.lead_s = fd, LEAD_S
                asyncio.get_running_loop().add_reader(fd, self._fired)

    async def sleep_until(self, t: float) -> None:
        if t <= time.perf_counter():
            return
        if self._fd < 0:
            await asyncio.sleep(t - time.perf_counter())
            return
        assert _LIBC is not None
        sec = int(t)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, int((t - sec) * 1e9)))
        if _LIBC.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            await asyncio.sleep(t - time.perf_counter())
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _fired(self) -> None:
        with contextlib.suppress(BlockingIOError):
            struct.unpack("Q", os.read(self._fd, 8))
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        if self._fd >= 0:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No garbage collection while the schedule runs: what exists before is frozen (a later
    full collection need not walk it), the collector is paused, and after the cell it runs once
    and the frozen objects are handed back."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
        gc.collect()


def _arrival(run: _CellRun, i: int, rng: random.Random, prev: float) -> float:
    """Seconds from the cell's start to request i: the trace's (repeated past its end), or the
    previous arrival plus an exponential gap."""
    if run.arrivals is None:
        assert run.cell.request_rate is not None
        return prev + rng.expovariate(run.cell.request_rate)
    span = run.arrivals[-1] + 1e-3
    return (i // len(run.arrivals)) * span + run.arrivals[i % len(run.arrivals)]


async def _send_at(run: _CellRun, i: int, due: float) -> None:
    """Spin the last stretch to `due`, then send from this same step: no loop iteration
    (other streams' reads) between the clock check and the write."""
    while time.perf_counter() < due:
        await asyncio.sleep(0)
    if not run.stop.is_set():
        await run.one(i)


def _done(sem: asyncio.Semaphore, tasks: set[asyncio.Task], task: asyncio.Task) -> None:
    """A request of an open-loop cell ended: free its slot."""
    sem.release()
    tasks.discard(task)


async def open_loop(
    run: _CellRun, deadline: float | None, rng: random.Random, time_scale: float
) -> None:
    """Send the cell's requests at their arrival times (Poisson at `request_rate`, or the
    trace's offsets divided by `time_scale`), at most `concurrency` in flight: a request due
    while every slot is busy goes when one frees."""
    sem = asyncio.Semaphore(run.cell.concurrency)
    tasks: set[asyncio.Task] = set()
    clock = SendClock()
    offset = 0.0
    try:
        with paused_gc():
            t0 = time.perf_counter()
            for i in itertools.count():
                if run.cell.num_prompts is not None and i >= run.cell.num_prompts:
                    break
                offset = _arrival(run, i, rng, offset)
                due = t0 + offset / time_scale
                await clock.sleep_until(due - clock.lead_s)
                if run.stop.is_set() or (deadline is not None and due >= deadline):
                    break
                await sem.acquire()
                task = asyncio.create_task(_send_at(run, i, due))
                tasks.add(task)
                task.add_done_callback(functools.partial(_done, sem, tasks))
                spare = asyncio.create_task(run.client.pool.top_up(SPARE_CONNECTIONS))
                tasks.add(spare)
                spare.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
    finally:
        clock.close()
        await cancel_and_wait(tasks)
