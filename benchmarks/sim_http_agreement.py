"""Does the simulated server over HTTP agree with the in-process simulator on every shipped model
and GPU profile?

`tuner tune --simulate` drives `python -m tuner.sim` over HTTP at --time-scale 25; the benchmarks
(search_efficiency.py, sim_calibration.py) run the same engine in-process. For each model of
models/ and each card of tuner/sim/profiles.py, a few configs (the server's defaults with the KV
pool at a quarter of what fits; the seed's prefill 8 / decode 24, alone, with the seed's long-
context guard, and with two long prompts per prefill and decode-first) run both ways on a matrix
with the cells that used to disagree (con=8 in=3000, long prompts with company). Printed: per model
x card, the configs compared, outcome mismatches, and the max / median relative difference |http /
in-process - 1| of output throughput, p99 TTFT and p99 TPOT over configs and cells. Exit 1 when any
outcome differs or any difference is above tuner.trial.simcheck.TOLERANCE.

Run: PYTHONPATH=. python benchmarks/sim_http_agreement.py [--models a,b] [--gpus x,y]
     [--time-scale 25]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

from tuner.bench.records import Cell
from tuner.errors import UsageError
from tuner.search.bounds import resolve_space
from tuner.search.model import load_model_info
from tuner.search.space import SearchSpace
from tuner.search.space_file import load_space
from tuner.search.workload import load_workload
from tuner.sim.profiles import PROFILES
from tuner.trial.context import TrialContext
from tuner.trial.simcheck import METRICS, TOLERANCE, Agreement, compare

ROOT = Path(__file__).resolve().parents[1]
CELLS = [Cell(8, 3000, 128, num_prompts=16), Cell(4, 4096, 64, num_prompts=6),
         Cell(16, 256, 96, num_prompts=24), Cell(1, 256, 32, num_prompts=2)]
# prefill budgets: one 4096-token prompt alone (the seed's 4090 setting), two long prompts together
SEED = {"prefill_batch_cap": 8, "decode_batch_cap": 24, "max_batch_size": 32,
        "max_num_batched_tokens": 4096}
GUARD = {"long_context_threshold": 2048, "long_context_max_batch": 4,
         "decode_first_when_running": True, "max_num_batched_tokens": 8192}
# the seed's working 4090 config: a prompt of 4096+ tokens alone, and not while decodes run
SEED_GUARD = {"long_context_threshold": 4096, "long_context_max_batch": 1,
              "decode_first_when_running": True}


def configs(space: SearchSpace) -> dict[str, dict]:
    """The configs of one model x card, with the KV pool at a quarter of what fits: room left for
    the prefill's activations, so that most configs run rather than OOM on the smaller cards."""
    kv = space.param("kv_cache_tokens")
    pool = max(int(kv.low), int(kv.high) // 4)
    base = {**space.default_params(), "kv_cache_tokens": pool}
    return {"defaults": base, "seed 8/24": {**base, **SEED},
            "seed 8/24 + its long guard": {**base, **SEED, **SEED_GUARD},
            "two long per prefill + decode-first": {**base, **SEED, **GUARD}}


def run_pair(model: str, gpu: str, time_scale: float) -> list[Agreement] | str:
    """Every config of one model x card both ways; a string when the model does not fit."""
    info = load_model_info(model)
    try:
        space = resolve_space(load_space(ROOT / "search_spaces" / "infinilm.yaml"), info,
                              PROFILES[gpu].memory_bytes, CELLS)
    except UsageError:
        return "the weights do not fit the card: nothing to run"
    workload = dataclasses.replace(load_workload(ROOT / "studies" / "quick.yaml"), cells=CELLS)
    ctx = TrialContext(space=space, workload=workload, model_dir=model, simulate=gpu)
    return [compare(ctx, params, time_scale) for params in configs(space).values()]


def row(model: str, gpu: str, result: list[Agreement] | str) -> tuple[str, bool]:
    name = f"{Path(model).name:14s} {gpu:9s}"
    if isinstance(result, str):
        return f"{name} {result}", True
    ok = [a for a in result if a.http == "ok" == a.inprocess]
    mismatched = [f"{a.http}/{a.inprocess}" for a in result if a.http != a.inprocess]
    cols = []
    for m in METRICS:
        diffs = [a.matrix[m] for a in ok] + [a.worst_cell[m] for a in ok]
        cols.append(f"{100 * max(diffs):8.4f} {100 * statistics.median(diffs):8.4f}" if diffs
                    else f"{'-':>8s} {'-':>8s}")
    others = ",".join(sorted({a.http for a in result if a.http == a.inprocess != "ok"}))
    text = (f"{name} {len(ok):2d}/{len(result)} {len(mismatched):3d}  " + "  ".join(cols)
            + (f"  both {others}" if others else "")
            + (f"  MISMATCH {mismatched}" if mismatched else ""))
    return text, not mismatched and all(a.ok for a in ok)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated model dir names under models/ (default: all)")
    ap.add_argument("--gpus", help="comma-separated GPU profiles (default: all)")
    ap.add_argument("--time-scale", type=float, default=25.0,
                    help="the HTTP server's --time-scale (default: %(default)s, tune's)")
    args = ap.parse_args()
    models = sorted(str(p.parent) for p in (ROOT / "models").glob("*/config.json"))
    if args.models:
        models = [m for m in models if Path(m).name in args.models.split(",")]
    gpus = args.gpus.split(",") if args.gpus else list(PROFILES)
    unknown = set(gpus) - set(PROFILES)
    if not models or unknown:
        print(f"error: no such model or GPU profile: {args.models or ''} {sorted(unknown)}",
              file=sys.stderr)
        return 2
    print(f"HTTP (--time-scale {args.time_scale:g}) vs in-process; relative difference in %, "
          f"max and median over configs x (matrix + worst cell); tolerance {100 * TOLERANCE:g}%")
    print(f"{'model':14s} {'card':9s} ok/n mis  " + "  ".join(f"{m[:17]:>17s}" for m in METRICS))
    t0, passed = time.monotonic(), True
    for model in models:
        for gpu in gpus:
            text, ok = row(model, gpu, run_pair(model, gpu, args.time_scale))
            passed &= ok
            print(text, flush=True)
    print(f"{'PASS' if passed else 'FAIL'} in {time.monotonic() - t0:.0f} s")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
