"""Multi-turn traffic over HTTP, turn after answer (tuner.bench.turns says which turn goes
next, and how `request_rate` and `concurrency` shape it): each turn's request is built when it is
sent, from the conversation's messages so far, and the answer's text, collected from the stream's
events, joins them as the assistant's message.  Chat requests carry the messages (system prompt,
then user and assistant turns); completion requests their texts joined.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import random
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tuner.aio import cancel_and_wait
from tuner.bench.client import EventHook, StreamClient
from tuner.bench.pacing import SendClock
from tuner.bench.prompts import PromptMaker, render_prompt
from tuner.bench.records import RequestRecord
from tuner.bench.sources import RequestSpec
from tuner.bench.texts import TextCollector
from tuner.bench.turns import Turn, TurnQueue

if TYPE_CHECKING:
    from tuner.bench.runner import _CellRun


class AnswerTap(TextCollector):
    """The client's event hook for a multi-turn cell: keeps each request's answer text (the
    caller's own hook, `inner`, still sees every event)."""

    def __init__(self, inner: EventHook | None) -> None:
        super().__init__()
        self.inner = inner

    def __call__(self, record: RequestRecord, data: str, arrival: float) -> None:
        if self.inner is not None:
            self.inner(record, data, arrival)
        super().__call__(record, data, arrival)

    def take(self, record: RequestRecord) -> str:
        """`record`'s answer, forgotten here once taken."""
        return "".join(self._parts.pop(id(record), []))


class Chats:
    """A multi-turn cell's traffic over HTTP: the queue, each open conversation's messages, and
    the request bytes of a turn (built when it is sent: it holds the answers before it)."""

    def __init__(self, specs: Sequence[RequestSpec], client: StreamClient, maker: PromptMaker,
                 rng: random.Random, sessions: int | None,
                 headers: Mapping[str, str] | None = None) -> None:
        self.queue = TurnQueue(specs, sessions)
        self.client = client
        self.maker = maker
        self.rng = rng
        self.headers = headers
        self.shared: dict[tuple[str, int], str] = {}
        self.history: dict[int, list[dict[str, str]]] = {}  # open conversation -> messages

    def _text(self, segments: Sequence[tuple[str, int]]) -> str:
        n = sum(k for _, k in segments)
        return render_prompt(RequestSpec(n, 0, segments=tuple(segments)), self.maker, self.rng,
                             self.shared)

    def payload(self, turn: Turn) -> bytes:
        """Turn 0: the system prompt and the first question; later turns: the history (which
        ends with the last answer) and the turn's new question, its last segment."""
        segs = turn.spec.segments
        if turn.index == 0:
            messages = [{"role": "system", "content": self._text(segs[:1])}] if len(segs) > 1 \
                else []
            messages.append({"role": "user", "content": self._text(segs[len(messages):])})
        else:
            messages = [*self.history[turn.serial],
                        {"role": "user", "content": self._text(segs[-1:])}]
        self.history[turn.serial] = messages
        body: dict[str, Any] = self.client.body("", turn.spec.output_len)
        if "messages" in body:
            body["messages"] = messages
        else:
            body["prompt"] = " ".join(m["content"] for m in messages)
        return self.client.pool.request_bytes(self.client.path, json.dumps(body).encode(),
                                              self.headers)

    def answered(self, turn: Turn, record: RequestRecord, answer: str) -> None:
        if record.ok and not turn.last:
            self.history[turn.serial].append({"role": "assistant", "content": answer})
        else:
            del self.history[turn.serial]
        self.queue.answered(turn, record.ok)


async def _send(run: _CellRun, chats: Chats, tap: AnswerTap, turn: Turn,
                changed: asyncio.Event) -> None:
    data = chats.payload(turn)
    run.payloads[:] = [data]  # read by run.one before its first await: no other send between
    k = len(run.records)
    await run.one(0)
    record = run.records[k]
    record.turn_of = (turn.serial, turn.index)
    chats.answered(turn, record, tap.take(record))
    changed.set()


async def _next_turn(chats: Chats, tasks: set[asyncio.Task], changed: asyncio.Event,
                     opener: asyncio.Task | None) -> Turn | None:
    """The next ready turn, waiting for an answer (or a conversation to open) when none is;
    None when none can come: nothing in flight and no conversation left to open."""
    while (turn := chats.queue.pop()) is None:
        if not tasks and (opener is None or opener.done()):
            return None
        changed.clear()
        await changed.wait()
    return turn


async def _opener(chats: Chats, rate: float, rng: random.Random, time_scale: float,
                  changed: asyncio.Event) -> None:
    """Open loop: open conversations as a Poisson process of `rate` per second."""
    clock = SendClock()
    due = time.perf_counter()
    try:
        while True:
            due += rng.expovariate(rate) / time_scale
            await clock.sleep_until(due)
            chats.queue.open()
            changed.set()
    finally:
        clock.close()


def _done(sem: asyncio.Semaphore, tasks: set[asyncio.Task], task: asyncio.Task) -> None:
    sem.release()
    tasks.discard(task)


async def conversation_loop(run: _CellRun, chats: Chats, deadline: float | None,
                            rng: random.Random, time_scale: float) -> None:
    """Drive a multi-turn cell: `num_prompts` requests (or until `deadline`), turn after answer,
    at most `concurrency` in flight."""
    sem = asyncio.Semaphore(run.cell.concurrency)
    tasks: set[asyncio.Task] = set()
    changed = asyncio.Event()
    tap = AnswerTap(run.client.on_event)
    run.client.on_event = tap
    rate = run.cell.request_rate
    opener = asyncio.create_task(_opener(chats, rate / chats.queue.mean_turns, rng, time_scale,
                                         changed)) if rate else None
    try:
        for i in itertools.count():
            if run.cell.num_prompts is not None and i >= run.cell.num_prompts:
                break
            await sem.acquire()
            turn = await _next_turn(chats, tasks, changed, opener)
            if turn is None or run.stop.is_set() or (
                    deadline is not None and time.perf_counter() >= deadline):
                break
            task = asyncio.create_task(_send(run, chats, tap, turn, changed))
            tasks.add(task)
            task.add_done_callback(functools.partial(_done, sem, tasks))
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        run.client.on_event = tap.inner
        await cancel_and_wait([*tasks, *([opener] if opener else [])])
