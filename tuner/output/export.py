"""Turn a chosen trial into a deployable config (env | json | yaml) with provenance.

Values come from what the server actually got -- the trial record's `env` and `argv` -- with the
study record's `env_params` (param -> env var) and `flag_params` (param -> flag) saying which of
them are tuned, so the export does not depend on the search-space loader.
"""

from __future__ import annotations

import datetime as _dt
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
import yaml

import tuner
from tuner.errors import UsageError
from tuner.output import envfile
from tuner.output.ablation import NO_EFFECT
from tuner.output.numbers import fmt
from tuner.output.select import Choice, study_objectives
from tuner.search.objectives import unit
from tuner.study.record import TrialRecord
from tuner.study.study_record import StudyInfo

FORMATS = ("env", "json", "yaml")
# metrics worth a header line; json/yaml carry them all
HEADER_METRICS = (
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "p99_itl_ms",
    "p99_e2el_ms",
    "completed",
    "failed",
)


@dataclass
class ExportConfig:
    """What to deploy: env vars, server argument tokens, and where they came from."""

    env: dict[str, str]
    server_args: list[str]
    params: dict[str, Any]
    provenance: dict[str, Any] = field(default_factory=dict)


def _flag_tokens(argv: Sequence[str], flag: str) -> list[str]:
    """The tokens of one flag in argv: [flag, value], [flag=value], [flag] (a switch) or []."""
    for i in range(len(argv) - 1, -1, -1):
        tok = argv[i]
        if tok.startswith(flag + "="):
            return [tok]
        if tok == flag:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            return [flag] if nxt is None or nxt.startswith("--") else [flag, nxt]
    return []


def tuned_env(trial: TrialRecord, env_params: Mapping[str, str]) -> dict[str, str]:
    """The env vars of the tuned parameters as the server got them (unset ones left out)."""
    return {var: trial.env[var] for var in env_params.values() if var in trial.env}


def tuned_args(trial: TrialRecord, flag_params: Mapping[str, str]) -> list[str]:
    """The argv tokens of the tuned flag parameters, in the order the server got them.

    A bool param is a switch (present or absent), so only its flag is taken; others take the
    flag's value too (`--flag value` or `--flag=value`, as rendered).
    """
    argv = list(trial.argv)
    found = []
    for param, flag in flag_params.items():
        if isinstance(trial.params.get(param), bool):
            toks = [flag] if flag in argv else []
        else:
            toks = _flag_tokens(argv, flag)
        if toks:
            pos = max(i for i, a in enumerate(argv) if a == toks[0])
            found.append((pos, toks))
    return [tok for _, toks in sorted(found) for tok in toks]


def build(study: optuna.Study, choice: Choice, *, now: _dt.datetime | None = None) -> ExportConfig:
    """The export of `choice.trial` with a provenance record."""
    trial = choice.trial
    meta = StudyInfo.of(study)
    if not trial.argv and not trial.env:
        raise UsageError(f"trial {trial.number} has no recorded argv/env; was it run by the tuner?")
    if meta.flag_params is None or meta.env_params is None:
        raise UsageError(f"study {study.study_name!r} does not record which flags and variables "
                         "are tuned, so the tuned knobs cannot be told apart from the fixed ones")
    objectives = study_objectives(study)
    provenance = {
        "tuner_version": meta.tuner_version or tuner.__version__,
        "exported_by": tuner.__version__,
        "date": (now or _dt.datetime.now(_dt.timezone.utc)).isoformat(timespec="seconds"),
        "study": study.study_name,
        "trial": trial.number,
        "pick": choice.rule,
        "pareto_trials": [t.number for t in choice.pareto],
        "model": meta.model,
        "gpu": meta.gpu,
        "space": meta.space,
        "space_file": meta.space_file,
        "workload": meta.workload,
        "simulated": meta.simulated,
        "objectives": [str(o) for o in objectives],
        "values": {o.metric: v for o, v in zip(objectives, trial.values or ())},
        "metrics": dict(trial.metrics),
        "slo": dict(meta.slo),
        "no_effect": _no_effect(meta),
    }
    env = {**(meta.fixed_env or {}), **tuned_env(trial, meta.env_params)}
    args = [*meta.fixed_flags, *tuned_args(trial, meta.flag_params)]
    provenance["launch"] = (launch_line(meta.server_head, args, env) if meta.server_head
                            else envfile.server_args_line(list(trial.argv)))
    provenance["launch_is_real"] = bool(meta.server_head)
    return ExportConfig(env=env, server_args=args, params=dict(trial.params),
                        provenance=provenance)


def launch_line(head: Sequence[str], args: Sequence[str], env: Mapping[str, str]) -> str:
    """The shell line that starts the real server with the picked config: env, command, flags."""
    return " ".join([*(shlex.quote(f"{k}={v}") for k, v in env.items()),
                     *(shlex.quote(a) for a in (*head, *args))])


def _no_effect(meta: StudyInfo) -> dict[str, Any] | None:
    """Knobs `tuner ablate` found dead on this server, by the names the deployment sees."""
    if meta.ablation is None:
        return None
    names = {**(meta.flag_params or {}), **(meta.env_params or {})}
    verdicts = meta.ablation.get("verdicts") or {}
    dead = [names.get(k, k) for k, v in verdicts.items() if v == NO_EFFECT]
    return {"base_trial": meta.ablation.get("base_trial"), "knobs": dead} if dead else None


def _fmt(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _metric(name: str, value: Any) -> str:
    """`p99_ttft_ms=3284.8 ms`: rounded, with its unit, no comma inside the number."""
    return f"{name}={fmt(value, group=False)} {unit(name)}".rstrip()


def env_header(cfg: ExportConfig) -> list[str]:
    """Comment lines for best.env: provenance, the metrics, and how to use the args variable."""
    p = cfg.provenance
    lines = [
        f"best config exported by tuner {p['exported_by']} on {p['date']}",
        f"study: {p['study']}  trial: {p['trial']}  pick: {p['pick']}",
        f"study tuner version: {p['tuner_version']}",
        f"model: {p['model']}",
        f"gpu: {p['gpu']}",
        f"search space: {p['space']} ({p['space_file']})  workload: {p['workload']}",
        *(["WARNING: measured on the simulator, not on a real server"] if p["simulated"] else []),
        "objectives: " + ", ".join(_metric(k, v) for k, v in p["values"].items()),
    ]
    shown = [(k, p["metrics"][k]) for k in HEADER_METRICS if k in p["metrics"]]
    for i in range(0, len(shown), 4):
        lines.append("metrics: " + ", ".join(_metric(k, v) for k, v in shown[i:i + 4]))
    if p.get("no_effect"):
        lines.append(
            f"tuner ablate (around trial {p['no_effect']['base_trial']}): no effect on this "
            f"server, within the noise: {', '.join(p['no_effect']['knobs'])}"
        )
    lines += ["params: " + ", ".join(f"{k}={v}" for k, v in cfg.params.items()),
              *([f"SLO: {', '.join(f'{k}<={_fmt(v)}' for k, v in p['slo'].items())}"]
                if p.get("slo") else []),
              (f"launch: {p['launch']}" if p.get("launch_is_real")
               else f"launch (as tried): {p['launch']}"),
              f"{envfile.SERVER_ARGS_VAR} holds every flag after the command (fixed and tuned),",
              "comma-separated (no spaces, so docker, systemd and bash read it alike);",
              "expand with: IFS=, read -ra ARGS <<<\"$"
              f"{envfile.SERVER_ARGS_VAR}\""]
    return lines


def render(cfg: ExportConfig, fmt: str) -> str:
    """The export text in `fmt` (env | json | yaml)."""
    if fmt == "env":
        env = dict(cfg.env)
        if envfile.SERVER_ARGS_VAR in env:
            raise UsageError(
                f"env param {envfile.SERVER_ARGS_VAR} clashes with the server args variable"
            )
        env[envfile.SERVER_ARGS_VAR] = envfile.encode_server_args(cfg.server_args)
        return envfile.render(env, env_header(cfg))
    doc = {"provenance": cfg.provenance, "env": cfg.env, "server_args": cfg.server_args,
           "params": cfg.params}
    if fmt == "json":
        return json.dumps(doc, indent=2, default=str) + "\n"
    if fmt == "yaml":
        return yaml.safe_dump(json.loads(json.dumps(doc, default=str)), sort_keys=False)
    raise UsageError(f"unknown --format {fmt!r} (choose from {', '.join(FORMATS)})")
