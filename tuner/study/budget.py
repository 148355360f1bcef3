"""Run trials until the study holds the measured trials asked for, whoever runs them.

`--trials N` counts configs measured on the server, in the whole study: a pre-screen skip or a
copy of an earlier result measures nothing, so it does not use up the budget (`--max-skips`
bounds how many of those a run may add, so that a sampler stuck on hopeless configs ends).
Trials being run by a live worker count too (so that two workers do not both run the last one),
which means a worker that died mid-trial holds a slot until it is found dead: its trial is then
failed and re-queued, and some worker has to run the retry.  So a worker does not stop when its
own share is done but when the study is: while other workers' trials are running it keeps
looking for dead ones.

`--patience K` stops early once the chosen pick (`tuner.select.choose`, the knee) has not
changed for K measured trials: `Convergence` is the callback that decides it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.errors import UsageError
from tuner.output.select import choose
from tuner.study.objective import counted
from tuner.study.record import TrialRecord, records
from tuner.study.recovery import recover

POLL_S = 2.0

Callback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


def finished(study: optuna.Study) -> int:
    """Measured trials that finished."""
    return sum(t.budgeted for t in records(study, (TrialState.COMPLETE,)))


def unmeasured_count(study: optuna.Study) -> int:
    return sum(t.unmeasured for t in records(study, (TrialState.COMPLETE,)))


@dataclass
class Convergence:
    """Stops the study when the pick has not changed in `patience` measured trials."""

    patience: int
    fired: str = ""

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if self.fired or not TrialRecord.of(trial).budgeted or trial.state != TrialState.COMPLETE:
            return
        try:
            pick = choose(study, "knee").trial.number
        except UsageError:  # nothing feasible yet: nothing to converge on
            return
        since = sum(1 for t in records(study, (TrialState.COMPLETE,))
                    if t.number > pick and t.budgeted)
        if since >= self.patience:
            self.fired = (f"converged: the pick (trial {pick}) has not changed in {since} "
                          f"measured trials (--patience {self.patience}); stopped at "
                          f"{finished(study)} measured trials")
            study.stop()


def run_to_budget(study: optuna.Study, objective: Callable[[optuna.Trial], Sequence[float]],
                  target: int,
                  trials_dir: Path, callbacks: Sequence[Callback] = (),
                  max_skips: int | None = None, convergence: Convergence | None = None) -> None:
    """Optimize until `target` measured trials are COMPLETE, re-queueing the trials of dead
    workers; stop early when `max_skips` unmeasured trials were added by this run or when
    `convergence` fires."""
    skips_before = unmeasured_count(study)

    def too_many() -> bool:
        return max_skips is not None and unmeasured_count(study) - skips_before >= max_skips

    def cap(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if TrialRecord.of(trial).unmeasured and too_many():
            study.stop()

    extra: list[Callback] = [cap, *([convergence] if convergence is not None else [])]
    while True:
        if convergence is not None and convergence.fired:
            return
        if too_many():
            print(f"study {study.study_name}: stopped after {max_skips} configs that were not "
                  "measured (pre-screen skips or repeats; --max-skips)")
            return
        retried = recover(study, trials_dir)
        if retried:
            print(f"study {study.study_name}: re-queued trial(s) {retried} of a worker that died")
        optuna.storages.fail_stale_trials(study)  # other hosts' dead workers (heartbeat)
        missing = target - len(counted(study))
        if missing > 0:
            study.optimize(objective, n_trials=missing, callbacks=[*callbacks, *extra], catch=())
        elif finished(study) >= target:
            return
        else:
            time.sleep(POLL_S)
