"""Capacity search against a running server over HTTP (`tuner tune` trials, `tuner bench`).

Each load step is one open-loop cell through the ordinary runner, so its numbers are the ones a
cell would report; `SloWatch` ends a step as soon as its SLOs are lost and the runner cancels
the open streams (a server that stops work for a gone client, as vLLM and the simulator do,
is then idle again for the next step).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

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
from tuner.bench.records import Cell, RequestRecord
from tuner.bench.runner import CUT_SHORT, FATAL, CellWatch, run_cells


def _watch_factory(make_verdict: Callable[[], SloWatch]) -> Callable[[], CellWatch]:
    def make() -> CellWatch:
        watch = make_verdict()
        seen: set[int] = set()

        def check(records: list[RequestRecord], waiting_ms: list[float]) -> bool:
            for rec in records:
                if rec.ok and id(rec) not in seen and rec.completion_tokens is not None:
                    seen.add(id(rec))
                    watch.done(per_request_ms(rec))
            return watch.lost(waiting_ms)

        return check

    return make


def http_capacity(url: str, cell: Cell, spec: CapacitySpec, slo: Mapping[str, float],
                  seed: int = 0, **options: Any) -> CapacityResult:
    """Capacity of `cell`'s traffic on the server at `url`; `options` are run_cells' (model_name,
    api, request_extra, tokenizer_dir, health_url, stall_timeout_s)."""
    limits = slo_limits(slo)
    count = [0]

    def measure(rate: float) -> LoadStep:
        count[0] += 1
        step = step_cell(cell, rate, spec.step_requests)
        verdicts: list[SloWatch] = []

        def verdict() -> SloWatch:
            verdicts.append(SloWatch(spec.step_requests, limits, 1e3 * spec.step_requests / rate))
            return verdicts[-1]

        results = run_cells(url, [step], seed=seed + count[0], warmup=None,
                            watch=_watch_factory(verdict), **options)
        res = results[0]
        cut = res.error_class == CUT_SHORT
        kept = [r for r in res.records if r.error_class != CUT_SHORT]  # not the aborted ones
        saturated = any(v.saturated for v in verdicts) or is_saturated(
            [r.send_time for r in kept],
            [r.token_times[0] if r.token_times else None for r in kept])
        ok = res.error_class is None and not saturated and passes(res.metrics, limits)
        return LoadStep(rate, res.metrics, ok, cut, saturated, res.duration_s, len(res.records),
                        fatal=res.error_class in FATAL)

    return find_capacity(measure, spec)
