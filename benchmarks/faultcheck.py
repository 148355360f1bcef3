"""The soak's oracle (benchmarks/faults.py): what each trial's injected fault calls for, and
its read-only views of the study database.

The ground truth is the `sim fault: KIND` line each simulated server prints at start-up into
its trial's logs (`server.log`, and `server.port-taken-<n>.log` for launches lost to a taken
port, oldest first); the tuner never reads those lines.  The judgement is the trial's outcome
in the storage.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

FAULT_LINE = re.compile(r"^sim fault: (\w+)", re.M)
EXPECTED = {"none": "ok", "http500": "flaky", "cut": "protocol", "malformed": "protocol",
            "flap": "flaky", "slow_start": "startup", "port_taken": "startup",
            "gpu_grab": "gpu_busy"}
TEXT = {"none": "ok", "port_taken": "new port; 3 taken in a row: startup",
        "gpu_grab": "gpu_busy: FAIL, config re-queued"}


@dataclass
class Verdicts:
    matched: Counter = field(default_factory=Counter)
    wrong: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    ports_unrecorded: int = 0
    ports_retried: int = 0  # judged trials whose server lost at least one launch to a taken port
    not_requeued: int = 0

    @property
    def expected_text(self) -> dict[str, str]:
        return {k: TEXT.get(k, v) for k, v in EXPECTED.items()}


def _query(db: Path, sql: str, timeout: float = 30.0) -> Any:
    with closing(sqlite3.connect(db, timeout=timeout)) as con:
        return con.execute(sql).fetchone()[0]


def complete_count(db: Path) -> int:
    """COMPLETE trials now; -1 while the database is missing or locked."""
    try:
        return _query(db, "SELECT COUNT(*) FROM trials WHERE state='COMPLETE'", timeout=1.0)
    except sqlite3.Error:
        return -1


def integrity(db: Path) -> str:
    return _query(db, "PRAGMA integrity_check")


def read_trials(db: Path, study: str) -> list[FrozenTrial]:
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}",
                                         engine_kwargs={"connect_args": {"timeout": 60}})
    try:
        return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    except KeyError:
        return []
    finally:
        storage.engine.dispose()


def launches(trial_dir: Path) -> list[str]:
    """The fault of each launch of the trial's server, in order ("none" for a clean one)."""
    logs = sorted(trial_dir.glob("server.port-taken-*.log")) + [trial_dir / "server.log"]
    kinds = []
    for log in logs:
        if log.is_file():
            found = FAULT_LINE.findall(log.read_text(errors="replace"))
            kinds.append(found[0] if found else "none")
    return kinds


def judge(trials: list[FrozenTrial], trials_dir: Path) -> Verdicts:
    """Compare every judged trial with its faults; count what the storage did with the rest."""
    v = Verdicts()
    retried = {t.user_attrs.get("retry_of") for t in trials}
    for t in trials:
        outcome = t.user_attrs.get("outcome")
        if t.state == TrialState.FAIL:
            v.not_requeued += t.params != {} and t.number not in retried
        if "cached_from" in t.user_attrs or outcome in (None, "interrupted"):
            continue  # a copy of a known result, or a run cut short by the tuner's own exit
        kinds = launches(trials_dir / str(t.number))
        if not kinds:
            continue
        last = kinds[-1]
        if outcome == EXPECTED[last]:
            v.matched[last] += 1
        else:
            v.wrong[last] += 1
            v.examples.append(f"trial {t.number}: faults {kinds}, outcome {outcome}: "
                              f"{t.user_attrs.get('reason', '')[:160]}")
        taken = len(kinds) - 1
        v.ports_retried += taken > 0 and last != "port_taken"
        if t.state == TrialState.COMPLETE and t.user_attrs.get("ports_taken", 0) != taken:
            v.ports_unrecorded += 1
    return v
