"""Build realistic tuner studies for the tests, following docs/architecture.md "What a trial stores".

The study loop is written elsewhere; these helpers write exactly the contract that loop writes
(user_attrs, constraints, study attrs) so select/export/report are tested against the contract,
not against the loop's implementation.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

# One short cell: a trial on the simulator in about a second (resume and grid tests)
TINY_WORKLOAD = """\
name: tiny
seed: 0
warmup: null
cells:
  - {concurrency: 2, input_len: 64, output_len: 8, num_prompts: 2}
objectives: ["max output_throughput"]
"""
OBJECTIVES = ["max output_throughput", "min p99_ttft_ms", "min p99_tpot_ms"]
DIRECTIONS = ["maximize", "minimize", "minimize"]
SLO = {"p99_ttft_ms": 2000.0, "p99_tpot_ms": 50.0}
WORST = [0.0, 1e9, 1e9]
CELLS = [
    {"concurrency": 4, "input_len": 4096, "output_len": 64},
    {"concurrency": 64, "input_len": 256, "output_len": 256},
]
FLAG_PARAMS = {"num_blocks": "--num-blocks", "block_size": "--block-size", "enable_graph": "--enable-graph"}
ENV_PARAMS = {"prefill_cap": "INFINILM_PREFILL_BATCH_CAP", "decode_first": "INFINILM_DECODE_FIRST_WHEN_RUNNING"}
DISTRIBUTIONS = {
    "num_blocks": IntDistribution(16, 512),
    "block_size": CategoricalDistribution([16, 32, 64, 128, 256]),
    "prefill_cap": IntDistribution(1, 64, log=True),
    "decode_first": CategoricalDistribution([False, True]),
    "enable_graph": CategoricalDistribution([False, True]),
}
BASE_ARGV = ["python", "python/infinilm/server/inference_server.py", "--model", "/models/tiny",
             "--host", "127.0.0.1", "--port", "18000", "--device", "nvidia", "--tp", "1"]
CAPACITY = 80 * 2**30


def render(params: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """What space.render would give for the test space: (argv, env)."""
    argv = list(BASE_ARGV)
    for name, flag in FLAG_PARAMS.items():
        value = params.get(name)
        if isinstance(value, bool):
            if value:
                argv.append(flag)
        elif value is not None:
            argv += [flag, str(value)]
    env = {"INFINILM_LOG_LEVEL": "info"}
    for name, var in ENV_PARAMS.items():
        value = params.get(name)
        if value is not None:
            env[var] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return argv, env


def _metrics(params: dict[str, Any], rng: random.Random) -> tuple[dict[str, float], list[dict]]:
    """Synthetic but monotone-ish metrics so the Pareto set is non-trivial."""
    kv = params["num_blocks"] * params["block_size"]
    cap = params["prefill_cap"]
    cells = []
    for i, cell in enumerate(CELLS):
        tput = 200.0 + kv / 400.0 + 60.0 * cap ** 0.5 + rng.uniform(-20, 20) + 50 * i
        ttft = 300.0 + 20.0 * cap + (0 if params["decode_first"] else 300.0) + 200 * i
        tpot = 15.0 + 0.3 * cap + (8.0 if params["enable_graph"] is False else 0.0) + 20 * i
        cells.append({"cell": dict(cell, num_prompts=8), "error_class": None,
                      "metrics": {"output_throughput": tput, "p99_ttft_ms": ttft, "p99_tpot_ms": tpot,
                                  "mean_ttft_ms": ttft * 0.6, "mean_tpot_ms": tpot * 0.8}})
    agg = {
        "output_throughput": sum(c["metrics"]["output_throughput"] for c in cells) / len(cells),
        "p99_ttft_ms": max(c["metrics"]["p99_ttft_ms"] for c in cells),
        "p99_tpot_ms": max(c["metrics"]["p99_tpot_ms"] for c in cells),
        "mean_ttft_ms": sum(c["metrics"]["mean_ttft_ms"] for c in cells) / len(cells),
        "mean_tpot_ms": sum(c["metrics"]["mean_tpot_ms"] for c in cells) / len(cells),
    }
    return agg, cells


def make_trial(number: int, params: dict[str, Any], *, outcome: str = "ok", rng: random.Random,
               study_dir: Path | None = None, extra_attrs: dict[str, Any] | None = None,
               ) -> optuna.trial.FrozenTrial:
    """One COMPLETE trial as the study loop stores it (failures get worst-case values)."""
    argv, env = render(params)
    attrs: dict[str, Any] = {"outcome": outcome, "argv": argv, "env": env,
                             "trial_dir": str((study_dir or Path("studies/demo")) / "trials" / str(number))}
    kv_bytes = params["num_blocks"] * params["block_size"] * 2**20
    attrs["predicted_peak_bytes"] = 20 * 2**30 + kv_bytes
    attrs["capacity_bytes"] = CAPACITY
    constraints = {"feasible": 0.0}
    if outcome == "ok":
        metrics, cells = _metrics(params, rng)
        values = [metrics["output_throughput"], metrics["p99_ttft_ms"], metrics["p99_tpot_ms"]]
        attrs.update(reason="", metrics=metrics, cells=cells)
        for key, limit in SLO.items():
            constraints[f"slo:{key}"] = (metrics[key] - limit) / limit
        if any(v > 0 for v in constraints.values()):
            attrs["outcome"] = "slo"  # the server ran, an SLO was missed: real values, infeasible
    else:
        values = list(WORST)
        attrs.update(reason=f"{outcome}: cudaMalloc failed: out of memory" if outcome == "oom"
                     else f"{outcome}: server exited", metrics={}, cells=[])
        constraints["feasible"] = 1.0
        for key in SLO:
            constraints[f"slo:{key}"] = 0.0
    attrs.update(extra_attrs or {})
    return optuna.create_trial(values=values, params=params, distributions=DISTRIBUTIONS,
                               user_attrs=attrs, constraints=constraints)


def make_study(storage: str | None = None, name: str = "demo", *, n_ok: int = 10, n_fail: int = 4,
               seed: int = 0, study_dir: Path | None = None, all_fail: bool = False,
               default_outcome: str | None = None) -> optuna.Study:
    """A study with a default trial (outcome `default_outcome`, else ok), `n_ok` ok trials and
    `n_fail` oom/crash trials."""
    rng = random.Random(seed)
    study = optuna.create_study(storage=storage, study_name=name, directions=DIRECTIONS)
    for key, value in {
        "space": "infinilm-test:abc123", "space_file": "search_spaces/infinilm.yaml",
        "workload": "quick", "model": "/models/TinyLlama-1.1B", "gpu": "NVIDIA H200 (141 GiB)",
        "objectives": OBJECTIVES, "tuner_version": "0.1.0", "flag_params": FLAG_PARAMS,
        "env_params": ENV_PARAMS, "slo": SLO,
    }.items():
        study.set_user_attr(key, value)
    default = {"num_blocks": 128, "block_size": 16, "prefill_cap": 1, "decode_first": False,
               "enable_graph": True}
    study.add_trial(make_trial(0, default, outcome=default_outcome or ("oom" if all_fail else "ok"),
                               rng=rng,
                               study_dir=study_dir, extra_attrs={"is_default": True}))
    for i in range(n_ok + n_fail):
        params = {
            "num_blocks": rng.randrange(16, 513),
            "block_size": rng.choice([16, 32, 64, 128, 256]),
            "prefill_cap": rng.choice([1, 2, 4, 8, 16, 32, 64]),
            "decode_first": rng.random() < 0.5,
            "enable_graph": rng.random() < 0.7,
        }
        outcome = "ok" if i < n_ok and not all_fail else ("oom" if i % 2 else "crash")
        if outcome == "oom":
            params["num_blocks"], params["block_size"] = 512, 256
        study.add_trial(make_trial(i + 1, params, outcome=outcome, rng=rng, study_dir=study_dir))
    return study


def make_study_dir(studies_dir: Path, name: str = "demo", **kwargs: Any) -> optuna.Study:
    """A study folder `studies_dir/name/study.db` as the tuner lays it out."""
    folder = studies_dir / name
    (folder / "trials").mkdir(parents=True, exist_ok=True)
    return make_study(f"sqlite:///{folder / 'study.db'}", name, study_dir=folder, **kwargs)


def run_cli(argv: list[str]) -> int:
    """Run export/inspect as the front door does: UsageError -> one line on stderr, exit 2."""
    import argparse
    import sys

    from tuner.commands import export, inspect
    from tuner.errors import UsageError

    parser = argparse.ArgumentParser(prog="tuner")
    sub = parser.add_subparsers(dest="command", required=True)
    export.add_parser(sub)
    inspect.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return 2
