"""When a request reaches the simulated engine over HTTP: wall-clock jitter must not count.

The HTTP server paces the engine at `time_scale` simulated seconds per wall second, so a client's
few milliseconds of reaction (read the last token, send the next request) became 25x that in
simulated time at --time-scale 25.  Measured on Llama-3.1-8B / H100, con=8 in=3000: the eight
requests of a cell's first wave arrived over 37 simulated ms, the first one was prefilled alone,
and with decode-first the other seven waited for its whole decode (-16% tok/s, +59% p99 TTFT
against the in-process simulator); replacements arrived 150 simulated ms after the request they
replace finished.  A real client's reaction is that same millisecond at 1x, and the in-process
simulator (what the benchmarks run) takes it as zero.

So a closed-loop client says what it will do (header `X-Tuner-Sim-Plan: ID STREAMS REQUESTS`:
STREAMS requests in flight, REQUESTS in all, 0 if unknown), and the engine holds its next decision
for the requests it knows are on their way, stamping them with the simulated time they were due:

- the first request of a plan opens its first wave: the engine waits for the other STREAMS - 1,
  and all of them arrive at the first one's time;
- a step that finishes requests of a plan is followed by one request per finished one (while the
  plan has requests left): the engine waits for them at the step's end, their arrival time.

Simulated time keeps its wall-clock pace during a hold; the engine only lags and then catches up,
so every stamp is still causal (never before a step already decided).  A hold gives up after
`HOLD_S` of wall time (a client that died, or a plan without a known total at its end); requests
of a plan that arrive after their hold gave up are counted in `late`.  Requests without a plan
(open loop, plain clients) arrive at the wall-clock time, as before.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from tuner.aio import wait_event

PLAN_HEADER = "X-Tuner-Sim-Plan"
# Wall seconds a hold waits at most: far above a loopback round trip on a loaded machine (a few
# ms; it only runs out when a client is gone, or at the end of a plan without a known total).
HOLD_S = 0.2


@dataclass
class Plan:
    streams: int
    total: int | None   # None: unknown (a cell limited by duration)
    received: int = 0
    early: int = 0      # arrived while no hold waited for them (see Admission.arrive)


@dataclass
class Hold:
    plan: str
    at: float           # simulated arrival time of the requests it waits for
    expected: int
    deadline: float     # wall clock (perf_counter)


def parse_plan(value: str | None) -> tuple[str, int, int | None] | None:
    """`ID STREAMS REQUESTS` -> (id, streams, total or None); None when absent or malformed."""
    parts = (value or "").split()
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit() or int(parts[1]) < 1:
        return None
    return parts[0], int(parts[1]), int(parts[2]) or None


class Admission:
    """Arrival stamps and engine holds for closed-loop plans (see the module docstring)."""

    def __init__(self) -> None:
        self.plans: dict[str, Plan] = {}
        self.hold: Hold | None = None
        self.late = 0
        self._owner: dict[int, str] = {}  # engine request id -> plan id
        self._wake = asyncio.Event()

    def arrive(self, header: str | None, sim_now: float) -> tuple[float, str | None]:
        """-> (simulated arrival time, plan id) of a request that reached the server now."""
        parsed = parse_plan(header)
        if parsed is None:
            return sim_now, None
        pid, streams, total = parsed
        plan = self.plans.get(pid)
        if plan is None:
            plan = self.plans[pid] = Plan(streams, total)
            if streams > 1:
                self._start(pid, sim_now, streams - 1, time.perf_counter())
            plan.received += 1
            return sim_now, pid
        plan.received += 1
        hold = self.hold
        if hold is not None and hold.plan == pid:
            hold.expected -= 1
            if hold.expected <= 0:
                self._release()
            return hold.at, pid
        # No hold waits for it: its hold gave up (a slow client), or the request it replaces
        # failed on the client's side (a broken stream) before the engine finished it.  Either
        # way it has arrived: the hold that finishing request starts must not wait for it.
        self.late += 1
        plan.early += 1
        return sim_now, pid

    def track(self, rid: int, pid: str | None) -> None:
        if pid is not None:
            self._owner[rid] = pid

    def finished(self, rids: list[int], at: float, due_wall: float) -> bool:
        """Requests finished at simulated time `at` (due at wall `due_wall`); True when the engine
        must now wait for their plan's next requests."""
        counts: dict[str, int] = {}
        for rid in rids:
            pid = self._owner.pop(rid, None)
            if pid is not None:
                counts[pid] = counts.get(pid, 0) + 1
        for pid, n in counts.items():
            plan = self.plans[pid]
            left = n if plan.total is None else min(n, plan.total - plan.received)
            credit = min(left, plan.early)
            plan.early -= credit
            left -= credit
            if left > 0:
                self._start(pid, at, left, max(due_wall, time.perf_counter()))
                return True
        return False

    def holding(self) -> bool:
        """Whether the engine must not decide its next step yet."""
        if self.hold is not None and time.perf_counter() >= self.hold.deadline:
            self._release()
        return self.hold is not None

    async def wait(self, timeout: float) -> None:
        """Sleep up to `timeout`, waking as soon as a hold is released."""
        await wait_event(self._wake, timeout)
        self._wake.clear()

    def _start(self, pid: str, at: float, expected: int, from_wall: float) -> None:
        self.hold = Hold(pid, at, expected, from_wall + HOLD_S)

    def _release(self) -> None:
        self.hold = None
        self._wake.set()
