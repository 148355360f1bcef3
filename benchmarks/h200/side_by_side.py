"""Run the server's default config and the study's chosen config side by side, N times each.

Runs alternate (default, tuned, default, ...) so that drift of the machine hits both alike, and
every run is a full trial through the tuner's own `run_trial` (fresh server, warm-up, the
study's workload).  Prints a table and writes a JSON summary with the medians.

    python benchmarks/h200/side_by_side.py --study NAME --studies-dir DIR --model DIR \
        --space FILE --workload FILE [--gpu-memory-cap 24GiB] [--repeats 3] [--pick max-throughput] -o out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import optuna

from tuner.server.memcap import memory_cap
from tuner.server.gpu import read_gpu
from tuner.output.select import choose
from tuner.search.space import SearchSpace
from tuner.search.space_file import load_space
from tuner.trial.context import TrialContext
from tuner.trial.run import run_trial
from tuner.search.workload import load_workload

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
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{Path(args.studies_dir) / args.study / 'study.db'}"
    study = optuna.load_study(study_name=args.study, storage=storage)
    chosen = choose(study, args.pick).trial
    space = load_space(args.space)
    with memory_cap(space, args.gpu_memory_cap, None if args.simulate else read_gpu(0),
                    simulate=args.simulate is not None) as cap:
        ctx = TrialContext(space=space, workload=load_workload(args.workload), model_dir=args.model,
                           simulate=args.simulate, time_scale=50.0, **cap.trial_fields())
        return _compare(args, chosen, space, ctx)


def _compare(args: argparse.Namespace, chosen: optuna.trial.FrozenTrial, space: SearchSpace,
             ctx: TrialContext) -> int:
    configs = {"default": space.default_params(), "tuned": dict(chosen.params)}
    runs: dict[str, list[dict]] = {"default": [], "tuned": []}
    base = Path(args.studies_dir) / args.study / "side_by_side"
    for i in range(args.repeats):
        for name, params in configs.items():
            res = run_trial(ctx, params, base / f"{name}-{i}")
            row = {"run": i, "outcome": res.outcome.kind, "reason": res.outcome.reason,
                   "metrics": {k: res.metrics.get(k) for k in KEYS}, "wall_s": round(res.wall_s, 1)}
            runs[name].append(row)
            print(f"{name:8s} run {i}: {res.outcome.kind:9s} " + "  ".join(
                f"{k}={row['metrics'][k]:.1f}" for k in KEYS if row["metrics"][k] is not None), flush=True)
    medians = {name: {k: _median([r["metrics"][k] for r in rows if r["outcome"] == "ok"]) for k in KEYS}
               for name, rows in runs.items()}
    summary = {"study": args.study, "chosen_trial": chosen.number, "pick": args.pick,
               "configs": configs, "runs": runs, "medians": medians,
               "ok_runs": {n: sum(r["outcome"] == "ok" for r in rows) for n, rows in runs.items()}}
    Path(args.output).write_text(json.dumps(summary, indent=1, default=str))
    print(f"\n{'metric':22s} {'default':>12s} {'tuned':>12s} {'tuned/default':>14s}")
    for k in KEYS:
        d, t = medians["default"][k], medians["tuned"][k]
        ratio = f"{t / d:.2f}" if d and t else "-"
        print(f"{k:22s} {_fmt(d):>12s} {_fmt(t):>12s} {ratio:>14s}")
    return 0


def _median(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    sys.exit(main())
