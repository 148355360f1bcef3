"""Storage faults: a locked SQLite file, a full disk, a connection that dies after its commit.

Real SQLite files and real locks: another connection holds `BEGIN EXCLUSIVE` as a second worker
writing would; SQLITE_FULL comes from `PRAGMA max_page_count`, SQLite's own quota.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.storages._cached_storage import _CachedStorage
from optuna.trial import TrialState

from tuner.errors import FaultError
from tuner.study.retry import RetryingStorage


def _storage(path: Path, window_s: float = 5.0, busy_s: float = 0.2) -> RetryingStorage:
    url = f"sqlite:///{path}"
    rdb = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": busy_s}})
    return RetryingStorage(_CachedStorage(rdb), url, window_s=window_s, first_wait_s=0.1)


def _lock(path: Path, seconds: float, ready: threading.Event) -> None:
    con = sqlite3.connect(path, timeout=5, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    ready.set()
    time.sleep(seconds)
    con.execute("ROLLBACK")
    con.close()


def _locked(path: Path, seconds: float) -> threading.Thread:
    ready = threading.Event()
    holder = threading.Thread(target=_lock, args=(path, seconds, ready))
    holder.start()
    ready.wait(5)
    return holder


def test_a_lock_longer_than_the_busy_timeout_is_waited_out(tmp_path, capsys):
    storage = _storage(tmp_path / "s.db")
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    holder = _locked(tmp_path / "s.db", 1.5)
    trial.set_user_attr("outcome", "ok")   # blocked, retried, then written
    study.tell(trial, 1.0)
    holder.join()
    assert storage.retries >= 1 and "database is locked" in capsys.readouterr().err
    [done] = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}").trials
    assert done.state == TrialState.COMPLETE and done.user_attrs == {"outcome": "ok"}


def test_a_lock_that_outlasts_the_window_exits_naming_postgresql(tmp_path):
    storage = _storage(tmp_path / "s.db", window_s=0.5)
    study = optuna.create_study(storage=storage, study_name="s")
    holder = _locked(tmp_path / "s.db", 3.0)
    try:
        with pytest.raises(FaultError, match="database is locked.*PostgreSQL.*journal:PATH"):
            study.ask()
    finally:
        holder.join()


def test_a_full_database_stops_at_once_and_keeps_what_was_committed(tmp_path):
    storage = _storage(tmp_path / "s.db")
    study = optuna.create_study(storage=storage, study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)

    @sqlalchemy.event.listens_for(storage.engine, "connect")
    def _quota(con, _):  # the file may not grow any more: SQLITE_FULL on the next page
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        con.execute(f"PRAGMA max_page_count = {pages}")

    storage.engine.dispose()
    t0 = time.monotonic()
    with pytest.raises(FaultError, match="disk full"):
        study.optimize(lambda t: t.suggest_float("x", 0, 1) + len("y" * 200_000 + t.set_user_attr(
            "big", "y" * 200_000) or ""), n_trials=1)
    assert time.monotonic() - t0 < 2.0  # not retried: a full disk does not empty itself
    with sqlite3.connect(tmp_path / "s.db") as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    again = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}")
    assert [t.state for t in again.trials][:2] == [TrialState.COMPLETE] * 2


def test_finishing_a_trial_whose_commit_landed_before_the_connection_died(tmp_path):
    """The retry of set_trial_state_values finds the trial finished as asked: success."""
    storage = _storage(tmp_path / "s.db")
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    inner = storage.inner
    real = inner.set_trial_state_values
    calls = []

    def lands_then_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            real(*args, **kwargs)
            lost = sqlalchemy.exc.OperationalError("COMMIT", {}, Exception("server closed"))
            raise optuna.exceptions.StorageInternalError("commit") from lost
        return real(*args, **kwargs)

    inner.set_trial_state_values = lands_then_fails
    assert storage.set_trial_state_values(trial._trial_id, TrialState.COMPLETE, [1.0])
    assert len(calls) == 2 and storage.get_trial(trial._trial_id).state == TrialState.COMPLETE


def test_a_worker_that_loses_the_sqlite_schema_race_opens_the_study_on_retry(tmp_path,
                                                                             monkeypatch):
    """Two workers creating a fresh SQLite study at once: the loser's CREATE TABLE fails with
    "table ... already exists"; it tries again and finds the winner's tables."""
    from tuner.errors import UsageError
    from tuner.study import storage as storage_mod

    real, calls = optuna.storages.RDBStorage, []

    def racing(url, **kw):
        calls.append(url)
        if len(calls) == 1:
            real(url)  # the winner creates the tables first
            raise sqlalchemy.exc.OperationalError(
                "CREATE TABLE trial_heartbeats", {},
                sqlite3.OperationalError("table trial_heartbeats already exists"))
        return real(url, **kw)

    monkeypatch.setattr(optuna.storages, "RDBStorage", racing)
    monkeypatch.setattr(storage_mod.time, "sleep", lambda s: None)
    opened = storage_mod.open_storage(f"sqlite:///{tmp_path / 's.db'}")
    assert len(calls) == 2 and opened.get_all_studies() == []
    with pytest.raises(UsageError, match="unable to open database file"):
        storage_mod.open_storage(f"sqlite:///{tmp_path / 'no' / 'such' / 's.db'}")


def _claim_queued(url: str, go, out, n: int) -> None:
    from tuner.study.storage import open_storage
    study = optuna.load_study(study_name="s", storage=open_storage(url))
    go.wait()
    out.put([study._pop_waiting_trial_id() for _ in range(n)])


def test_workers_claiming_queued_trials_at_once_never_get_the_same_one(tmp_path):
    """Four processes pop a SQLite study's queue at once.  Before BEGIN IMMEDIATE, a run like
    this handed 4-8 of 40 queued trials to two workers each; each trial must go to one."""
    import multiprocessing

    from tuner.study.storage import open_storage
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    for x in range(40):
        study.enqueue_trial({"x": x})
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claim_queued, args=(url, go, out, 10)) for _ in range(4)]
    for p in procs:
        p.start()
    go.set()
    claims = [i for _ in procs for i in out.get(timeout=60) if i is not None]
    for p in procs:
        p.join(timeout=30)
    assert len(claims) == 40 and len(set(claims)) == 40
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    assert len(running) == 40


def test_a_read_only_sqlite_file_is_opened_without_the_write_lock(tmp_path, monkeypatch):
    """A study inspected from a file this process may not write: no BEGIN IMMEDIATE, which
    SQLite would refuse on it ("attempt to write a readonly database")."""
    from tuner.study import storage as storage_mod
    url = f"sqlite:///{tmp_path / 's.db'}"
    writable = storage_mod.open_storage(url)
    optuna.create_study(study_name="s", storage=writable)
    assert sqlalchemy.event.contains(writable.engine, "begin", storage_mod._begin_immediate)
    access = os.access  # as root every file is writable: this one is said not to be
    monkeypatch.setattr(storage_mod.os, "access",
                        lambda path, mode: not str(path).endswith("s.db") and access(path, mode))
    read_only = storage_mod.open_storage(url)
    assert not sqlalchemy.event.contains(read_only.engine, "begin", storage_mod._begin_immediate)
    assert [s.study_name for s in read_only.get_all_studies()] == ["s"]
