"""Confirm the pick on the server before `tune` exports it.

Why: one run of a config is one sample of a noisy server.  On the H200 (round 30,
benchmarks/results/h200-transformers-3b-rag-r30) the study's pick measured p99 TTFT 3761 ms
against a 4 s SLO in its one run, then 3992, 4141 and 4188 ms in three runs after: exported on
one run, it missed its SLO in 2 of 3.  So once the study's budget is spent, the pick is run
`runs` more times.  A confirmation trial holds the medians of all its runs and replaces the
trial it re-ran wherever a pick is made (`tuner.study.record.latest`); the SLOs are judged on
every run (`tuner.study.objective.judge`).  A pick that does not hold drops out of the feasible
set and the next one is confirmed, up to `MAX_CONFIGS` configs: a cost bound, as each costs
`runs` full-matrix runs.  Confirmation runs do not count towards `--trials`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import optuna

from tuner.errors import UsageError
from tuner.output.numbers import fmt
from tuner.output.select import choose
from tuner.search.objectives import Objective
from tuner.server.outcome import Outcome
from tuner.study.objective import judge
from tuner.study.record import KV_SHARE, TrialRecord, add_confirmation, result_attrs
from tuner.trial.pipeline import AdaptivePipeline
from tuner.trial.result import TrialResult, median_metrics, more_runs

MAX_CONFIGS = 3


@dataclass(frozen=True)
class Confirmation:
    """One confirmed config: the trial re-run, the trial holding all its runs, the verdict."""

    original: int
    number: int
    outcome: str
    runs: int


def confirm_pick(study: optuna.Study, pipeline: AdaptivePipeline, runs: int, trials_dir: Path,
                 pick: str = "knee", log: Callable[[str], None] = print) -> list[Confirmation]:
    """Re-run the study's `pick` until one has `runs` + 1 runs and holds, or `MAX_CONFIGS`
    configs were tried, or nothing is feasible; what was confirmed, in order."""
    done: list[Confirmation] = []
    while runs > 0 and len(done) < MAX_CONFIGS:
        try:
            chosen = choose(study, pick).trial
        except UsageError:
            break
        if chosen.runs > runs:
            break
        result = _rerun(study, pipeline, chosen, runs + 1 - chosen.runs,
                        trials_dir / f"{chosen.number}-confirm", log)
        slo = pipeline.ctx.workload.slo or {}
        constraints, kind, values = judge(result, pipeline.objectives, slo)
        original = next(t for t in study.get_trials(deepcopy=False) if t.number == chosen.number)
        number = add_confirmation(study, original, values, constraints, result_attrs(result, kind))
        done.append(Confirmation(chosen.number, number, kind, len(result.repeats or ())))
        log(_verdict(chosen, result, kind, slo, pipeline.objectives, number))
    return done


def _rerun(study: optuna.Study, pipeline: AdaptivePipeline, chosen: TrialRecord, extra: int,
           folder: Path, log: Callable[[str], None]) -> TrialResult:
    """`extra` more runs of `chosen`'s config, merged with the runs it already had."""
    params = {k: v for k, v in chosen.params.items() if k != KV_SHARE}
    runs = [dict(r) for r in chosen.repeats] if chosen.repeats else [dict(chosen.metrics)]

    def run(i: int) -> TrialResult:
        log(f"confirming trial {chosen.number}: run {i} of {extra}")
        return pipeline.rerun(study, params, folder / str(i))
    done, failed = more_runs(extra, run, lambda i: f"confirmation run {i} of trial "
                                                   f"{chosen.number}")
    runs += [r.metrics for r in done]
    if failed is not None:
        return replace(failed, repeats=runs)
    peaks = [p for p in (chosen.peak_bytes, *(r.peak_bytes for r in done)) if p is not None]
    return replace(done[-1], metrics=median_metrics(runs), repeats=runs,
                   first_run_metrics=runs[0], peak_bytes=max(peaks, default=None),
                   outcome=Outcome("ok", f"confirmation of trial {chosen.number}: medians of "
                                         f"{len(runs)} runs"))


def _verdict(chosen: TrialRecord, result: TrialResult, kind: str, slo: Mapping[str, float],
             objectives: list[Objective], number: int) -> str:
    """One line: what the runs measured, against the SLOs where there are any."""
    runs = result.repeats or [result.metrics]
    metrics = list(slo) or [objectives[0].metric]
    seen = "; ".join(f"{m} " + " / ".join(fmt(r.get(m)) for r in runs)
                     + (f" (SLO <= {fmt(slo[m])})" if m in slo else "") for m in metrics)
    verdict = {"ok": "holds", "slo": "does not hold: an SLO missed in some run"}.get(
        kind, f"does not hold: {result.outcome.reason}")
    return (f"trial {chosen.number} confirmed as trial {number} over {len(runs)} runs "
            f"({seen}): {verdict}")
