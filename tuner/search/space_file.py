"""Load a search-space YAML file into a `SearchSpace`, refusing anything malformed.

Why every check names the file and the key: a space is written by hand for a server the tuner has
never seen, and the first trial is minutes away; a mistake must surface before anything runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tuner.errors import UsageError
from tuner.search.space import AUTO, FAILURE_CLASSES, Param, SearchSpace, ServerSpec, _has_newline

PARAM_TYPES = ("int", "float", "categorical", "bool")
_PARAM_KEYS = {"type", "low", "high", "step", "log", "choices", "flag", "env", "default",
               "true_value", "false_value", "help", "role", "divide_by", "within_context"}
_TOP_KEYS = {"name", "description", "server", "fixed_flags", "fixed_env", "parameters",
             "failure_patterns"}
_SERVER_KEYS = {"command", "simulator", "health_path", "startup_timeout_s", "api",
                "request_extra", "warmup_before_health", "model_name", "memory_cap",
                "prefill_steps"}


def _require(cond: bool, path: Path, key: str, msg: str) -> None:
    if not cond:
        raise UsageError(f"{path}: {key}: {msg}")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numeric(path: Path, key: str, ptype: str, spec: dict[str, Any]) -> dict[str, Any]:
    """low/high/step/log of an int or float knob; `high: auto` only for ints."""
    auto = spec.get("high") == AUTO
    _require(not auto or ptype == "int", path, f"{key}.high", "'auto' is for int parameters")
    for bound in ("low",) if auto else ("low", "high"):
        _require(_is_number(spec.get(bound)), path, f"{key}.{bound}",
                 "must be a number" + ("" if bound == "low" else " or 'auto'"))
    _require(auto or spec["low"] <= spec["high"], path, key,
             f"low ({spec['low']}) is greater than high ({spec.get('high')})")
    log = bool(spec.get("log", False))
    _require(not log or spec["low"] > 0, path, f"{key}.low", "must be > 0 with log: true")
    step = spec.get("step")
    _require(step is None or (_is_number(step) and step > 0), path, f"{key}.step",
             "must be a positive number")
    _require(not (log and step not in (None, 1)), path, key, "log and step cannot be combined")
    if ptype == "int":
        _require(float(spec["low"]).is_integer()
                 and (auto or float(spec["high"]).is_integer()), path, key,
                 "int bounds must be integers")
    return {"low": spec["low"], "high": None if auto else spec["high"], "step": step,
            "log": log, "high_auto": auto}


def _categorical(path: Path, key: str, spec: dict[str, Any]) -> dict[str, Any]:
    choices = spec.get("choices")
    if not isinstance(choices, list) or not choices:
        raise UsageError(f"{path}: {key}.choices: must be a non-empty list")
    _require(len(set(map(str, choices))) == len(choices), path, f"{key}.choices",
             "has duplicates")
    default = spec.get("default")
    _require(default is None or default in choices, path, f"{key}.default",
             f"{default!r} is not one of the choices")
    return {"choices": tuple(choices)}


def _transport(path: Path, key: str, spec: dict[str, Any]) -> None:
    """Exactly one of `flag` and `env`, each well formed."""
    _require(("flag" in spec) != ("env" in spec), path, key, "needs exactly one of 'flag' or 'env'")
    if "flag" in spec:
        _require(isinstance(spec["flag"], str) and spec["flag"].startswith("-"), path,
                 f"{key}.flag", "must be a string starting with '-'")
    else:
        _require(isinstance(spec["env"], str) and spec["env"].replace("_", "").isalnum(),
                 path, f"{key}.env", "must be an environment variable name")


def _parse_param(path: Path, name: str, spec: Any) -> Param:
    key = f"parameters.{name}"
    _require(isinstance(spec, dict), path, key, "must be a mapping")
    unknown = set(spec) - _PARAM_KEYS
    _require(not unknown, path, key, f"unknown key(s) {sorted(unknown)}")
    ptype = spec.get("type")
    _require(ptype in PARAM_TYPES, path, f"{key}.type",
             f"unknown parameter type {ptype!r} (expected one of {', '.join(PARAM_TYPES)})")
    _transport(path, key, spec)
    kw: dict[str, Any] = {"name": name, "type": ptype, "flag": spec.get("flag"),
                          "env": spec.get("env"), "default": spec.get("default"),
                          "help": str(spec.get("help", "")), "role": spec.get("role"),
                          "divide_by": spec.get("divide_by")}
    _require(kw["role"] is None or isinstance(kw["role"], str), path, f"{key}.role",
             "must be a string")
    _require(kw["divide_by"] is None or ptype == "int" and isinstance(kw["divide_by"], str), path,
             f"{key}.divide_by", "must name another parameter, on an int parameter")
    kw["within_context"] = spec.get("within_context", False)
    _require(kw["within_context"] is False or kw["within_context"] is True and ptype == "int",
             path, f"{key}.within_context", "must be true or false; true only on an int parameter")
    if ptype in ("int", "float"):
        kw.update(_numeric(path, key, ptype, spec))
    elif ptype == "categorical":
        kw.update(_categorical(path, key, spec))
    else:
        kw["true_value"] = str(spec.get("true_value", "1"))
        kw["false_value"] = str(spec.get("false_value", "0"))
    if kw["env"] is not None:
        values = [*map(str, kw.get("choices", ())), kw.get("true_value", ""),
                  kw.get("false_value", "")]
        _require(not any(_has_newline(v) for v in values), path, key,
                 f"a value of environment variable {kw['env']} contains a newline")
    return Param(**kw)


def _server(path: Path, server: Any) -> ServerSpec:
    _require(isinstance(server, dict), path, "server", "must be a mapping")
    unknown = set(server) - _SERVER_KEYS
    _require(not unknown, path, "server", f"unknown key(s) {sorted(unknown)}")
    for key in ("command", "simulator"):
        val = server.get(key)
        _require(val is None and key == "simulator" or
                 isinstance(val, list) and bool(val) and all(isinstance(a, str) for a in val),
                 path, f"server.{key}", "must be a non-empty list of strings")
    _require(server.get("api", "chat") in ("chat", "completions"), path, "server.api",
             "must be 'chat' or 'completions'")
    _require(server.get("memory_cap", "ballast") in ("ballast", "env"), path, "server.memory_cap",
             "must be 'ballast' (tuner holds the card above --gpu-memory-cap) or 'env' (the "
             "server caps itself at TUNER_GPU_MEMORY_CAP_GIB)")
    _require(server.get("prefill_steps", "mixed") in ("mixed", "separate"), path,
             "server.prefill_steps",
             "must be 'mixed' (a step may hold prefill chunks beside decodes) or 'separate' (a "
             "step prefills whole prompts or decodes, never both)")
    return ServerSpec(
        command=tuple(server["command"]),
        simulator=tuple(server["simulator"]) if server.get("simulator") else None,
        health_path=str(server.get("health_path", "/health")),
        startup_timeout_s=float(server.get("startup_timeout_s", 600)),
        api=str(server.get("api", "chat")),
        request_extra=dict(server.get("request_extra") or {}),
        warmup_before_health=bool(server.get("warmup_before_health", False)),
        model_name=server.get("model_name"),
        memory_cap=str(server.get("memory_cap", "ballast")),
        prefill_steps=str(server.get("prefill_steps", "mixed")))


def _parameters(path: Path, params: Any) -> tuple[Param, ...]:
    _require(isinstance(params, dict) and bool(params), path, "parameters",
             "must be a non-empty mapping")
    parsed = tuple(_parse_param(path, str(n), s) for n, s in params.items())
    names = {p.name for p in parsed}
    for p in parsed:
        _require(p.divide_by is None or p.divide_by in names and p.divide_by != p.name, path,
                 f"parameters.{p.name}.divide_by", f"{p.divide_by!r} is not another parameter")
    return parsed


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UsageError(f"search space file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: malformed YAML: {str(exc).splitlines()[0]}") from None
    _require(isinstance(raw, dict), path, "<top>", "must be a mapping")
    unknown = set(raw) - _TOP_KEYS
    _require(not unknown, path, "<top>", f"unknown key(s) {sorted(unknown)}")
    for key in ("name", "server", "parameters"):
        _require(key in raw, path, key, "missing")
    return raw


def load_space(path: str | Path) -> SearchSpace:
    """Load and validate a search-space file; every error names the file and the key."""
    path = Path(path)
    raw = _read(path)
    patterns = raw.get("failure_patterns") or {}
    _require(isinstance(patterns, dict) and set(patterns) <= set(FAILURE_CLASSES), path,
             "failure_patterns", f"keys must be among {', '.join(FAILURE_CLASSES)}")
    fixed_env = raw.get("fixed_env") or {}
    _require(isinstance(fixed_env, dict), path, "fixed_env", "must be a mapping")
    for env_key, env_value in fixed_env.items():
        _require(not _has_newline(str(env_value)), path, f"fixed_env.{env_key}",
                 "environment value contains a newline")
    fixed_flags = raw.get("fixed_flags") or []
    _require(isinstance(fixed_flags, list), path, "fixed_flags", "must be a list")
    return SearchSpace(
        name=str(raw["name"]), path=path, description=str(raw.get("description", "")),
        server=_server(path, raw["server"]), fixed_flags=tuple(str(a) for a in fixed_flags),
        fixed_env={str(k): str(v) for k, v in fixed_env.items()},
        parameters=_parameters(path, raw["parameters"]),
        failure_patterns={k: tuple(v or ()) for k, v in patterns.items()}, raw=raw)
