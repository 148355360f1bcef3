"""Run one config on the simulator both ways: over HTTP (`tuner tune --simulate`) and in-process
(the benchmarks), and say how far apart the two are.

The benchmarks measure the search on the in-process simulator; users run the same search over
HTTP.  If the two disagreed, the benchmarks would measure a different search than users run, so
this is checked (tests/test_sim_agreement.py, benchmarks/sim_http_agreement.py).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tuner.trial.context import TrialContext
from tuner.trial.inprocess import InProcessRunner
from tuner.trial.result import TrialResult
from tuner.trial.run import run_trial

METRICS = ("output_throughput", "p99_ttft_ms", "p99_tpot_ms")
# The stated agreement: relative difference of each metric, per cell and for the whole matrix.
# What is left is sim_t rounded to the microsecond on the wire.
TOLERANCE = 1e-3


@dataclass(frozen=True)
class Agreement:
    """One config both ways: outcomes, and the relative difference |http / in-process - 1| of each
    metric, for the whole matrix and worst over cells (empty when a side did not run ok)."""

    http: str
    inprocess: str
    matrix: dict[str, float]
    worst_cell: dict[str, float]

    @property
    def ok(self) -> bool:
        return self.http == self.inprocess and all(
            v <= TOLERANCE for v in (*self.matrix.values(), *self.worst_cell.values()))


def relative(a: float, b: float) -> float:
    """|a / b - 1|, with two zeros agreeing."""
    if b == 0:
        return 0.0 if a == 0 else float("inf")
    return abs(a / b - 1.0)


def compare(ctx: TrialContext, params: dict[str, Any], time_scale: float = 25.0) -> Agreement:
    """Run `params` over HTTP at `time_scale` and in-process; `ctx.simulate` names the card."""
    assert ctx.simulate is not None, "compare() needs a simulated GPU profile"
    inproc = InProcessRunner(ctx.simulate, seed=0)(ctx, params, Path("/nonexistent"))
    with tempfile.TemporaryDirectory(prefix="tuner-crosscheck-") as tmp:
        http = run_trial(replace(ctx, time_scale=time_scale), params, Path(tmp) / "trial")
    if http.outcome.kind != "ok" or inproc.outcome.kind != "ok":
        return Agreement(http.outcome.kind, inproc.outcome.kind, {}, {})
    return Agreement("ok", "ok", _diffs(http.metrics, inproc.metrics), _worst_cell(http, inproc))


def _diffs(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {m: relative(a[m], b[m]) for m in METRICS}


def _worst_cell(http: TrialResult, inproc: TrialResult) -> dict[str, float]:
    worst = dict.fromkeys(METRICS, 0.0)
    for a, b in zip(http.cells, inproc.cells, strict=True):
        for m, d in _diffs(a["metrics"], b["metrics"]).items():
            worst[m] = max(worst[m], d)
    return worst
