"""What `tuner tune` prints: the plan of a run, the resolved KV range, progress, the summary.

Kept apart from the run itself so that the command module holds only the order of the steps.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from tuner.output.knob_check import describe, knob_report
from tuner.search.space import SearchSpace
from tuner.study.record import Stage, TrialRecord, latest, records
from tuner.trial.kv_share import peak_demand
from tuner.trial.pipeline import AdaptivePipeline


def plan_text(name: str, done: int, target: int, url: str) -> str:
    """What this run will do; --trials is the total the study should hold, which a rerun of the
    same command would otherwise silently satisfy with nothing to run."""
    if done >= target:
        return (f"study {name}: {done} measured trials already, nothing to run (--trials is the "
                f"total; use --trials {done + 5} to measure 5 more) ({url})")
    return f"study {name}: {done} measured trials, measuring up to {target - done} more ({url})"


def print_bounds(space: SearchSpace, pipeline: AdaptivePipeline) -> None:
    """The banner line of each auto-bounded knob: the range resolved for this model and card."""
    for p in space.parameters:
        if p.high_auto and pipeline.capacity is not None:
            how = ("sampled as a share of the headroom the other knobs leave"
                   if pipeline.kv_edge is not None else "sampled as an absolute size")
            floors = pipeline.kv_edge.floors() if pipeline.kv_edge is not None else {}
            at = ""
            if floors:
                at = "; at least " + ", ".join(f"{n} at block size {b}"
                                               for b, n in floors.items())
                at += " (the workload's largest request)"
            demand = (peak_demand(pipeline.kv_edge.cells, 1)
                      if pipeline.kv_edge is not None else None)
            if demand is not None:
                at += (f"; the heaviest cell holds {demand} tokens at once, a larger pool is "
                       "not pushed to")
            print(f"{p.name}: [{p.low:g}, {p.high:g}] for this model on a "
                  f"{pipeline.capacity / 2**30:.1f} GiB card (high: auto), {how}{at}")


def progress_text(study: optuna.Study, trial: optuna.trial.FrozenTrial, metric: str) -> str:
    best = [v for t in records(study) if t.feasible
            if (v := t.metrics.get(metric)) is not None]
    last = TrialRecord.of(trial).outcome
    return f"last={last} best {metric}={max(best):.1f}" if best else f"last={last}"


def print_summary(study: optuna.Study) -> None:
    """Outcome counts of the finished configs: a confirmation trial stands for the trial it
    re-ran (`tuner.study.record.latest`), so a pick that did not hold is not counted ok."""
    counts: dict[str, int] = {}
    done = records(study, (TrialState.COMPLETE,))
    for t in latest(done):
        kind = "screened out" if t.stage == Stage.SCREEN else t.outcome
        counts[kind] = counts.get(kind, 0) + 1
    confirmed = sum(t.confirms is not None for t in done)
    print("outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
          + (f" (confirmations counted in place of the trials they re-ran: {confirmed})"
             if confirmed else ""))
    print(describe(knob_report(study)))
