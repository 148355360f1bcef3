"""Pick a study up after the tuner died: stop its orphaned server, retry its unfinished trial.

A tuner killed with -9 leaves a trial RUNNING in the storage and maybe a server holding the GPU
and a port.  Each trial records its worker (host and pid) in the storage and its server's pid,
process group and port in `trials/<n>/server.json`.  On start-up, a RUNNING trial whose worker
process on this host is gone is failed and re-queued with the same parameters at once (trials of other
hosts wait for their heartbeat to go stale; `RetryFailedTrialCallback` re-queues those), and its server group, if
still alive and still the same command, is stopped.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.launch import pid_alive, stop_group

WORKER_ATTR = "worker"


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def stop_orphan_server(trial_dir: Path) -> bool:
    """Stop the server recorded in `trial_dir/server.json` if it still runs the same command."""
    record = trial_dir / "server.json"
    try:
        info = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    pgid = int(info["pgid"])
    if not pid_alive(pgid) or _cmdline(pgid) != list(info.get("argv", [])):
        return False  # gone, or the pid now belongs to something else
    return stop_group(pgid, grace_s=2.0)


def _dead_local_worker(trial: optuna.trial.FrozenTrial) -> bool:
    worker = trial.user_attrs.get(WORKER_ATTR)
    if not worker:
        return False
    host, _, pid = worker.rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


def recover(study: optuna.Study, trials_dir: Path) -> list[int]:
    """Fail and re-queue the trials of dead local workers; stop their servers. Returns numbers."""
    recovered = []
    storage = study._storage  # noqa: SLF001 - Optuna exposes no public setter for a trial's state
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not _dead_local_worker(trial):
            continue
        stop_orphan_server(trials_dir / str(trial.number))
        storage.set_trial_user_attr(trial._trial_id, "outcome", "interrupted")  # noqa: SLF001
        if storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):  # noqa: SLF001
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
            recovered.append(trial.number)
    return recovered
