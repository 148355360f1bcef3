"""Replay a real-server study's configs on the simulator: does it predict OOM vs ok, and the order?

Every trial of the study that launched a server (not the pre-screen's skips), plus the configs of
a side_by_side.json, runs in-process on the simulator with the same space, workload and
`--gpu-memory-cap`; the table puts the real outcome and output tok/s beside the simulated ones,
then the agreement on outcome and the rank correlation of throughput over the configs both ran
healthy through the whole workload (a trial the screen stopped after a few cells has no
comparable tok/s).

    python benchmarks/h200/sim_vs_real.py --db study.db --study NAME --space FILE \
        --workload FILE --model DIR --gpu h200 --gpu-memory-cap 24GiB [--side-by-side FILE] \
        [-o out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna

from tuner.search.bounds import resolve_space
from tuner.search.model import load_model_info
from tuner.search.space_file import load_space
from tuner.search.workload import load_workload
from tuner.server.memcap import cap_env
from tuner.sim.profiles import get_profile
from tuner.study.record import Stage, TrialRecord, records
from tuner.trial.context import TrialContext
from tuner.trial.inprocess import InProcessRunner

LAUNCHED = ("ok", "slo", "oom", "unhealthy", "hang", "crash", "startup")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--study", required=True)
    ap.add_argument("--space", required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--gpu", default="h200", help="simulator GPU profile")
    ap.add_argument("--gpu-memory-cap")
    ap.add_argument("--side-by-side", help="side_by_side.json whose configs to add")
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=args.study, storage=f"sqlite:///{args.db}")
    env = cap_env(args.gpu_memory_cap)
    workload = load_workload(args.workload)
    space = resolve_space(load_space(args.space), load_model_info(args.model),
                          get_profile(args.gpu, env).memory_bytes, workload.cells)
    ctx = TrialContext(space=space, workload=workload, model_dir=args.model, simulate=args.gpu,
                       extra_env=env)
    rows = [_row(f"trial {r.number}", dict(r.params), r.outcome, _full_tps(r), ctx, args.gpu)
            for r in records(study) if r.outcome in LAUNCHED]
    if args.side_by_side:
        sbs = json.loads(Path(args.side_by_side).read_text())
        for label, params in sbs["configs"].items():
            runs = sbs["runs"][label]
            real = (sbs["medians"][label] or {}).get("output_throughput")
            first = runs[0]["outcome"] if runs else None
            rows.append(_row(label, params, first, real, ctx, args.gpu))
    summary = _summarise(rows)
    _print(rows, summary)
    if args.output:
        Path(args.output).write_text(json.dumps({"rows": rows, **summary}, indent=1, default=str))
    return 0


def _full_tps(r: TrialRecord) -> float | None:
    """Output tok/s over the whole workload; a trial the screen stopped early ran fewer cells."""
    if r.stage != Stage.FULL or r.reason.startswith("screened out"):
        return None
    return r.metrics.get("output_throughput")


def _row(name: str, params: dict[str, Any], real: str | None, real_tps: float | None,
         ctx: TrialContext, gpu: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        res = InProcessRunner(gpu)(ctx, params, Path(tmp))
    sim_ok = res.outcome.kind in ("ok", "slo")
    return {"config": name, "params": params, "real": real, "sim": res.outcome.kind,
            "sim_reason": res.outcome.reason,
            "real_tps": real_tps if real in ("ok", "slo") else None,
            "sim_tps": res.metrics.get("output_throughput") if sim_ok else None,
            "sim_peak_gib": round((res.peak_bytes or 0) / 2**30, 2),
            "sim_idle_gib": round((res.idle_bytes or 0) / 2**30, 2)}


def _summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    healthy = ("ok", "slo")
    judged = [r for r in rows if r["real"] is not None]
    agree = sum((r["real"] in healthy) == (r["sim"] in healthy) for r in judged)
    both = [r for r in judged if r["real_tps"] and r["sim_tps"]]
    return {"outcome_agreement": f"{agree}/{len(judged)}", "rank_correlation": _spearman(
        [r["real_tps"] for r in both], [r["sim_tps"] for r in both]), "ranked_configs": len(both)}


def _spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rho without ties handling beyond average ranks (a handful of configs)."""
    if len(a) < 3:
        return None
    ra, rb = _ranks(a), _ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return round(cov / var, 3) if var else None


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    for pos, i in enumerate(order):
        ranks[i] = float(pos)
    return ranks


def _print(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    print(f"{'config':10s} {'blocks x size':>14s} {'real':>6s} {'sim':>6s} {'real tok/s':>11s} "
          f"{'sim tok/s':>10s} {'sim idle GiB':>12s} {'sim peak GiB':>12s}")
    for r in rows:
        p = r["params"]
        bs = p.get("block_size", 256)
        kv = f"{p['kv_cache_tokens'] // bs} x {bs}" if "kv_cache_tokens" in p else f"default x {bs}"
        print(f"{r['config']:10s} {kv:>14s} {str(r['real']):>6s} {r['sim']:>6s} "
              f"{_fmt(r['real_tps']):>11s} {_fmt(r['sim_tps']):>10s} {r['sim_idle_gib']:>12.2f} "
              f"{r['sim_peak_gib']:>12.2f}")
    print(f"outcome (healthy vs not) agrees: {summary['outcome_agreement']}; Spearman rank "
          f"correlation of tok/s over {summary['ranked_configs']} configs both ran healthy: "
          f"{summary['rank_correlation']}")


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


if __name__ == "__main__":
    sys.exit(main())
