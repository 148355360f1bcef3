"""Which turn of multi-turn traffic goes next, turn after answer: turn k+1 of a conversation is
sent only once turn k's answer has ended, and its prompt is turn k's prompt, that answer and a new
question, so the server's prefix cache meets the growing history (what vLLM's and SGLang's
multi-turn benchmarks send).  Shared by the HTTP driver (tuner.bench.conversations) and the
in-process simulator (tuner.sim.turns), so both send the same traffic.

Conversations are opened from the source's list in order, and once it is used up again from its
start with fresh questions and answers (the same system prompts), so a cell may ask for more
requests than the source lists.  Closed loop (no `request_rate`): `concurrency` conversations are
open at once, like vLLM's `--num-clients`, each replaced by the next when it ends (after its last
turn, or a failed answer: the next turn would need it).  Open loop: conversations open as a
Poisson process of `request_rate / turns` per second, so that requests arrive at `request_rate`
on average and a server that cannot keep up sees conversations pile up (what a capacity search
must see), at most `concurrency` requests in flight.  Ready turns are sent first come, first
served; an answered turn's follow-up joins the back of the queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tuner.bench.sources import RequestSpec


@dataclass(frozen=True)
class Turn:
    serial: int  # the conversation: how many were opened before it in this cell
    index: int   # turn number
    spec: RequestSpec
    last: bool   # the conversation's final turn


def renew(spec: RequestSpec, epoch: int) -> RequestSpec:
    """A conversation opened again: the same system prompt (first segment), new questions and
    answers."""
    if epoch == 0 or not spec.segments:
        return spec
    head, *rest = spec.segments
    return replace(spec, segments=(head, *((f"{key}~{epoch}", n) for key, n in rest)))


def _turn_number(spec: RequestSpec) -> int:
    return spec.turn_of[1] if spec.turn_of is not None else 0


class TurnQueue:
    """The turns ready to be sent, in order.  `sessions`: closed loop, that many conversations
    open at once; None: open loop, a conversation opens at each `open()`."""

    def __init__(self, specs: Sequence[RequestSpec], sessions: int | None) -> None:
        chats: dict[int, list[RequestSpec]] = {}
        for spec in specs:
            assert spec.turn_of is not None
            chats.setdefault(spec.turn_of[0], []).append(spec)
        self.chats = [sorted(c, key=_turn_number) for _, c in sorted(chats.items())]
        self.closed = sessions is not None
        self.opened = 0
        self.ready: deque[Turn] = deque()
        for _ in range(sessions or 0):
            self.open()

    @property
    def mean_turns(self) -> float:
        return sum(map(len, self.chats)) / len(self.chats)

    def _turn(self, serial: int, index: int) -> Turn:
        epoch, chat = divmod(serial, len(self.chats))
        turns = self.chats[chat]
        return Turn(serial, index, renew(turns[index], epoch), index + 1 == len(turns))

    def open(self) -> Turn:
        """Open the next conversation: its first turn joins the queue."""
        turn = self._turn(self.opened, 0)
        self.opened += 1
        self.ready.append(turn)
        return turn

    def pop(self) -> Turn | None:
        """The next turn to send; None while no turn is ready."""
        return self.ready.popleft() if self.ready else None

    def answered(self, turn: Turn, ok: bool) -> Turn | None:
        """`turn`'s answer has ended (`ok`: completed): -> the turn it made ready (its follow-up,
        or in a closed loop the next conversation's first), None when none."""
        if ok and not turn.last:
            nxt = self._turn(turn.serial, turn.index + 1)
            self.ready.append(nxt)
            return nxt
        return self.open() if self.closed else None

    def answer_segment(self, turn: Turn) -> tuple[str, int] | None:
        """The (key, tokens) that stands for `turn`'s answer in its follow-up's prompt (None
        for a last turn): what the in-process simulator hashes the answer's KV blocks by."""
        if turn.last:
            return None
        follow = self._turn(turn.serial, turn.index + 1).spec
        n = len(turn.spec.segments)
        return follow.segments[n] if len(follow.segments) > n else None
