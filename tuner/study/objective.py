"""The objective handed to `study.optimize`: one trial = one config run on the server.

Failures are data.  A config that OOMs or hangs becomes a COMPLETE trial with constraint
`feasible` > 0 (Optuna 5 `trial.set_constraint`), so TPE and GP samplers learn where the
server dies.  FAIL is kept for the tuner's own faults, which teach the sampler nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from tuner.errors import FaultError
from tuner.search.objectives import Objective, slo_violations
from tuner.server.outcome import RETRY_OUTCOMES
from tuner.study import record as rec
from tuner.study.recovery import worker_id
from tuner.trial.context import TrialContext
from tuner.trial.result import TrialResult
from tuner.trial.run import run_trial

if TYPE_CHECKING:
    from tuner.trial.pipeline import AdaptivePipeline


def suggest(
    trial: optuna.Trial, ctx: TrialContext, exclude: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Ask the sampler for one value per knob, through Optuna's public suggest API."""
    params: dict[str, Any] = {}
    for p in ctx.space.parameters:
        if p.name in exclude:
            continue
        dist = p.distribution()
        if isinstance(dist, optuna.distributions.IntDistribution):
            params[p.name] = trial.suggest_int(p.name, dist.low, dist.high, step=dist.step,
                                               log=dist.log)
        elif isinstance(dist, optuna.distributions.FloatDistribution):
            params[p.name] = trial.suggest_float(p.name, dist.low, dist.high, step=dist.step,
                                                 log=dist.log)
        elif isinstance(dist, optuna.distributions.CategoricalDistribution):
            params[p.name] = trial.suggest_categorical(p.name, dist.choices)
    return params


def counted(study: optuna.Study) -> list[rec.TrialRecord]:
    """Trials that count towards the budget: configs measured on the server, finished or being
    run by some worker.  A pre-screen skip or a copy of an earlier result measures nothing; a
    confirmation of the pick re-runs a config already counted."""
    return [t for t in rec.records(study, (TrialState.COMPLETE, TrialState.RUNNING))
            if t.budgeted]


@dataclass
class TrialObjective:
    """Callable handed to `study.optimize`: one trial = one server run.

    Several workers may share the study, so the budget is checked against the trials numbered
    before this one (numbers are handed out atomically by the storage), and a config that
    already completed is not run again: its result is copied.
    """

    ctx: TrialContext
    objectives: list[Objective]
    trials_dir: Path
    max_trials: int | None = None
    pipeline: AdaptivePipeline | None = None   # pre-screen, staging, confirm

    def __call__(self, trial: optuna.Trial) -> tuple[float, ...]:
        study = trial.study
        rec.claim(trial, worker_id())  # first: recovery finds dead workers by it
        if self.max_trials is not None:
            ahead = [t for t in counted(study) if t.number < trial.number]
            if len(ahead) >= self.max_trials:
                # one placeholder per worker, not one per trial left of its `optimize` call:
                # run_to_budget decides whether this worker still has work
                study.stop()
                raise optuna.TrialPruned("the study's trial budget was reached by other workers")
        params = (self.pipeline.suggest(trial) if self.pipeline is not None
                  else suggest(trial, self.ctx))
        key = rec.config_key(params)
        rec.set_provenance(trial, config_key=key)
        done = rec.completed_with_key(study, key)
        if done is not None:
            rec.copy_result(trial, done)
            return tuple(done.values)
        trial_dir = self.trials_dir / str(trial.number)
        rec.set_provenance(trial, trial_dir=str(trial_dir))
        try:
            if self.pipeline is not None:
                result = self.pipeline.run(study, params, trial_dir)
            else:
                result = run_trial(self.ctx, params, trial_dir)
            if result.outcome.kind in RETRY_OUTCOMES:
                return _retry_later(trial, result)
            return record(trial, result, self.objectives, self.ctx.workload.slo or {})
        except (FaultError, OSError):
            _requeue_if_possible(trial)
            raise


def _requeue_if_possible(trial: optuna.Trial) -> None:
    """The machine failed under this trial (disk full, storage gone): Optuna will fail it, so
    queue its config again for the resumed study.  If the storage cannot take that, the trial
    stays RUNNING and the resumed study's recovery re-queues it instead."""
    with contextlib.suppress(FaultError, optuna.exceptions.StorageInternalError):
        rec.write_trial(trial, {"outcome": "interrupted"})
        trial.study.enqueue_trial(trial.params, user_attrs=rec.retry_mark(trial.number))


def _retry_later(trial: optuna.Trial, result: TrialResult) -> tuple[float, ...]:
    """A trial spoilt by something outside the config (a foreign process on the GPU): queue the
    same config again and fail this one.  NaN values are Optuna's way to fail a trial without
    an exception; FAIL teaches the sampler nothing and does not count towards --trials."""
    rec.write_trial(trial, {"outcome": result.outcome.kind, "reason": result.outcome.reason})
    trial.study.enqueue_trial(trial.params, user_attrs=rec.retry_mark(trial.number))
    print(f"trial {trial.number}: {result.outcome.reason}", flush=True)
    return tuple(float("nan") for _ in trial.study.directions)


def judge(result: TrialResult, objectives: list[Objective],
          slo: Mapping[str, float]) -> tuple[dict[str, float], str, tuple[float, ...]]:
    """A result's constraints, stored outcome and Optuna values.

    The SLOs are judged on every run behind the metrics (`repeats`, where a config was re-run),
    not on their medians: a config that misses its SLO one run in three is not one to deploy
    under that SLO."""
    feasible = result.outcome.feasible
    runs = result.repeats or [result.metrics]
    violations = ({m: max(slo_violations(r, slo)[m] for r in runs) for m in slo} if feasible
                  else {m: 1.0 for m in slo})
    constraints = {"feasible": 0.0 if feasible else 1.0,
                   **{f"slo:{m}": float(v) for m, v in violations.items()},
                   **{n: float(v) for n, v in result.constraints.items()}}
    kind = result.outcome.kind
    if feasible and any(v > 0 for v in violations.values()):
        kind = "slo"
    values = (tuple(o.value(result.metrics) for o in objectives) if feasible
              else tuple(o.worst() for o in objectives))
    return constraints, kind, values


def record(trial: optuna.Trial, result: TrialResult, objectives: list[Objective],
           slo: Mapping[str, float]) -> tuple[float, ...]:
    """Store what the trial saw and return the values Optuna gets."""
    constraints, kind, values = judge(result, objectives, slo)
    rec.write_constraints(trial, constraints)
    rec.write_result(trial, result, kind)
    return values
