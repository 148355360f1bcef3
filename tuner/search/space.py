"""Search spaces: one YAML file per server says how a config reaches that server.

A space declares the launch command, the health path, each knob's range and whether it travels
as a command-line flag or an environment variable, and the log patterns that tell an OOM from a
crash.  Adding a server is one YAML file; nothing here knows about a particular server.  The
format is documented in docs/architecture.md and docs/targets.md.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml

from tuner.errors import UsageError

PARAM_TYPES = ("int", "float", "categorical", "bool")
FAILURE_CLASSES = ("oom", "startup", "unhealthy", "crash")
_PARAM_KEYS = {"type", "low", "high", "step", "log", "choices", "flag", "env", "default",
               "true_value", "false_value", "help", "role", "divide_by"}
AUTO = "auto"  # `high: auto`: the bound is computed from the model and GPU (tuner.search.bounds)
_TOP_KEYS = {"name", "description", "server", "fixed_flags", "fixed_env", "parameters",
             "failure_patterns"}
_SERVER_KEYS = {"command", "simulator", "health_path", "startup_timeout_s", "api",
                "request_extra", "warmup_before_health", "model_name", "memory_cap"}


@dataclass(frozen=True)
class Param:
    """One knob: its Optuna distribution and how its value reaches the server."""

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    flag: str | None = None
    env: str | None = None
    default: Any = None
    true_value: str = "1"
    false_value: str = "0"
    help: str = ""
    role: str | None = None        # what the knob means to the memory model (tuner.trial.memory_estimate.ROLES)
    divide_by: str | None = None   # rendered as value // params[divide_by] (tokens -> blocks)
    high_auto: bool = False        # `high: auto` in the YAML; `high` is None until resolved

    def distribution(self) -> optuna.distributions.BaseDistribution:
        if self.high is None and self.type in ("int", "float"):
            raise UsageError(f"parameter {self.name}: 'high: auto' is not resolved yet "
                             "(tuner.search.bounds.resolve_space needs the model and GPU memory)")
        if self.type == "int":
            return optuna.distributions.IntDistribution(
                int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        if self.type == "float":
            return optuna.distributions.FloatDistribution(
                float(self.low), float(self.high), log=self.log, step=self.step)
        if self.type == "bool":
            return optuna.distributions.CategoricalDistribution((False, True))
        return optuna.distributions.CategoricalDistribution(self.choices)

    def render_value(self, value: Any) -> str:
        if self.type == "bool":
            return self.true_value if value else self.false_value
        if self.type == "float":
            return repr(round(float(value), 10))  # 0.68, not 0.6800000000000002 from a stepped float
        return str(value)

    def describe(self) -> str:
        if self.high is None and self.type in ("int", "float"):
            rng = f"[{self.low:g}, auto]"
        elif self.type in ("int", "float"):
            rng = f"[{self.low:g}, {self.high:g}]" + (" log" if self.log else "")
        elif self.type == "bool":
            rng = "{false, true}"
        else:
            rng = "{" + ", ".join(str(c) for c in self.choices) + "}"
        return rng


@dataclass(frozen=True)
class ServerSpec:
    """How to start the server and talk to it."""

    command: tuple[str, ...]
    simulator: tuple[str, ...] | None = None
    health_path: str = "/health"
    startup_timeout_s: float = 600.0
    api: str = "chat"
    request_extra: dict[str, Any] = field(default_factory=dict)
    warmup_before_health: bool = False
    model_name: str | None = None
    memory_cap: str = "ballast"   # how --gpu-memory-cap reaches it: "env" or a ballast process


@dataclass(frozen=True)
class SearchSpace:
    """A loaded, validated search-space file."""

    name: str
    path: Path
    description: str
    server: ServerSpec
    fixed_flags: tuple[str, ...]
    fixed_env: dict[str, str]
    parameters: tuple[Param, ...]
    failure_patterns: dict[str, tuple[str, ...]]
    raw: dict[str, Any]

    def param(self, name: str) -> Param:
        for p in self.parameters:
            if p.name == name:
                return p
        raise KeyError(name)

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {p.name: p.distribution() for p in self.parameters}

    def default_params(self) -> dict[str, Any]:
        """The server's own defaults, for the knobs that have one."""
        return {p.name: p.default for p in self.parameters if p.default is not None}

    def fingerprint(self) -> str:
        """Stable hash of the parameters and how they reach the server.

        A study stores it so that resuming with an edited space is refused instead of mixing
        trials sampled from two different spaces.
        """
        blob = json.dumps({"parameters": self.raw.get("parameters"),
                           "fixed_flags": self.raw.get("fixed_flags"),
                           "fixed_env": self.raw.get("fixed_env")}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def render(self, params: dict[str, Any], *, model: str, host: str, port: int,
               max_output_len: int, simulate: str | None = None,
               extra_placeholders: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
        """The exact argv and environment the server gets for `params`.

        Parameters absent from `params` are left unset (flag omitted, variable not exported),
        which is how the server's own defaults are rendered.
        """
        subst = {"model": model, "host": host, "port": str(port), "python": sys.executable,
                 "max_output_len": str(max_output_len), "gpu": simulate or ""}
        subst.update(extra_placeholders or {})
        if simulate is not None:
            if self.server.simulator is None:
                raise UsageError(f"{self.path}: search space '{self.name}' has no "
                                 "server.simulator entry, so it cannot run with --simulate")
            head = self.server.simulator
        else:
            head = self.server.command
        argv = [_fill(a, subst, self.path) for a in (*head, *self.fixed_flags)]
        env = {k: _fill(str(v), subst, self.path) for k, v in self.fixed_env.items()}
        for p in self.parameters:
            if p.name not in params or params[p.name] is None:
                continue
            value = params[p.name]
            if p.divide_by is not None:
                value = tokens_to_blocks(value, self._divisor(p, params))
            if p.flag is not None:
                if p.type == "bool":
                    if value:
                        argv.append(p.flag)
                else:
                    argv += [p.flag, p.render_value(value)]
            else:
                env[p.env] = p.render_value(value)
        for key, val in env.items():
            if _has_newline(val):
                raise UsageError(f"{self.path}: environment value for {key} contains a newline")
        return argv, env

    def from_rendered(self, p: Param, rendered: Any, params: dict[str, Any]) -> int:
        """The sampled value of a `divide_by` knob from what the server got (blocks -> tokens)."""
        assert p.divide_by is not None
        return blocks_to_tokens(rendered, params.get(p.divide_by, self.param(p.divide_by).default))

    def _divisor(self, p: Param, params: dict[str, Any]) -> Any:
        """The value `p` is divided by when rendered: the sampled one, else that knob's default."""
        value = params.get(p.divide_by)
        if value is None:
            value = self.param(p.divide_by).default
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise UsageError(f"{self.path}: parameters.{p.name}.divide_by: {p.divide_by} has no "
                             f"positive integer value to divide by (got {value!r})")
        return value


def tokens_to_blocks(tokens: Any, block_size: Any) -> int:
    """KV capacity in tokens -> whole blocks of `block_size` (what --num-blocks gets)."""
    return int(tokens) // int(block_size)


def blocks_to_tokens(blocks: Any, block_size: Any) -> int:
    return int(blocks) * int(block_size)


def _fill(template: str, subst: dict[str, str], path: Path) -> str:
    try:
        return template.format(**subst)
    except (KeyError, IndexError, ValueError) as exc:
        raise UsageError(f"{path}: unknown placeholder {exc} in '{template}' "
                         f"(known: {', '.join(sorted(subst))})") from None


def _require(cond: bool, path: Path, key: str, msg: str) -> None:
    if not cond:
        raise UsageError(f"{path}: {key}: {msg}")


def _parse_param(path: Path, name: str, spec: Any) -> Param:
    key = f"parameters.{name}"
    _require(isinstance(spec, dict), path, key, "must be a mapping")
    unknown = set(spec) - _PARAM_KEYS
    _require(not unknown, path, key, f"unknown key(s) {sorted(unknown)}")
    ptype = spec.get("type")
    _require(ptype in PARAM_TYPES, path, f"{key}.type",
             f"unknown parameter type {ptype!r} (expected one of {', '.join(PARAM_TYPES)})")
    _require(("flag" in spec) != ("env" in spec), path, key,
             "needs exactly one of 'flag' or 'env'")
    if "flag" in spec:
        _require(isinstance(spec["flag"], str) and spec["flag"].startswith("-"), path,
                 f"{key}.flag", "must be a string starting with '-'")
    else:
        _require(isinstance(spec["env"], str) and spec["env"].replace("_", "").isalnum(),
                 path, f"{key}.env", "must be an environment variable name")
    kw: dict[str, Any] = {"name": name, "type": ptype, "flag": spec.get("flag"),
                          "env": spec.get("env"), "default": spec.get("default"),
                          "help": str(spec.get("help", "")), "role": spec.get("role"),
                          "divide_by": spec.get("divide_by")}
    _require(kw["role"] is None or isinstance(kw["role"], str), path, f"{key}.role", "must be a string")
    _require(kw["divide_by"] is None or ptype == "int" and isinstance(kw["divide_by"], str), path,
             f"{key}.divide_by", "must name another parameter, on an int parameter")
    if ptype in ("int", "float"):
        auto = spec.get("high") == AUTO
        _require(not auto or ptype == "int", path, f"{key}.high", "'auto' is for int parameters")
        for bound in ("low",) if auto else ("low", "high"):
            _require(isinstance(spec.get(bound), (int, float)) and not isinstance(spec.get(bound), bool),
                     path, f"{key}.{bound}", "must be a number" + ("" if bound == "low" else " or 'auto'"))
        _require(auto or spec["low"] <= spec["high"], path, key,
                 f"low ({spec['low']}) is greater than high ({spec.get('high')})")
        log = bool(spec.get("log", False))
        _require(not log or spec["low"] > 0, path, f"{key}.low", "must be > 0 with log: true")
        step = spec.get("step")
        _require(step is None or (isinstance(step, (int, float)) and step > 0), path,
                 f"{key}.step", "must be a positive number")
        _require(not (log and step not in (None, 1)), path, key, "log and step cannot be combined")
        if ptype == "int":
            _require(float(spec["low"]).is_integer() and (auto or float(spec["high"]).is_integer()),
                     path, key, "int bounds must be integers")
        kw.update(low=spec["low"], high=None if auto else spec["high"], step=step, log=log,
                  high_auto=auto)
    elif ptype == "categorical":
        choices = spec.get("choices")
        _require(isinstance(choices, list) and len(choices) > 0, path, f"{key}.choices",
                 "must be a non-empty list")
        _require(len(set(map(str, choices))) == len(choices), path, f"{key}.choices",
                 "has duplicates")
        kw["choices"] = tuple(choices)
        _require(kw["default"] is None or kw["default"] in choices, path, f"{key}.default",
                 f"{kw['default']!r} is not one of the choices")
    else:
        kw["true_value"] = str(spec.get("true_value", "1"))
        kw["false_value"] = str(spec.get("false_value", "0"))
    if kw["env"] is not None:
        values = [*map(str, kw.get("choices", ())), kw.get("true_value", ""), kw.get("false_value", "")]
        _require(not any(_has_newline(v) for v in values), path, key,
                 f"a value of environment variable {kw['env']} contains a newline")
    return Param(**kw)


def _has_newline(value: str) -> bool:
    """An environment value that cannot be passed on: env files and `export` lines break."""
    return "\n" in value or "\r" in value or "\0" in value


def load_space(path: str | Path) -> SearchSpace:
    """Load and validate a search-space file; every error names the file and the key."""
    path = Path(path)
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
    server = raw["server"]
    _require(isinstance(server, dict), path, "server", "must be a mapping")
    unknown = set(server) - _SERVER_KEYS
    _require(not unknown, path, "server", f"unknown key(s) {sorted(unknown)}")
    for key in ("command", "simulator"):
        val = server.get(key)
        _require(val is None and key == "simulator" or
                 isinstance(val, list) and val and all(isinstance(a, str) for a in val),
                 path, f"server.{key}", "must be a non-empty list of strings")
    _require(server.get("api", "chat") in ("chat", "completions"), path, "server.api",
             "must be 'chat' or 'completions'")
    _require(server.get("memory_cap", "ballast") in ("ballast", "env"), path, "server.memory_cap",
             "must be 'ballast' (tuner holds the card above --gpu-memory-cap) or 'env' (the "
             "server caps itself at TUNER_GPU_MEMORY_CAP_GIB)")
    params = raw["parameters"]
    _require(isinstance(params, dict) and params, path, "parameters", "must be a non-empty mapping")
    parsed = tuple(_parse_param(path, str(n), s) for n, s in params.items())
    names = {p.name for p in parsed}
    for p in parsed:
        _require(p.divide_by is None or p.divide_by in names and p.divide_by != p.name, path,
                 f"parameters.{p.name}.divide_by", f"{p.divide_by!r} is not another parameter")
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
        server=ServerSpec(
            command=tuple(server["command"]),
            simulator=tuple(server["simulator"]) if server.get("simulator") else None,
            health_path=str(server.get("health_path", "/health")),
            startup_timeout_s=float(server.get("startup_timeout_s", 600)),
            api=str(server.get("api", "chat")),
            request_extra=dict(server.get("request_extra") or {}),
            warmup_before_health=bool(server.get("warmup_before_health", False)),
            model_name=server.get("model_name"),
            memory_cap=str(server.get("memory_cap", "ballast"))),
        fixed_flags=tuple(str(a) for a in fixed_flags),
        fixed_env={str(k): str(v) for k, v in fixed_env.items()},
        parameters=parsed,
        failure_patterns={k: tuple(v or ()) for k, v in patterns.items()},
        raw=raw,
    )
