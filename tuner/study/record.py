"""The trial and study record: every attribute the tuner keeps in Optuna, typed, in one place.

Why one module: the record is the contract between the trial loop, selection, the report, the
dashboard and studies written by earlier runs.  Attribute names spread over many modules drift
(two feasibility rules that disagreed were the result), so this is the only module that reads
or writes a trial's Optuna attributes by name (tuner.study.study_record does the same for the
study's); everything else works with `TrialRecord` and `StudyInfo`.  Optuna keeps user
attributes as JSON, so the record is plain data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

if TYPE_CHECKING:
    from tuner.trial.result import TrialResult

MEASURED_OUTCOMES = ("ok", "slo")
DEFAULT_MARK = {"is_default": True}     # user_attrs of the enqueued server-default trial
GIVEN = "given_knobs"                   # the knobs the server default set (the rest sampled)
_WORKER = "worker"
_CACHED_FROM = "cached_from"
_KV_VALUE = "kv_value"                  # enqueued with a KV share: the KV knob's value to run
CONFIRMS = "confirms"                   # of a confirmation trial: the trial whose config it re-ran
_CONSTRAINT_LIST = "constraints"    # the list `constraints_func` writes; optuna-dashboard reads it


class Stage(str, Enum):
    """How far a config got: skipped before launch, screening cells only, or the full matrix."""

    PRESCREEN = "prescreen"
    SCREEN = "screen"
    FULL = "full"


@dataclass(frozen=True)
class TrialRecord:
    """What one trial saw, as stored: outcome, stage, metrics, cells, memory, provenance."""

    number: int
    state: TrialState
    values: tuple[float, ...] | None
    constraints: Mapping[str, float]
    params: Mapping[str, Any]
    outcome: str
    reason: str = ""
    stage: Stage = Stage.FULL
    metrics: Mapping[str, float] = field(default_factory=dict)
    screen_metrics: Mapping[str, float] | None = None
    cells: Sequence[Mapping[str, Any]] = ()
    argv: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    memory: Mapping[str, Any] | None = None     # the estimate's parts (trial.prescreen)
    predicted_peak_bytes: int | None = None
    capacity_bytes: int | None = None
    idle_bytes: int | None = None
    peak_bytes: int | None = None
    repeats: Sequence[Mapping[str, float]] | None = None
    cached_from: int | None = None
    is_default: bool = False
    given: tuple[str, ...] | None = None    # of the default: the knobs it set (`GIVEN`)
    worker: str | None = None
    config_key: str | None = None
    sim_seconds: float | None = None
    capacity_search: Mapping[str, Any] | None = None  # tuner.bench.capacity.CapacityResult.record
    confirms: int | None = None     # the trial whose runs this one extends (trial.confirm_pick)

    @classmethod
    def of(cls, t: FrozenTrial) -> TrialRecord:
        a = t.user_attrs
        default = "ok" if t.state == TrialState.COMPLETE else t.state.name.lower()
        return cls(
            number=t.number, state=t.state,
            values=tuple(t.values) if t.values is not None else None,
            constraints=named_constraints(t), params=dict(t.params),
            outcome=str(a.get("outcome", default)), reason=str(a.get("reason", "")),
            stage=Stage(a.get("stage", Stage.FULL.value)), metrics=a.get("metrics") or {},
            screen_metrics=a.get("screen_metrics"), cells=a.get("cells") or [],
            argv=[str(x) for x in a.get("argv") or []],
            env={str(k): str(v) for k, v in (a.get("env") or {}).items()},
            memory=a.get("memory_estimate"), predicted_peak_bytes=_int(a, "predicted_peak_bytes"),
            capacity_bytes=_int(a, "capacity_bytes"), idle_bytes=_int(a, "idle_bytes"),
            peak_bytes=_int(a, "peak_bytes"), repeats=a.get("repeats"),
            cached_from=_int(a, _CACHED_FROM), is_default=bool(a.get("is_default")),
            given=tuple(a[GIVEN]) if GIVEN in a else None,
            worker=a.get(_WORKER), config_key=a.get("config_key"),
            sim_seconds=a.get("sim_seconds"), capacity_search=a.get("capacity_search"),
            confirms=_int(a, CONFIRMS))

    @property
    def sampled(self) -> list[str]:
        """Of the server default's trial: the knobs the space gives no default, which the
        sampler chose (a KV pool drawn as its share named by its own knob); empty for other
        trials and for studies that did not record `GIVEN`."""
        if not self.is_default or self.given is None:
            return []
        return sorted(k for k in self.params if k not in self.given and k != KV_SHARE)

    @property
    def measured(self) -> bool:
        """COMPLETE with values the server produced (ok or slo), not worst-case stand-ins."""
        return (self.state == TrialState.COMPLETE and self.values is not None
                and self.outcome in MEASURED_OUTCOMES)

    @property
    def feasible(self) -> bool:
        """The one feasibility rule: COMPLETE, every constraint met, the server ran ok, and the
        values were measured on the full matrix (a screened-out config carries estimates)."""
        return (self.state == TrialState.COMPLETE and self.values is not None
                and self.outcome == "ok" and self.stage == Stage.FULL
                and all(v <= 0 for v in self.constraints.values()))

    @property
    def original(self) -> bool:
        """Ran a server itself, rather than copying the result of an identical config."""
        return self.cached_from is None

    @property
    def runs(self) -> int:
        """Full-matrix runs behind the metrics: 1, or as many as the medians were taken over."""
        return len(self.repeats) if isinstance(self.repeats, list) and self.repeats else 1

    @property
    def budgeted(self) -> bool:
        """Counts towards `--trials`: a config measured for the search.  Not a skip or a copy
        (`unmeasured`), nor a confirmation of the pick, which re-runs a config already counted."""
        return not self.unmeasured and self.confirms is None

    @property
    def unmeasured(self) -> bool:
        """Finished without running on the server: skipped by the pre-screen, or a copy.  Such
        trials do not use up `--trials`."""
        return self.state == TrialState.COMPLETE and (
            self.outcome == "skipped" or not self.original)


def named_constraints(t: FrozenTrial) -> dict[str, float]:
    """Named constraints only; Optuna also shows the list (same values) as "0", "1"..."""
    return {k: v for k, v in t.constraints.items() if not k.isdigit()}


def write_constraints(trial: optuna.Trial, constraints: Mapping[str, float]) -> None:
    """Store feasibility twice: Optuna 5's named constraints (samplers) and, same values in
    order, the list `constraints_func` writes, the only one optuna-dashboard 0.21 reads."""
    for name, value in constraints.items():
        trial.set_constraint(name, float(value))
    trial.storage.set_trial_system_attr(trial._trial_id, _CONSTRAINT_LIST,
                                        [float(v) for v in constraints.values()])


def _int(attrs: Mapping[str, Any], key: str) -> int | None:
    v = attrs.get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def config_key(params: Mapping[str, Any]) -> str:
    """A config's identity: equal params, equal key (to copy instead of re-running it).  The
    sampler-side KV share is not part of it: two shares that render to one pool are one config."""
    knobs = sorted((k, v) for k, v in params.items() if k != KV_SHARE)
    return hashlib.sha256(repr(knobs).encode()).hexdigest()[:16]


KV_SHARE = "kv_share"   # the parameter the sampler draws instead of the KV knob (trial.kv_share)


def knobs_key(params: Mapping[str, Any], kv_name: str) -> str:
    """`config_key` with the KV pool aside too: one key for a config run at several pools."""
    return config_key({k: v for k, v in params.items() if k != kv_name})


def kv_mark(value: int) -> dict[str, Any]:
    """user_attrs of a config enqueued as a KV share: the pool it was asked to run with."""
    return {_KV_VALUE: int(value)}


def kv_value(trial: optuna.Trial | FrozenTrial) -> int | None:
    """The KV knob's value an enqueued trial must run with (see `kv_mark`), if any."""
    v = trial.user_attrs.get(_KV_VALUE)
    return int(v) if isinstance(v, (int, float)) else None


def params_of(t: FrozenTrial) -> dict[str, Any]:
    """The config of any trial, a queued one (fixed params, not sampled yet) included."""
    return dict(t.params or t.system_attrs.get("fixed_params") or {})


def enqueued_keys(study: optuna.Study) -> set[str]:
    """Config keys of every trial the study holds, whatever its state."""
    return {config_key(params_of(t)) for t in study.get_trials(deepcopy=False)}


def completed_with_key(study: optuna.Study, key: str) -> FrozenTrial | None:
    """The latest COMPLETE trial that ran `key` itself (not a copy), if any: a confirmation of
    the config holds more runs than the trial it confirms."""
    last = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("config_key") == key and _CACHED_FROM not in t.user_attrs:
            last = t
    return last


def latest(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
    """`trials` without those a confirmation trial re-ran: its medians over more runs replace
    the one run (or fewer runs) they were chosen on."""
    confirmed = {t.confirms for t in trials if t.confirms is not None}
    return [t for t in trials if t.number not in confirmed]


def records(study: optuna.Study, states: Sequence[TrialState] | None = None) -> list[TrialRecord]:
    """Every trial of the study (or those in `states`) as records, in trial-number order."""
    trials = study.get_trials(deepcopy=False, states=tuple(states) if states else None)
    return [TrialRecord.of(t) for t in trials]


def is_feasible(t: FrozenTrial) -> bool:
    return TrialRecord.of(t).feasible


def is_measured(t: FrozenTrial) -> bool:
    return TrialRecord.of(t).measured


def outcome_of(t: FrozenTrial) -> str:
    return TrialRecord.of(t).outcome


def write_trial(trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
    """Store a finished trial's fields (see `TrialRecord`); None values are left out."""
    for key, value in attrs.items():
        if value is not None:
            trial.set_user_attr(key, value.value if isinstance(value, Enum) else value)


def write_result(trial: optuna.Trial, result: TrialResult, outcome: str) -> None:
    """Store a trial's result under the record's names; `outcome` may differ from the run's
    (a run that missed an SLO is stored as "slo")."""
    write_trial(trial, result_attrs(result, outcome))


def result_attrs(result: TrialResult, outcome: str) -> dict[str, Any]:
    """A result as the user attributes `write_result` stores (None values left out)."""
    attrs = {
        "outcome": outcome, "reason": result.outcome.reason, "metrics": result.metrics,
        "cells": result.cells, "argv": result.argv, "env": result.env,
        "wall_s": round(result.wall_s, 3), "stage": result.stage,
        "idle_bytes": result.idle_bytes, "peak_bytes": result.peak_bytes,
        "ports_taken": result.ports_taken,
        "sim_seconds": result.sim_seconds, "memory_estimate": result.memory,
        "predicted_peak_bytes": result.predicted_peak_bytes,
        "capacity_bytes": result.capacity_bytes, "screen_metrics": result.screen_metrics,
        "estimated": result.estimated or None, "cell_order": result.cell_order,
        "repeats": result.repeats, "first_run_metrics": result.first_run_metrics,
        "capacity_search": result.capacity_search}
    return {k: v.value if isinstance(v, Enum) else v for k, v in attrs.items() if v is not None}


def add_confirmation(study: optuna.Study, original: FrozenTrial, values: Sequence[float],
                     constraints: Mapping[str, float], attrs: Mapping[str, Any]) -> int:
    """Add a finished trial that re-ran `original`'s config (see `latest`); its number.  It is
    written whole, once its runs are done: a crash before leaves nothing half-written."""
    marks = {CONFIRMS: original.number, "config_key": original.user_attrs.get("config_key")}
    study.add_trial(optuna.trial.create_trial(
        params=original.params, distributions=original.distributions, values=list(values),
        constraints=dict(constraints), user_attrs={**attrs, **marks},
        system_attrs={_CONSTRAINT_LIST: [float(v) for v in constraints.values()]}))
    return max(t.number for t in study.get_trials(deepcopy=False)
               if t.user_attrs.get(CONFIRMS) == original.number)


def claim(trial: optuna.Trial, worker: str) -> None:
    """Put the worker's name on a trial first thing: recovery finds dead workers by it."""
    trial.set_user_attr(_WORKER, worker)


def worker_of(t: FrozenTrial) -> str | None:
    return t.user_attrs.get(_WORKER)


def set_provenance(trial: optuna.Trial, *, config_key: str | None = None,
                   trial_dir: str | None = None) -> None:
    write_trial(trial, {"config_key": config_key, "trial_dir": trial_dir})


def copy_result(trial: optuna.Trial, done: FrozenTrial) -> None:
    """Make `trial` a copy of `done` (same config proposed again): its record minus who ran it.

    The copy never inherits `is_default`: only the enqueued default is the default.
    """
    write_constraints(trial, named_constraints(done))
    skip = (_WORKER, "config_key", "trial_dir", "wall_s", "is_default", GIVEN)
    write_trial(trial, {k: v for k, v in done.user_attrs.items() if k not in skip})
    trial.set_user_attr(_CACHED_FROM, done.number)


def mark_interrupted(storage: optuna.storages.BaseStorage, t: FrozenTrial) -> None:
    storage.set_trial_user_attr(t._trial_id, "outcome", "interrupted")  # noqa: SLF001


def retry_mark(number: int) -> dict[str, Any]:
    return {"retry_of": number}
