"""Run trials until the study holds exactly the trials asked for, whoever runs them.

`--trials N` counts finished trials of the whole study.  Trials being run by a live worker
count too (so that two workers do not both run the last one), which means a worker that died
mid-trial holds a slot until it is found dead: its trial is then failed and re-queued, and some
worker has to run the retry.  So a worker does not stop when its own share is done but when the
study is: while other workers' trials are running it keeps looking for dead ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.study.recovery import recover
from tuner.study.objective import counted

POLL_S = 2.0

Callback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


def finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def run_to_budget(study: optuna.Study, objective: Callable[[optuna.Trial], Sequence[float]],
                  target: int,
                  trials_dir: Path, callbacks: Sequence[Callback] = ()) -> None:
    """Optimize until `target` trials are COMPLETE, re-queueing the trials of dead workers."""
    while True:
        retried = recover(study, trials_dir)
        if retried:
            print(f"study {study.study_name}: re-queued trial(s) {retried} of a worker that died")
        optuna.storages.fail_stale_trials(study)  # other hosts' dead workers (heartbeat)
        missing = target - len(counted(study))
        if missing > 0:
            study.optimize(objective, n_trials=missing, callbacks=list(callbacks), catch=())
        elif finished(study) >= target:
            return
        else:
            time.sleep(POLL_S)
