"""tuner.bench.pacing: the send clock never wakes early, and what a cell changes about the
process (collector, scheduler slice) is put back after it."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

from tuner.bench.pacing import SHORT_SLICE_NS, SendClock, paused_gc, short_slice


def test_send_clock_wakes_at_or_after_each_time_in_order():
    async def main() -> list[float]:
        clock = SendClock()
        try:
            late = []
            for ahead in (-0.01, 0.0, 0.002, 0.0005, 0.004):
                t = time.perf_counter() + ahead
                await clock.sleep_until(t)
                late.append(time.perf_counter() - t)
            return late
        finally:
            clock.close()

    assert all(x >= 0 for x in asyncio.run(main()))


def test_paused_gc_freezes_then_hands_everything_back():
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def _slice_ns() -> int | None:
    sched = Path("/proc/thread-self/sched")
    if not sched.exists():
        return None
    for line in sched.read_text().splitlines():
        if line.startswith("se.slice"):
            return int(line.split(":")[1])
    return None


def test_short_slice_is_asked_for_and_given_back():
    before = _slice_ns()
    with short_slice() as took:
        if took:
            assert _slice_ns() == SHORT_SLICE_NS
    assert _slice_ns() == before
