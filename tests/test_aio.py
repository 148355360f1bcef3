"""The cancellation-safe waits that ended the client hang after broken streams (issue 20)."""

import asyncio

from tuner.aio import cancel_and_wait, wait_event


async def _kicked_while_cancelled(wait) -> bool:
    """A loop that waits on an event, as the health watch does, is cancelled in the same loop
    iteration as the event fires (a broken stream kicks the watch as its cell ends): -> whether
    the cancellation ended it."""
    event = asyncio.Event()

    async def watch() -> None:
        while True:
            await wait(event, 10.0)
            event.clear()

    task = asyncio.create_task(watch())
    await asyncio.sleep(0)
    event.set()
    task.cancel()
    await asyncio.wait({task}, timeout=0.5)
    stopped = task.done()
    task.cancel()
    await asyncio.wait({task}, timeout=0.5)
    return stopped


def test_wait_event_never_swallows_a_cancellation():
    assert asyncio.run(_kicked_while_cancelled(wait_event))


def test_wait_event_returns_on_the_event_or_the_timeout():
    async def go() -> tuple[bool, bool]:
        event = asyncio.Event()
        asyncio.get_running_loop().call_later(0.01, event.set)
        return await wait_event(event, 5.0), await wait_event(asyncio.Event(), 0.01)

    assert asyncio.run(go()) == (True, False)


def test_cancel_and_wait_cancels_again_a_task_that_swallowed_the_first():
    async def go() -> int:
        cancels = 0

        async def stubborn() -> None:
            nonlocal cancels
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    cancels += 1
                    if cancels == 2:
                        raise

        async def failing() -> None:
            raise RuntimeError("retrieved, not logged")

        tasks = [asyncio.create_task(stubborn()), asyncio.create_task(failing())]
        await asyncio.sleep(0)
        await cancel_and_wait(tasks)
        assert all(t.done() for t in tasks)
        return cancels

    assert asyncio.run(go()) == 2
