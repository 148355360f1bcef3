"""Pick a study up after the tuner died: stop its orphaned server, retry its unfinished trial.

A tuner killed with -9 leaves a trial RUNNING in the storage and maybe a server holding the GPU
and a port.  Each trial records its worker (host and pid) in the storage and its server's pid,
process group and port in `trials/<n>/server.json`.  On start-up (and while a worker waits for
the others to finish the study), a RUNNING trial whose worker process on this host is gone is
failed and re-queued with the same parameters at once (trials of other hosts wait for their
heartbeat to go stale; `RetryHeartbeatStaleTrialCallback` re-queues those), and what is left of
its server group is stopped.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from tuner.server.process import MARK_ENV, group_members, pid_alive, stop_group
from tuner.study.record import mark_interrupted, params_of, retry_mark, worker_of

UNCLAIMED_AFTER_S = 60.0


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _marked(pid: int, record: Path) -> bool:
    """The process carries the launcher's mark naming this record in its environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return f"{MARK_ENV}={record.resolve()}".encode() in env


def stop_orphan_server(trial_dir: Path) -> bool:
    """Stop the server recorded in `trial_dir/server.json` if it is still ours.

    Ours: the group leader still runs the recorded command, or, once the leader is gone (it dies
    with the tuner), a process left in its group still carries the launcher's mark for this
    record -- a server's worker processes (vLLM's engine core, tensor-parallel ranks) do not die
    with the tuner and hold the GPU.
    """
    record = trial_dir / "server.json"
    try:
        info = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    pgid = int(info["pgid"])
    leader_ours = pid_alive(pgid) and _cmdline(pgid) == list(info.get("argv", []))
    if not leader_ours and not any(_marked(pid, record) for pid in group_members(pgid)):
        return False  # gone, or the ids now belong to something else
    return stop_group(pgid, grace_s=2.0)


def _dead_local_worker(trial: optuna.trial.FrozenTrial) -> bool:
    worker = worker_of(trial)
    if not worker:
        return False
    host, _, pid = worker.rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


def _unclaimed(trial: optuna.trial.FrozenTrial, now: datetime) -> bool:
    """A RUNNING trial that no worker put its name on, long after it was created.

    The storage creates a trial before the objective's first line records the worker, and
    Optuna's heartbeat starts in between; a worker killed in that gap (milliseconds) leaves a
    trial that no heartbeat will ever mark stale and that would hold a slot of the budget for
    good.  Generous age (clock skew between hosts) before calling it dead.
    """
    return (worker_of(trial) is None and trial.datetime_start is not None
            and (now - trial.datetime_start).total_seconds() > UNCLAIMED_AFTER_S)


def recover(study: optuna.Study, trials_dir: Path) -> list[int]:
    """Fail and re-queue the trials of dead local workers; stop their servers. Returns numbers.

    Safe to run from several workers at once: the storage lets only one of them fail a trial,
    and only that one re-queues it.
    """
    recovered = []
    storage = study._storage  # noqa: SLF001 - Optuna exposes no public setter for a trial's state
    now = datetime.now()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not (_dead_local_worker(trial) or _unclaimed(trial, now)):
            continue
        stop_orphan_server(trials_dir / str(trial.number))
        try:
            mark_interrupted(storage, trial)
            failed = storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)  # noqa: SLF001
        except UpdateFinishedTrialError:
            continue  # another worker got there first
        params = params_of(trial)
        if failed and params:
            study.enqueue_trial(params, user_attrs=retry_mark(trial.number))
        if failed:
            recovered.append(trial.number)
    return recovered
