"""Search spaces: one YAML file per server says how a config reaches that server.

A space declares the launch command, the health path, each knob's range and whether it travels
as a command-line flag or an environment variable, and the log patterns that tell an OOM from a
crash.  Adding a server is one YAML file; nothing here knows about a particular server.  The
format is documented in docs/architecture.md and docs/targets.md; `tuner.search.space_file`
loads and validates it into the types here.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from tuner.errors import UsageError

FAILURE_CLASSES = ("oom", "startup", "unhealthy", "crash")
LIMIT_ROLES = ("max_batch", "prefill_batch_cap", "decode_batch_cap", "long_max_batch",
               "long_threshold")
BUDGET_ROLES = ("prefill_token_budget", "checked_token_budget")
AUTO = "auto"  # `high: auto`: the bound is computed from the model and GPU (tuner.search.bounds)


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
    role: str | None = (
        None  # what the knob means to the memory model (tuner.trial.memory_estimate.ROLES)
    )
    divide_by: str | None = None   # rendered as value // params[divide_by] (tokens -> blocks)
    high_auto: bool = False        # `high: auto` in the YAML; `high` is None until resolved
    within_context: bool = False   # the server refuses a value over the model's context length

    @property
    def bounds(self) -> tuple[float, float]:
        """(low, high) of a numeric knob, once `high: auto` is resolved."""
        if self.low is None or self.high is None:
            raise UsageError(f"parameter {self.name}: 'high: auto' is not resolved yet "
                             "(tuner.search.bounds.resolve_space needs the model and GPU memory)")
        return float(self.low), float(self.high)

    def distribution(self) -> optuna.distributions.BaseDistribution:
        if self.type == "int":
            lo, hi = self.bounds
            return optuna.distributions.IntDistribution(
                int(lo), int(hi), log=self.log, step=int(self.step or 1))
        if self.type == "float":
            lo, hi = self.bounds
            return optuna.distributions.FloatDistribution(lo, hi, log=self.log, step=self.step)
        if self.type == "bool":
            return optuna.distributions.CategoricalDistribution((False, True))
        return optuna.distributions.CategoricalDistribution(self.choices)

    def render_value(self, value: Any) -> str:
        if self.type == "bool":
            return self.true_value if value else self.false_value
        if self.type == "float":
            return repr(
                round(float(value), 10)
            )  # 0.68, not 0.6800000000000002 from a stepped float
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
    prefill_steps: str = "mixed"  # "separate": a step prefills whole prompts or decodes, not both


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

    def limits(self) -> list[str]:
        """The knobs that cap the requests of one step (batch caps, and the long-context
        guard's threshold: the larger, the fewer requests it holds apart): at the top of its
        range each caps least.  Token budgets are not among them: a budget's forward takes
        memory from the KV pool (`tuner.study.pool_trades`), so its top is not free."""
        return [p.name for p in self.parameters if p.role in LIMIT_ROLES]

    def budgets(self) -> list[str]:
        """The token budgets of one step: a floor relief the memory model cannot rank lowers
        one of them first (`tuner.study.pool_trades.floor_relief`)."""
        return [p.name for p in self.parameters if p.role in BUDGET_ROLES]

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

    def render(
        self,
        params: dict[str, Any],
        *,
        model: str,
        host: str,
        port: int,
        max_output_len: int,
        simulate: str | None = None,
        extra_placeholders: dict[str, str] | None = None,
    ) -> tuple[list[str], dict[str, str]]:
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
            elif p.env is not None:
                env[p.env] = p.render_value(value)
        for key, val in env.items():
            if _has_newline(val):
                raise UsageError(f"{self.path}: environment value for {key} contains a newline")
        return argv, env

    def from_rendered(self, p: Param, rendered: Any, params: dict[str, Any]) -> int:
        """The sampled value of a `divide_by` knob from what the server got (blocks -> tokens)."""
        name = p.divide_by or ""
        return blocks_to_tokens(rendered, params.get(name, self.param(name).default))

    def _divisor(self, p: Param, params: dict[str, Any]) -> Any:
        """The value `p` is divided by when rendered: the sampled one, else that knob's default."""
        name = p.divide_by or ""
        value = params.get(name)
        if value is None:
            value = self.param(name).default
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


def _has_newline(value: str) -> bool:
    """An environment value that cannot be passed on: env files and `export` lines break."""
    return "\n" in value or "\r" in value or "\0" in value
