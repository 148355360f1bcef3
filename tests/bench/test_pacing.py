"""tuner.bench.pacing: the send clock never wakes early, and the collector a cell pauses is
handed back after it."""

from __future__ import annotations

import asyncio
import gc
import time

from tuner.bench.pacing import SendClock, paused_gc


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
