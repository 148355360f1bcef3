"""Optuna storage calls that outlive a storage outage: retried with backoff, or a clean exit.

Optuna's RDB storage turns every database error into `StorageInternalError`, rolls the
transaction back and gives up at once.  A long study meets outages that end by themselves:
PostgreSQL restarted (every pooled connection dies; `pool_pre_ping` replaces them once the server
is back), SQLite "database is locked" while another process writes for longer than the busy
timeout.  `RetryingStorage` retries any call that failed that way, with exponential backoff, for
up to `window_s`; a rolled-back transaction changed nothing, so a retry is safe.  The one
ambiguous case, a commit that succeeded before its connection died, matters for finishing a
trial: a retry then finds the trial already finished with the state it was given, which is
success.  A disk that is full does not end by itself: it raises `FaultError` at once, as does an
outage longer than the window, with what to do; a completed trial is never lost (the database
kept its last commit) and the interrupted one is re-queued when the same command resumes.
"""

from __future__ import annotations

import abc
import contextlib
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from optuna.exceptions import StorageInternalError, UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import TrialState
from sqlalchemy.exc import DBAPIError, PendingRollbackError

from tuner.errors import FaultError

DISK_FULL = re.compile(r"database or disk is full|no space left on device|could not extend file"
                       r"|could not write", re.I)
LOCKED = re.compile(r"database is locked|database table is locked", re.I)
MULTI_WORKER_HINT = ("SQLite serialises writers through one file lock; for several workers use "
                     "PostgreSQL (--storage postgresql://USER:PASSWORD@HOST/DB), or on one host "
                     "Optuna's journal file (--storage journal:PATH)")


def _cause(exc: BaseException) -> BaseException:
    """SQLAlchemy's error behind Optuna's wrapper (StorageInternalError from ...), or `exc`."""
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, (DBAPIError, PendingRollbackError)):
        seen = seen.__cause__
    return seen if seen is not None else exc


def _text(exc: BaseException) -> str:
    cause = _cause(exc)
    inner = getattr(cause, "orig", None) or cause
    lines = str(inner).strip().splitlines()
    return lines[0] if lines else type(inner).__name__


def transient(exc: BaseException) -> bool:
    """A database error that may go away: lost or refused connections, locks, restarts.
    Optuna wraps such errors as StorageInternalError; a bad URL or schema is not retried."""
    cause = _cause(exc)
    if isinstance(cause, PendingRollbackError):  # a session left broken by a lost connection
        return True
    return isinstance(cause, DBAPIError) and not DISK_FULL.search(str(cause))


class RetryingStorage(BaseStorage, BaseHeartbeat):
    """Every BaseStorage/BaseHeartbeat call of `inner`, retried while the database is away."""

    def __init__(self, inner: BaseStorage, url: str, window_s: float = 120.0,
                 first_wait_s: float = 0.5, max_wait_s: float = 8.0) -> None:
        self.inner, self.url = inner, url
        self.window_s, self.first_wait_s, self.max_wait_s = window_s, first_wait_s, max_wait_s
        self.retries = 0  # calls that needed at least one retry, for the soak and the tests
        # the SQLAlchemy engine behind an RDB storage (cached or not), for callers that dispose it
        self.engine = getattr(getattr(inner, "_backend", inner), "engine", None)

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        method: Callable[..., Any] = getattr(self.inner, name)
        deadline, wait, retried = time.monotonic() + self.window_s, self.first_wait_s, 0.0
        while True:
            try:
                return method(*args, **kwargs)
            except UpdateFinishedTrialError:
                if retried and name == "set_trial_state_values" and self._already(args):
                    return True  # the first attempt committed before its connection died
                raise
            except (StorageInternalError, DBAPIError, PendingRollbackError) as exc:
                if DISK_FULL.search(_text(exc)):
                    raise FaultError(f"disk full: storage {self.url}: {_text(exc)}; free space "
                                     "and run the same command to resume (completed trials "
                                     "are kept)") from None
                if not transient(exc):
                    raise
                if time.monotonic() + wait > deadline:
                    raise FaultError(self._gave_up(exc)) from None
                if not retried:
                    self.retries += 1
                    print(f"storage: {_text(exc)}; retrying for up to {self.window_s:.0f} s",
                          file=sys.stderr, flush=True)
                with contextlib.suppress(Exception):  # the next try starts a fresh session
                    self.inner.remove_session()
                time.sleep(wait)
                retried += wait
                wait = min(wait * 2, self.max_wait_s)

    def _already(self, args: tuple[Any, ...]) -> bool:
        trial_id, state = args[0], args[1]
        return self.inner.get_trial(trial_id).state == TrialState(state)

    def _gave_up(self, exc: BaseException) -> str:
        text = _text(exc)
        hint = MULTI_WORKER_HINT if LOCKED.search(text) else \
            "completed trials are kept: run the same command again once it is back"
        return f"storage {self.url} failed for {self.window_s:.0f} s ({text}); {hint}"


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: RetryingStorage, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, args, kwargs)

    method.__name__ = method.__qualname__ = name
    return method


_METHODS = sorted({n for base in (BaseStorage, BaseHeartbeat) for n in dir(base)
                   if not n.startswith("__") and n != "_abc_impl"} - {"remove_session"})
for _name in _METHODS:
    setattr(RetryingStorage, _name, _delegate(_name))
RetryingStorage.remove_session = (  # type: ignore[method-assign]
    lambda self: self.inner.remove_session())  # type: ignore[attr-defined]
abc.update_abstractmethods(RetryingStorage)  # type: ignore[type-abstract]

