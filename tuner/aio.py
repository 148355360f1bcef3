"""Waiting and cancelling in asyncio without losing a cancellation.

Python 3.10 and 3.11's `asyncio.wait_for` swallows a cancellation that arrives in the same loop
iteration as the awaited result (CPython gh-86296, fixed in 3.12): the cancelled task then runs
on. The health watch waits on its kick event that way, a broken stream kicks it just as the cell
ends and cancels the watch, and the cell's final `gather` then waited for a watch that never
stopped: `run_cells` hung now and then after a broken stream. These helpers never swallow a
cancellation, and `cancel_and_wait` cancels again whatever still runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

RECANCEL_S = 1.0  # how long a cancelled task may take to end before it is cancelled again


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until `event` is set or `timeout` seconds pass; -> whether it is set."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
        await asyncio.wait({waiter})  # ends at once; leaves no pending task behind
    return event.is_set()


async def cancel_and_wait(tasks: Iterable[asyncio.Future]) -> None:
    """Cancel `tasks` and return once every one has ended; their exceptions are retrieved and
    dropped (the caller has what it needs from them, or they were cancelled mid-way)."""
    tasks = list(tasks)
    pending = set(tasks)
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    for task in tasks:
        if not task.cancelled():
            task.exception()
