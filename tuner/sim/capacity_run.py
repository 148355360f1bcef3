"""Capacity search on an in-process simulated server: load steps on one running engine.

The steps share the engine as they would share a real server (its prefix cache stays warm
between steps); a step that `SloWatch` gives up on is cut at once and what it left queued or
running is aborted, as clients that hang up.  Cost is simulated seconds, what the steps would
have taken on the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tuner.bench.capacity import (
    CapacityResult,
    CapacitySpec,
    LoadStep,
    SloWatch,
    find_capacity,
    is_saturated,
    passes,
    slo_limits,
    step_cell,
)
from tuner.bench.metrics import per_request_ms
from tuner.bench.records import Cell
from tuner.sim.api import RequestFeed, Watch, run_cell, to_record
from tuner.sim.engine import Engine, SimRequest
from tuner.sim.prompts import CHAT_TEMPLATE_TOKENS


def slo_watch(watch: SloWatch) -> Watch:
    """A run_cell watch that stops the step once `watch` gives it up."""
    seen: set[int] = set()

    def check(reqs: list[SimRequest], clock: float) -> bool:
        waiting = []
        for r in reqs:
            if r.finished and r.rid not in seen and r.token_times:
                seen.add(r.rid)
                watch.done(per_request_ms(to_record(r, None)))
            elif not r.finished and not r.token_times:
                waiting.append((clock - r.arrival) * 1e3)
        return watch.lost(waiting)

    return check


def measure_step(engine: Engine, cell: Cell, rate: float, spec: CapacitySpec,
                 limits: Mapping[str, tuple[str, float, float]], seed: int, api: str = "chat",
                 cut_short: bool = True) -> LoadStep:
    """One load step at `rate`; `cut_short=False` runs it to the end (a plain sweep)."""
    step = step_cell(cell, rate, spec.step_requests)
    template = CHAT_TEMPLATE_TOKENS if api == "chat" else 0
    feed = RequestFeed(step, seed, template, engine.cfg.block_size, engine.cache.enabled)
    verdict = SloWatch(spec.step_requests, limits, 1e3 * spec.step_requests / rate)
    inner = slo_watch(verdict) if cut_short else None
    fired: list[bool] = []

    def watch(reqs: list[SimRequest], clock: float) -> bool:
        if inner is not None and inner(reqs, clock):
            fired.append(True)
        return bool(fired)

    before = engine.submitted
    res = run_cell(engine, step, feed, np.random.default_rng(seed), [], watch)
    cut = bool(fired)
    saturated = verdict.saturated or is_saturated([r.send_time for r in res.records],
                             [r.token_times[0] if r.token_times else None for r in res.records])
    ok = not cut and not saturated and engine.failed is None and res.metrics["failed"] == 0 \
        and passes(res.metrics, limits)
    return LoadStep(rate, res.metrics, ok, cut, saturated, res.duration_s,
                    engine.submitted - before, fatal=engine.failed is not None)


def sim_capacity(engine: Engine, cell: Cell, spec: CapacitySpec, slo: Mapping[str, float],
                 seed: int = 0, api: str = "chat") -> CapacityResult:
    """The highest rate of `cell`'s traffic at which `slo` (p99/p90 TTFT, TPOT, E2EL) holds."""
    limits = slo_limits(slo)
    counter = iter(range(1_000_000))
    return find_capacity(
        lambda rate: measure_step(engine, cell, rate, spec, limits, seed + next(counter), api),
        spec)

