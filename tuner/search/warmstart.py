"""Warm starts: configs worth running first, enqueued with `study.enqueue_trial`.

Why: the sampler's first trials are random; a known-good config (the server's defaults, a
hand-tuned seed config, the Pareto set of an earlier study on a similar card) gives it a
feasible anchor from trial 0, which matters most when a trial costs minutes.  Every config is
clipped into the (adapted) space first: a previous study's 512 blocks may not fit this card's
range, and an out-of-range enqueued value would be rejected by Optuna.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import optuna
import yaml

from tuner.errors import UsageError
from tuner.output import envfile
from tuner.output.select import feasible_front, study_objectives
from tuner.search.space import SearchSpace
from tuner.study.record import records


def clip_to_space(space: SearchSpace, params: dict[str, Any]) -> dict[str, Any]:
    """Clip a config into the space: numbers into [low, high] and onto the step, bools from
    their env spelling, categoricals kept only when they are a choice; unknown names dropped."""
    out: dict[str, Any] = {}
    for p in space.parameters:
        value = params.get(p.name)
        if value is None:
            continue
        if p.type in ("int", "float"):
            lo, hi = p.bounds
            try:
                num = min(max(float(value), lo), hi)
            except (TypeError, ValueError):
                continue
            if p.step:
                num = lo + math.floor((num - lo) / p.step + 1e-9) * p.step
            out[p.name] = int(round(num)) if p.type == "int" else num
        elif p.type == "bool":
            out[p.name] = (
                value if isinstance(value, bool) else str(value) in (p.true_value, "true", "True")
            )
        else:
            match = [c for c in p.choices if str(c) == str(value)]
            if match:
                out[p.name] = match[0]
    return out


def _from_env(space: SearchSpace, env: dict[str, str]) -> dict[str, Any]:
    """Params from an env file: env-knobs by variable name, flag-knobs from TUNER_SERVER_ARGS."""
    params: dict[str, Any] = {
        p.name: env[p.env] for p in space.parameters if p.env and p.env in env
    }
    args = (
        envfile.decode_server_args(env[envfile.SERVER_ARGS_VAR])
        if envfile.SERVER_ARGS_VAR in env
        else []
    )
    for p in space.parameters:
        if p.flag and p.flag in args:
            if p.type == "bool":
                params[p.name] = True
                continue
            i = args.index(p.flag)
            if i + 1 < len(args):
                params[p.name] = args[i + 1]
        elif p.flag and p.type == "bool" and args:
            params[p.name] = False
    for p in space.parameters:  # a tokens knob arrives as blocks
        if p.divide_by and p.name in params:
            params[p.name] = space.from_rendered(p, params[p.name], params)
    return params


def load_seed_config(space: SearchSpace, path: str | Path) -> dict[str, Any]:
    """A config from YAML/JSON ({knob: value}) or an env file (best.env), clipped to the space."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"--seed-config {path}: cannot read: {exc.strerror}") from None
    if path.suffix in (".yaml", ".yml", ".json"):
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise UsageError(
                f"--seed-config {path}: malformed: {str(exc).splitlines()[0]}"
            ) from None
        if not isinstance(data, dict):
            raise UsageError(f"--seed-config {path}: expected a mapping of knob: value")
        unknown = set(data) - {p.name for p in space.parameters}
        if unknown:
            raise UsageError(f"--seed-config {path}: unknown knob(s) {sorted(unknown)}")
        params = data
    else:
        params = _from_env(space, envfile.parse(text))
    clipped = clip_to_space(space, params)
    if not clipped:
        raise UsageError(f"--seed-config {path}: no knob of space '{space.name}' found")
    return clipped


def pareto_configs(study: optuna.Study, space: SearchSpace) -> list[dict[str, Any]]:
    """The feasible Pareto set of an earlier study, clipped into this space."""
    front = feasible_front(records(study), study_objectives(study))
    return [clip_to_space(space, dict(t.params)) for t in front]


def enqueue(study: optuna.Study, configs: list[dict[str, Any]],
            user_attrs: dict[str, Any] | None = None) -> int:
    """Enqueue configs not already in the study (run or queued); returns how many were added."""
    before = len(study.get_trials(deepcopy=False))
    for params in configs:
        if params:
            study.enqueue_trial(params, user_attrs=user_attrs, skip_if_exists=True)
    return len(study.get_trials(deepcopy=False)) - before
