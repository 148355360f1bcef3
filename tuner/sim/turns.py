"""Multi-turn traffic on the in-process simulator, turn after answer (tuner.bench.turns says
which turn goes next, as it does for the HTTP client): a follow-up arrives when the answer before
it ended, and its blocks hash as that answer's, so the engine's prefix cache reuses the history.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from tuner.bench.records import Cell
from tuner.bench.sources import RequestSpec
from tuner.bench.turns import Turn, TurnQueue
from tuner.sim.engine import Engine, SimRequest
from tuner.sim.prefix_cache import segment_block_hashes

Watch = Callable[[list[SimRequest], float], bool]  # (requests so far, clock) -> stop now


class ChatFeed:
    """A multi-turn cell's requests: the queue, and when each ready turn may arrive."""

    def __init__(self, specs: Sequence[RequestSpec], cell: Cell, template: int,
                 block_size: int) -> None:
        self.queue = TurnQueue(specs, None if cell.request_rate else cell.concurrency)
        self.template = template
        self.block_size = block_size  # 0: no prefix caching
        self.turn_of: dict[int, tuple[int, int]] = {}  # request id -> (conversation, turn)
        self._asked: dict[int, Turn] = {}               # request id -> its turn, until answered
        self._not_before: dict[Turn, float] = {}        # a ready turn: when it became ready

    def open(self, at: float) -> None:
        self._not_before[self.queue.open()] = at

    def submit(self, engine: Engine, slot_free: float) -> SimRequest:
        """Send the next ready turn; it arrives when it became ready (or a slot freed)."""
        turn = self.queue.pop()
        assert turn is not None
        at = max(self._not_before.pop(turn, slot_free), slot_free)
        req = engine.submit(turn.spec.input_len + self.template, turn.spec.output_len, at,
                            self._hashes(turn))
        self._asked[req.rid] = turn
        self.turn_of[req.rid] = (turn.serial, turn.index)
        if req.finished:
            self.answered([req])
        return req

    def answered(self, done: Sequence[SimRequest]) -> None:
        for req in done:
            turn = self._asked.pop(req.rid, None)
            if turn is None:
                continue
            nxt = self.queue.answered(turn, req.error is None)
            if nxt is not None:
                self._not_before[nxt] = req.token_times[-1] if req.token_times else req.arrival

    def _hashes(self, turn: Turn) -> tuple[int, ...]:
        """The blocks of the prompt and of the answer, as the follow-up's prompt holds it."""
        if not self.block_size or not turn.spec.segments:
            return ()
        answer = self.queue.answer_segment(turn)
        segs = (("<template>", self.template), *turn.spec.segments, *([answer] if answer else []))
        return tuple(segment_block_hashes(segs, self.block_size))


def drive_turns(engine: Engine, cell: Cell, feed: ChatFeed, rng: np.random.Generator,
                watch: Watch | None = None) -> tuple[list[SimRequest], bool]:
    """Run a multi-turn cell on `engine`: -> (the requests sent, whether `watch` cut it)."""
    start = engine.clock
    limit = cell.num_prompts if cell.num_prompts is not None else math.inf
    if limit == math.inf and cell.duration_s is None:
        limit = cell.concurrency
    stop = start + cell.duration_s if cell.duration_s is not None else math.inf
    rate = cell.request_rate / feed.queue.mean_turns if cell.request_rate else None
    next_open = start + rng.exponential(1.0 / rate) if rate else math.inf
    reqs: list[SimRequest] = []
    in_flight, slot_free = 0, start
    while engine.failed is None:
        if next_open <= min(engine.clock, stop) and len(reqs) < limit:
            feed.open(next_open)
            next_open += rng.exponential(1.0 / rate) if rate else math.inf
            continue
        if len(reqs) < limit and in_flight < cell.concurrency and feed.queue.ready and \
                slot_free <= stop:
            req = feed.submit(engine, slot_free)
            reqs.append(req)
            in_flight += not req.finished
            continue
        until = next_open if next_open <= stop and len(reqs) < limit else math.inf
        if in_flight == 0 and until == math.inf:
            break
        full = in_flight == cell.concurrency
        done = engine.advance(until)
        feed.answered(done)
        in_flight -= len(done)
        if done and full:
            slot_free = engine.clock
        if watch is not None and watch(reqs, engine.clock):
            return reqs, True
    return reqs, False
