"""Run the server's default config, any labelled configs and the study's pick side by side.

Runs alternate (default, LABEL..., tuned, default, ...) so that drift of the machine hits all
alike, and
every run is a full trial through the tuner's own `run_trial` (fresh server, warm-up, the
study's workload).  Prints a table and writes a JSON summary with the medians.

    python benchmarks/h200/side_by_side.py --study NAME --studies-dir DIR --model DIR \
        --space FILE --workload FILE [--gpu-memory-cap 24GiB] [--repeats 3] \
        [--pick max-throughput] [--config seed=seed.yaml ...] -o out.json

`--config LABEL=FILE` adds a hand config (YAML/JSON knob: value, or an env file, as `tune
--seed-config` reads it); a run that fails (OOM, unhealthy) is recorded with its outcome and
left out of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import optuna

from tuner.commands.tune_options import capacity_bytes
from tuner.output.select import choose
from tuner.search.bounds import resolve_space
from tuner.search.model import load_model_info
from tuner.search.space import SearchSpace
from tuner.search.space_file import load_space
from tuner.search.warmstart import load_seed_config
from tuner.search.workload import load_workload
from tuner.server.gpu import read_gpu, visible_gpu_index
from tuner.server.memcap import memory_cap
from tuner.study.record import TrialRecord
from tuner.trial.context import TrialContext
from tuner.trial.run import run_trial

KEYS = ("output_throughput", "p99_ttft_ms", "p99_tpot_ms", "mean_ttft_ms", "mean_tpot_ms", "p99_itl_ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", required=True)
    ap.add_argument("--studies-dir", default="studies")
    ap.add_argument("--model", required=True)
    ap.add_argument("--space", required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--gpu-memory-cap")
    ap.add_argument("--simulate", metavar="GPU", help="dry run on the built-in simulator")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pick", default="max-throughput")
    ap.add_argument("--config", action="append", default=[], metavar="LABEL=FILE",
                    help="repeatable: a labelled hand config to run beside default and tuned")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{Path(args.studies_dir) / args.study / 'study.db'}"
    study = optuna.load_study(study_name=args.study, storage=storage)
    chosen = choose(study, args.pick).trial
    gpu = None if args.simulate else read_gpu(visible_gpu_index())
    workload = load_workload(args.workload)
    # `high: auto` bounds resolved as tune resolved them: a hand config is clipped into them
    space = resolve_space(load_space(args.space), load_model_info(args.model),
                          capacity_bytes(args, gpu), workload.cells)
    with memory_cap(space, args.gpu_memory_cap, gpu, simulate=args.simulate is not None) as cap:
        ctx = TrialContext(space=space, workload=workload, model_dir=args.model,
                           simulate=args.simulate, time_scale=50.0, **cap.trial_fields())
        return _compare(args, chosen, space, ctx)


def _compare(args: argparse.Namespace, chosen: TrialRecord, space: SearchSpace,
             ctx: TrialContext) -> int:
    configs = {"default": space.default_params()}
    for item in args.config:
        label, _, path = item.partition("=")
        if not label or not path or label in ("default", "tuned"):
            raise SystemExit(f"--config {item!r}: expected LABEL=FILE, LABEL not default/tuned")
        configs[label] = load_seed_config(space, path)
    configs["tuned"] = dict(chosen.params)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    base = Path(args.studies_dir) / args.study / "side_by_side"
    summary = _summary(args, chosen, configs, runs)
    for i in range(args.repeats):
        for name, params in configs.items():
            if _failed_at_startup(runs[name]):
                continue   # a pool that cannot be allocated fails the same way every time
            res = run_trial(ctx, params, base / f"{name}-{i}")
            metrics = {k: res.metrics.get(k) for k in KEYS}
            runs[name].append({"run": i, "outcome": res.outcome.kind, "reason": res.outcome.reason,
                               "metrics": metrics, "wall_s": round(res.wall_s, 1)})
            figures = "  ".join(f"{k}={v:.1f}" for k, v in metrics.items() if v is not None)
            print(f"{name:8s} run {i}: {res.outcome.kind:9s} {res.outcome.reason or ''} {figures}",
                  flush=True)
            summary = _summary(args, chosen, configs, runs)
            Path(args.output).write_text(json.dumps(summary, indent=1, default=str))
    _print_table(summary, args.repeats)
    return 0


def _failed_at_startup(rows: list[dict]) -> bool:
    return bool(rows) and rows[0]["outcome"] == "oom" and "start-up" in (rows[0]["reason"] or "")


def _summary(args: argparse.Namespace, chosen: TrialRecord, configs: dict,
             runs: dict[str, list[dict[str, Any]]]) -> dict:
    medians = {name: {k: _median([r["metrics"][k] for r in rows if r["outcome"] == "ok"])
                      for k in KEYS} for name, rows in runs.items()}
    return {"study": args.study, "chosen_trial": chosen.number, "pick": args.pick,
            "configs": configs, "runs": runs, "medians": medians,
            "ok_runs": {n: sum(r["outcome"] == "ok" for r in rows) for n, rows in runs.items()}}


def _print_table(summary: dict, repeats: int) -> None:
    names, medians = list(summary["configs"]), summary["medians"]
    ref = next((n for n in reversed(names[:-1]) if summary["ok_runs"][n]), names[0])
    print(f"\n{'metric':22s} " + " ".join(f"{n:>12s}" for n in names) + f" {'tuned/' + ref:>16s}")
    for k in KEYS:
        r, t = medians[ref][k], medians["tuned"][k]
        ratio = f"{t / r:.2f}" if r and t else "-"
        cols = " ".join(f"{_fmt(medians[n][k]):>12s}" for n in names)
        print(f"{k:22s} {cols} {ratio:>16s}")
    print("ok runs: " + ", ".join(f"{n} {summary['ok_runs'][n]}/{repeats}" for n in names))


def _median(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    sys.exit(main())
