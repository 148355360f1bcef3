"""Where studies live and how to open them: storage URLs, the CLI's study reference, creation.

`export`, `inspect` and `ablate` default to the study folder touched last, because right after a
`tuner tune` that is the one the user means.  A study's own folder holds its SQLite file unless
`--storage` names another storage: PostgreSQL for several hosts, or `journal:PATH`, Optuna's
journal file (one append-only log, file-locked), for several workers on one host without a
database server.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
import sqlalchemy.exc
from optuna.storages._cached_storage import _CachedStorage  # what optuna wraps an RDB URL in
from optuna.storages.journal import JournalFileBackend, JournalStorage

from tuner.errors import UsageError
from tuner.study.retry import RetryingStorage

DB_NAME = "study.db"
SQLITE_BUSY_S = 20.0
_SQLITE = "sqlite:///"
_JOURNAL = "journal:"
STORAGE_HELP = ("Optuna storage URL (default: sqlite:///STUDIES_DIR/NAME/study.db); several "
                "workers: postgresql://USER:PASSWORD@HOST/DB, or journal:PATH (a journal file, "
                "one host)")


@dataclass(frozen=True)
class StudyRef:
    """A study's name, its storage URL and its folder (where best.env and report.html go)."""

    name: str
    storage: str
    folder: Path


def add_study_args(parser: argparse.ArgumentParser) -> None:
    """--study, --storage, --studies-dir."""
    parser.add_argument("--study", metavar="NAME",
                        help="study name (default: the folder under --studies-dir whose study.db "
                             "was modified last)")
    parser.add_argument("--storage", metavar="URL", help=STORAGE_HELP)
    parser.add_argument("--studies-dir", metavar="DIR", type=Path, default=Path("studies"),
                        help="folder holding one folder per study (default: ./studies)")


def sqlite_url(db: Path) -> str:
    return f"sqlite:///{db.as_posix()}"


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for any other storage)."""
    return Path(url[len(_SQLITE):]) if url.startswith(_SQLITE) else None


def journal_path(url: str) -> Path | None:
    """The file of a `journal:PATH` storage (None for any other storage)."""
    return Path(url[len(_JOURNAL):]) if url.startswith(_JOURNAL) else None


def as_storage(url: str) -> str | optuna.storages.BaseStorage:
    """What Optuna's `storage=` takes for `url`: the URL itself, or the journal it names (Optuna
    has no URL scheme for a journal file)."""
    path = journal_path(url)
    if path is None:
        return url
    if not path.name:
        raise UsageError(f"--storage {url}: expected journal:PATH, e.g. journal:studies/x.log")
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


def storage_url(studies_dir: Path, name: str, storage: str | None) -> str:
    """--storage as given, else the study folder's own SQLite file."""
    return storage or sqlite_url(studies_dir / name / DB_NAME)


def find_study(ref: str, storage: str, studies_dir: Path) -> optuna.Study:
    """An earlier study by name (in `storage` or its own folder) or as URL#NAME."""
    if "#" in ref:
        url, name = ref.rsplit("#", 1)
    elif (studies_dir / ref / DB_NAME).is_file():
        url, name = sqlite_url(studies_dir / ref / DB_NAME), ref
    else:
        url, name = storage, ref
    return load(StudyRef(name, url, studies_dir / name))


def open_storage(url: str, attempts: int = 5) -> optuna.storages.BaseStorage:
    """An RDB storage with a heartbeat, so trials of a killed worker can be found and retried,
    whose calls outlive storage outages (tuner.study.retry); or, for `journal:PATH`, Optuna's
    journal file as it is (a file lock, no outage to outlive, no heartbeat: a dead worker of
    this host is found by tuner.study.recovery).

    Workers started together on an empty database all create Optuna's tables; PostgreSQL lets
    one win and the others fail on a duplicate table or type, SQLite on "table ... already
    exists".  Those try again (the tables are there by then); any other error is the user's URL
    and is reported at once.  SQLite waits `SQLITE_BUSY_S` for another worker's write lock
    before it reports "database is locked".
    """
    journal = as_storage(url)
    if not isinstance(journal, str):  # no heartbeat: a dead local worker is found by recovery
        return journal
    race: Exception | None = None
    kwargs = {"connect_args": {"timeout": SQLITE_BUSY_S}} if url.startswith("sqlite") else {}
    for attempt in range(attempts):
        try:
            rdb = optuna.storages.RDBStorage(
                url, engine_kwargs=kwargs, heartbeat_interval=10, grace_period=30,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=3))
            if _writable_sqlite(url):
                _lock_on_begin(rdb.engine)
            return RetryingStorage(_CachedStorage(rdb), url)  # type: ignore[abstract]
        except Exception as exc:  # sqlalchemy raises many types for a bad or unreachable URL
            if not _schema_race(exc):
                raise UsageError(f"cannot open storage {url}: {_first_line(exc)}") from None
            race = exc
            time.sleep(0.2 * (attempt + 1))
    raise UsageError(f"cannot open storage {url}: {_first_line(race)}")


def _writable_sqlite(url: str) -> bool:
    """A SQLite URL whose file this process may write.  A read-only one (a study inspected from
    a read-only mount) has no trial to claim, and BEGIN IMMEDIATE would fail on it."""
    path = sqlite_path(url)
    return path is not None and (not path.exists() or os.access(path, os.W_OK))


def _no_driver_begin(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None


def _begin_immediate(connection: sqlalchemy.engine.Connection) -> None:
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _lock_on_begin(engine: sqlalchemy.engine.Engine) -> None:
    """Every SQLite transaction takes the write lock when it begins (BEGIN IMMEDIATE).

    Optuna claims a queued trial by reading it WAITING and writing RUNNING in one transaction,
    with SELECT ... FOR UPDATE, which SQLite ignores; and Python's sqlite3 opens the transaction
    only at the UPDATE, so two workers could both read WAITING and both run the same trial (the
    second then fails with "Cannot tell a COMPLETE trial").  SQLAlchemy's recipe for pysqlite:
    turn the driver's own BEGIN off and issue ours.  The connections the constructor opened are
    dropped so that every later one gets it.
    """
    sqlalchemy.event.listen(engine, "connect", _no_driver_begin)
    sqlalchemy.event.listen(engine, "begin", _begin_immediate)
    engine.dispose()


def _schema_race(exc: Exception) -> bool:
    """Another worker created the same table first: PostgreSQL reports a duplicate, SQLite an
    OperationalError "table ... already exists"."""
    if isinstance(exc, sqlalchemy.exc.IntegrityError | sqlalchemy.exc.ProgrammingError):
        return True
    return isinstance(exc, sqlalchemy.exc.OperationalError) and "already exists" in str(exc)


def _first_line(exc: Exception | None) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def latest_study(studies_dir: Path) -> str:
    """Name of the most recently modified study folder that has a study.db."""
    dbs = sorted(studies_dir.glob(f"*/{DB_NAME}"), key=lambda p: p.stat().st_mtime)
    if not dbs:
        raise UsageError(
            f"no study found: no {studies_dir}/<name>/study.db (give --study or --storage)"
        )
    return dbs[-1].parent.name


def resolve(args: argparse.Namespace) -> StudyRef:
    """The StudyRef the args name, without opening anything."""
    studies_dir: Path = args.studies_dir
    name = args.study
    if name is None:
        if args.storage:
            names = optuna.get_all_study_names(storage=as_storage(args.storage))
            if len(names) != 1:
                raise UsageError(f"--storage holds {len(names)} studies; name one with --study")
            name = names[0]
        else:
            name = latest_study(studies_dir)
    folder = studies_dir / name
    if args.storage:
        return StudyRef(name, args.storage, folder)
    db = folder / DB_NAME
    if not db.is_file():
        found = sorted(p.parent.name for p in studies_dir.glob(f"*/{DB_NAME}"))
        raise UsageError(f"no study {name!r} in {studies_dir} "
                         f"(found: {', '.join(found) or 'none'}; see `tuner inspect --study NAME`)")
    return StudyRef(name, sqlite_url(db), folder)


def load(ref: StudyRef) -> optuna.Study:
    """Open the study; a missing name is a UsageError listing the ones that exist."""
    try:
        return optuna.load_study(study_name=ref.name, storage=as_storage(ref.storage))
    except KeyError:
        names = optuna.get_all_study_names(storage=as_storage(ref.storage))
        raise UsageError(
            f"no study {ref.name!r} in {ref.storage} (found: {', '.join(names) or 'none'})"
        ) from None
