"""One knob at a time around a chosen config: which knobs does the server actually read?

The study's own trials change many knobs at once, so with a dozen trials the fANOVA check
(tuner.output.knob_check) cannot tell a dead knob from a weak one.  An ablation can: the chosen
config is run
`repeats` times to measure the run-to-run noise, then once per variant that changes a single knob
to another value of its range.  A knob whose every variant runs healthy and moves no objective
metric by more than the noise band (at least `floor`) had no effect: the server likely ignores it
(the seed report's INFINILM_* variables against an unpatched InfiniLM, a typo in an env name).
The verdict holds around this config on this workload: a guard that only acts on long prompts
shows no effect on a workload without them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.search.space import Param
from tuner.trial.context import TrialContext
from tuner.trial.result import TrialResult
from tuner.trial.run import run_trial

Runner = Callable[[TrialContext, dict[str, Any], Path], TrialResult]
NO_EFFECT = "no effect"


@dataclass
class Variant:
    knob: str
    value: Any
    outcome: str
    change: dict[str, float]     # metric -> relative change from the base median


@dataclass
class AblationReport:
    metrics: list[str]
    base_runs: list[dict[str, float]]
    noise: dict[str, float]      # metric -> largest relative deviation among the base runs
    band: dict[str, float]       # metric -> the change a knob must exceed to count
    variants: list[Variant] = field(default_factory=list)

    def verdict(self, knob: str) -> str:
        mine = [v for v in self.variants if v.knob == knob]
        if not mine:
            return "not varied"
        if any(v.outcome != "ok" for v in mine):
            return "effect (changes the outcome)"
        moved = any(abs(v.change.get(m, 0.0)) > self.band[m] for v in mine for m in self.metrics)
        return "effect" if moved else NO_EFFECT


def alternatives(p: Param, value: Any, limit: int = 2) -> list[Any]:
    """Other values of the knob to try: the far ends of its range, or other choices."""
    if p.type == "bool":
        return [not bool(value)]
    if p.type == "categorical":
        return [c for c in p.choices if c != value][:limit]
    low, high = p.bounds
    if p.type == "int":
        return [x for x in dict.fromkeys((int(low), int(high))) if x != value][:limit]
    return [x for x in dict.fromkeys((low, high)) if x != value][:limit]


def _median(runs: list[dict[str, float]], metric: str) -> float:
    return statistics.median(r[metric] for r in runs)


def _rel(a: float, b: float) -> float:
    return (a - b) / abs(b) if b else (0.0 if a == b else float("inf"))


def ablate(  # noqa: PLR0913
    ctx: TrialContext,
    base: dict[str, Any],
    knobs: list[Param],
    metrics: list[str],
    trial_root: Path,
    repeats: int = 2,
    floor: float = 0.02,
    per_knob: int = 2,
    runner: Runner = run_trial,
    log: Callable[[str], None] = lambda line: None,
) -> AblationReport:
    """Run the base config `repeats` times, then each single-knob variant (up to `per_knob`
    values per knob) once."""
    base_runs = []
    for i in range(repeats):
        res = runner(ctx, base, trial_root / f"base-{i}")
        log(f"base run {i}: {res.outcome.kind}")
        if res.outcome.kind != "ok":
            raise RuntimeError(f"the base config did not run healthy ({res.outcome.reason})")
        base_runs.append({m: res.metrics[m] for m in metrics})
    centre = {m: _median(base_runs, m) for m in metrics}
    noise = {m: max(abs(_rel(r[m], centre[m])) for r in base_runs) for m in metrics}
    band = {m: max(floor, 2 * noise[m]) for m in metrics}
    report = AblationReport(metrics, base_runs, noise, band)
    for p in knobs:
        for value in alternatives(p, base.get(p.name, p.default), limit=per_knob):
            params = {**base, p.name: value}
            res = runner(ctx, params, trial_root / f"{p.name}={value}")
            change = ({m: _rel(res.metrics[m], centre[m]) for m in metrics}
                      if res.outcome.kind == "ok" else {})
            report.variants.append(Variant(p.name, value, res.outcome.kind, change))
            log(f"{p.name}={value}: {res.outcome.kind} "
                + " ".join(f"{m} {c:+.1%}" for m, c in change.items()))
    return report
