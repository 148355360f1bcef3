"""The study's record: what a study was made with, typed, in one place.

The study-level half of tuner.study.record (which keeps the trials'): the only module that reads
or writes a study's Optuna user attributes by name, so that a study written by an earlier run
reads back the same way everywhere (export, report, ablate, reruns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

_ABLATION = "ablation"
_BOUNDS = "bounds"
_FINGERPRINT = "space_fingerprint"
_GRID_SEED = "grid_seed"


@dataclass(frozen=True)
class StudyInfo:
    """What a study was made with, written once when it is created (see `write_study_info`)."""

    space: str | None = None
    space_file: str | None = None
    workload: str | None = None
    sampler: str | None = None
    workload_file: str | None = None
    simulate: str | None = None         # the simulator's GPU profile, None on a real server
    gpu_memory_cap: str | None = None
    model: str | None = None
    gpu: str | None = None
    simulated: bool = False
    objectives: Sequence[str] = ()
    slo: Mapping[str, float] = field(default_factory=dict)
    tuner_version: str | None = None
    flag_params: Mapping[str, str] | None = None
    env_params: Mapping[str, str] | None = None
    launch_command: Sequence[str] = ()
    server_head: Sequence[str] = ()     # the real server's command and fixed flags and env,
    fixed_flags: Sequence[str] = ()     # rendered for 127.0.0.1:8000 and the workload
    fixed_env: Mapping[str, str] | None = None
    fingerprint: str | None = None
    bounds: Mapping[str, Sequence[float]] | None = None
    ablation: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, study: optuna.Study) -> StudyInfo:
        a = study.user_attrs
        return cls(space=a.get("space"), space_file=a.get("space_file"),
                   workload=a.get("workload"), sampler=a.get("sampler"),
                   workload_file=a.get("workload_file"), simulate=a.get("simulate"),
                   gpu_memory_cap=a.get("gpu_memory_cap"),
                   model=a.get("model"), gpu=a.get("gpu"),
                   simulated=bool(a.get("simulated", False)),
                   objectives=[str(o) for o in a.get("objectives") or []],
                   slo=a.get("slo") or {}, tuner_version=a.get("tuner_version"),
                   flag_params=_mapping(a.get("flag_params")),
                   env_params=_mapping(a.get("env_params")),
                   launch_command=a.get("launch_command") or [],
                   server_head=a.get("server_head") or [], fixed_flags=a.get("fixed_flags") or [],
                   fixed_env=_mapping(a.get("fixed_env")), fingerprint=a.get(_FINGERPRINT),
                   bounds=a.get(_BOUNDS), ablation=_mapping(a.get(_ABLATION)))


def _mapping(v: Any) -> Mapping[str, Any] | None:
    return v if isinstance(v, dict) else None


def write_study_info(study: optuna.Study, info: StudyInfo) -> None:
    """Store `info`; the fingerprint goes last, so it marks a complete record."""
    skip = ("fingerprint", "bounds", "ablation")
    for key, value in vars(info).items():
        if key not in skip:
            study.set_user_attr(key, value)
    study.set_user_attr(_FINGERPRINT, info.fingerprint)


def set_bounds(study: optuna.Study, bounds: Mapping[str, Sequence[float]]) -> None:
    """The resolved `high: auto` bounds, kept from the first run for the record."""
    if _BOUNDS not in study.user_attrs:
        study.set_user_attr(_BOUNDS, dict(bounds))


def grid_seed(study: optuna.Study, seed: int) -> int:
    """The seed of the study's grid order: the first run's, kept for every resume."""
    if _GRID_SEED not in study.user_attrs:
        study.set_user_attr(_GRID_SEED, seed)
    return int(study.user_attrs[_GRID_SEED])


def set_ablation(study: optuna.Study, ablation: Mapping[str, Any]) -> None:
    study.set_user_attr(_ABLATION, dict(ablation))
