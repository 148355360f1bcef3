"""Does the search find the best config on scenarios it was not tuned on?  A suite, per scenario:
ground truth from a grid, then the tuner vs plain Optuna TPE vs random vs grid.

Scenarios (benchmarks/search_scenarios.py): different models, simulated cards, workloads and
SLOs, one with the optimum at the memory edge, one long-context, one held out of the design.
All simulated in-process (`tuner.trial.inprocess.InProcessRunner`), through the same
TrialObjective / record / pre-screen / staging / warm-start code as `tuner tune`.

Figure of merit: output throughput over the scenario's matrix of a config that runs every cell
healthy and meets the SLO.  Ground truth: the best over the scenario's near-exhaustive grid (every
config run on the full matrix, stress cell first).  The searches are not limited to the grid and
can beat it, so the reference each ratio divides by is the larger of that and the best config any
study of the scenario found (the best known).  Methods, 10 seeds, one 40-measured-trial study
per seed and method (budgets 10, 20, 30 are its prefixes of measured trials; the tuner's TPE
start-up length is set for 40; with --per-budget the tuner is rated at 10, 20 and 30 on a study
of that many trials, as `tuner tune --trials N` runs it, its start-up set for N):
* tuner: `tune`'s defaults (KV as a share of the headroom, pre-screen, 3 screening cells,
  runnable default as trial 0, multivariate TPE with constraints, guided proposals:
  `tuner.study.proposals`);
* tpe: plain Optuna (TPESampler(seed=...), absolute KV, full matrix, nothing enqueued);
* random: RandomSampler, full matrix;  * grid: GridSampler over the ground-truth grid.

Targets, every scenario: median best/truth >= 0.98 at 30 and >= 0.90 at 20; no seed below 0.90
at 30; tuner beats random in >= 9 of 10 seeds at every budget; >= 80% of the would-OOM configs
the tuner considered are not launched, with 0 feasible ones turned away (counted: pre-screen
skips, and the candidates the proposals' memory filter rejected, each checked at the smallest
pool on the simulator); OOM launches <= 10% of the tuner's measured trials after its first 5.
Prints one table (benchmarks/search_report.py); exits 1 when a target fails.

Usage: python benchmarks/search_efficiency.py [--seeds 10] [--procs 2] [--scenarios a,b] [--per-budget]
(ground truth and finished studies are cached under benchmarks/out/, per version of the tuner's
code and the scenarios; after editing run_study, delete benchmarks/out/studies/)
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import math
import multiprocessing as mp
import pickle
import shutil
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, cast

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from scenario_args import add_scenarios_option, scenario_names  # noqa: E402
from search_report import BUDGETS, METHODS, scenario_table  # noqa: E402
from search_scenarios import (  # noqa: E402
    EDGE_SHARES,
    KV_SHARES,
    Scenario,
    by_name,
)

from tuner.commands.tune_options import warm_start  # noqa: E402
from tuner.search.bounds import resolve_space  # noqa: E402
from tuner.search.model import load_model_info  # noqa: E402
from tuner.search.objectives import parse_objectives  # noqa: E402
from tuner.search.space import SearchSpace  # noqa: E402
from tuner.search.space_file import load_space  # noqa: E402
from tuner.search.workload import Workload  # noqa: E402
from tuner.sim.profiles import get_profile  # noqa: E402
from tuner.study.objective import TrialObjective, counted  # noqa: E402
from tuner.study.proposals import guided  # noqa: E402
from tuner.study.record import KV_SHARE, TrialRecord, config_key  # noqa: E402
from tuner.study.sampler import make_sampler, startup_trials  # noqa: E402
from tuner.trial.context import TrialContext  # noqa: E402
from tuner.trial.inprocess import InProcessRunner  # noqa: E402
from tuner.trial.memory_estimate import estimate, knobs_from_params  # noqa: E402
from tuner.trial.pipeline import AdaptivePipeline  # noqa: E402
from tuner.trial.stages import stress_order  # noqa: E402

OUT = ROOT / "benchmarks" / "out"
LAUNCH_S = 60.0
CHUNKS = 64       # ground-truth work items: enough to keep a many-core machine busy to the end
TUNER_ONLY = {"study/proposals.py", "study/local_moves.py", "study/design.py",  # run by the
              "study/ascent.py", "study/pool_trades.py",
              "study/dead_choices.py", "study/flips.py", "study/open_caps.py",
              "study/edge_pushes.py", "study/open_knobs.py", "study/miss_descent.py",
              "study/trade_bisection.py", "study/per_token_repairs.py",
              "trial/kv_share.py", "trial/runnable_default.py",
              "trial/kv_calibration.py"}  # tuner only


# ----- one scenario's setting --------------------------------------------------------------
def setting(sc: Scenario) -> tuple[TrialContext, Any, int]:
    model = load_model_info(ROOT / "models" / sc.model)
    cap = get_profile(sc.gpu).memory_bytes
    workload = Workload(sc.name, 0, None, sc.cells, ("max output_throughput",), sc.slo)
    space = resolve_space(load_space(ROOT / "search_spaces" / "infinilm.yaml"), model, cap,
                          sc.cells)
    ctx = TrialContext(space=space, workload=workload, model_dir=str(ROOT / "models" / sc.model),
                       simulate=sc.gpu)
    return ctx, model, cap


def grid_of(space: SearchSpace, sc: Scenario) -> dict[str, list[Any]]:
    """The grid method's grid: the fixed KV shares of the range times the scenario's grid
    (`Scenario.base_grid`); a knob the space has and that grid lacks is held at the server's
    default, as in the ground truth."""
    p = space.param("kv_cache_tokens")
    kv = sorted({int(p.low + s * (p.high - p.low)) for s in KV_SHARES})
    base = sc.base_grid()
    held = {q.name: [q.default] for q in space.parameters
            if q.name not in base and q.name != p.name and q.default is not None}
    return {"kv_cache_tokens": kv, **base, **held}


def combo_truth(sc: Scenario, combo: dict[str, Any]) -> list[dict[str, Any]]:
    """One combination of the other knobs: the fixed KV shares, then shares of its own edge."""
    ctx, _, _ = setting(sc)
    p = ctx.space.param("kv_cache_tokens")
    low, high = int(p.low), int(p.high)
    seen = {kv: truth(sc, {**combo, "kv_cache_tokens": kv})
            for kv in {int(low + s * (high - low)) for s in KV_SHARES}}

    def runs(kv: int) -> bool:
        if kv not in seen:  # each pool once: a full-matrix run costs seconds
            seen[kv] = truth(sc, {**combo, "kv_cache_tokens": kv})
        return bool(seen[kv]["outcome"] != "oom")
    if runs(low):
        lo, hi = low, high
        while hi - lo > max(64, (high - low) // 200):  # invariant: runs(lo)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if runs(mid) else (lo, mid)
        for s in EDGE_SHARES:
            runs(max(low, int(lo * s)))
    return list(seen.values())


def truth(sc: Scenario, params: dict[str, Any]) -> dict[str, Any]:
    """What the config gives on the full matrix (stress first, stop at the first failure)."""
    ctx, model, _ = setting(sc)
    cells = stress_order(sc.cells, estimate(model, knobs_from_params(ctx.space, params),
                                            list(sc.cells)))
    res = InProcessRunner(sc.gpu)(ctx, params, Path("/nonexistent"), cells=cells)
    ok = res.outcome.kind == "ok" and all(res.metrics.get(m, math.inf) <= v
                                          for m, v in sc.slo.items())
    return {"outcome": res.outcome.kind,
            "throughput": res.metrics.get("output_throughput", 0.0) if ok else 0.0,
            "cost": LAUNCH_S + (res.sim_seconds or 0.0)}


def _truth_chunk(job: tuple[str, list[dict[str, Any]], Path]) -> list[dict[str, Any]]:
    """One chunk's rows, kept on disk as soon as they exist: a truth that takes longer than one
    sitting (or is interrupted) resumes from the chunks already done."""
    if job[2].is_file():
        return cast(list[dict[str, Any]], pickle.loads(job[2].read_bytes()))
    rows = [r for combo in job[1] for r in combo_truth(by_name(job[0]), combo)]
    job[2].write_bytes(pickle.dumps(rows))
    return rows


def ground_truth(sc: Scenario, pool: Any) -> list[dict[str, Any]]:
    """Every grid config's truth, cached under benchmarks/out/truth/ per code version."""
    path = OUT / "truth" / f"{sc.name}-{fingerprint(sc)}.pkl"
    if path.is_file():
        return cast(list[dict[str, Any]], pickle.loads(path.read_bytes()))
    grid = sc.base_grid()
    configs = [dict(zip(grid, v)) for v in itertools.product(*grid.values())]
    parts = path.with_suffix(".parts")
    parts.mkdir(parents=True, exist_ok=True)
    chunks = [(sc.name, configs[i::CHUNKS], parts / f"{i}.pkl") for i in range(CHUNKS)]
    rows = [r for part in pool.map(_truth_chunk, chunks, chunksize=1) for r in part]
    path.write_bytes(pickle.dumps(rows))
    shutil.rmtree(parts)
    return rows


# ----- one study ---------------------------------------------------------------------------
def run_study(job: tuple[str, str, int] | tuple[str, str, int, int]) -> dict[str, Any]:
    """40 measured trials of one method and seed, or as many as the job's fourth item says;
    per-trial facts (cached per code version)."""
    path = OUT / "studies" / fingerprint(method=job[1]) / ("-".join(map(str, job)) + ".pkl")
    if path.is_file():
        return pickle.loads(path.read_bytes())
    name, method, seed = job[:3]
    budget = job[3] if len(job) > 3 else BUDGETS[-1]
    sc = by_name(name)
    ctx, model, cap = setting(sc)
    objectives = parse_objectives(["max output_throughput"])
    tuner = method == "tuner"
    pipeline = AdaptivePipeline(ctx, objectives, model, cap, runner=InProcessRunner(sc.gpu),
                                prescreen=tuner, screen_cells=3 if tuner else 0, kv_share=tuner)
    if method == "grid":
        sampler = optuna.samplers.GridSampler(grid_of(ctx.space, sc), seed=seed)
    elif method == "tpe":
        sampler = optuna.samplers.TPESampler(seed=seed)
    else:
        sampler = make_sampler("auto" if tuner else method, seed, budget)
    if tuner:
        sampler = guided(sampler, pipeline.kv_edge, startup_trials(budget), seed,
                         limits=ctx.space.limits(), budgets=ctx.space.budgets(), trials=budget)
    part = path.with_suffix(".part")   # a baseline's checkpoint (see `_checkpoint`)
    done: list[optuna.trial.FrozenTrial] = []
    if part.is_file() and not tuner:
        done, sampler = pickle.loads(part.read_bytes())
    study = optuna.create_study(directions=["maximize"], sampler=sampler)
    study.add_trials(done)
    if tuner:
        warm_start(study, ctx.space, argparse.Namespace(no_defaults=False, seed_config=None,
                                                        warm_start_from=None), "", OUT, pipeline)
    objective = TrialObjective(ctx, objectives, OUT / "trials", budget, pipeline=pipeline)
    keep = [] if tuner else [_checkpoint(part, sampler)]
    while len(counted(study)) < budget and len(study.trials) < 4 * budget:
        study.optimize(objective, n_trials=budget - len(counted(study)), callbacks=keep)
    rows = [_row(sc, t) for t in sorted(study.trials, key=lambda t: t.number)]
    away = _turned_away(sc, ctx.space, getattr(sampler, "turned_away", []))
    res = {"scenario": name, "method": method, "seed": seed, "budget": budget, "rows": rows,
           "away": away}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(res))
    part.unlink(missing_ok=True)
    return res


def _checkpoint(part: Path, sampler: optuna.samplers.BaseSampler) -> Any:
    """A callback that keeps a baseline study's trials and its sampler (its random state) on
    disk after each trial: a study longer than one sitting (a random one on
    p-1b-h100-decode runs over ten minutes) resumes where it stopped and draws exactly what an
    uninterrupted run would.  Not for the tuner: its sampler holds the pipeline's model."""
    def keep(study: optuna.Study, _: optuna.trial.FrozenTrial) -> None:
        part.parent.mkdir(parents=True, exist_ok=True)
        tmp = part.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps((study.trials, sampler)))
        tmp.replace(part)
    return keep


def _row(sc: Scenario, t: optuna.trial.FrozenTrial) -> dict[str, Any]:
    r = TrialRecord.of(t)
    skipped = r.outcome == "skipped"
    return {"best": r.metrics["output_throughput"] if r.feasible and r.original else 0.0,
            "measured": not r.unmeasured, "skipped": skipped, "oom": r.outcome == "oom",
            "truth": truth(sc, t.params)["outcome"] if skipped else None,
            "outcome": r.outcome, "params": dict(t.params)}


def _turned_away(sc: Scenario, space: SearchSpace, cands: list[dict[str, Any]]) -> list[str]:
    """What each distinct candidate the proposals' memory filter rejected would have done at
    the smallest pool (the filter judged it there: too big at any pool): 'oom' is a correct
    rejection, 'ok' / 'slo' a feasible config turned away."""
    kv = space.param("kv_cache_tokens")
    configs = {config_key(c): {**{k: v for k, v in c.items() if k != KV_SHARE},
                               kv.name: int(kv.low)} for c in cands}
    return [truth(sc, c)["outcome"] for c in configs.values()]


def fingerprint(sc: Scenario | None = None, method: str = "tuner") -> str:
    """Hash of the code a cached result came from: it is reused only if that code is the code
    that would run now.  With a scenario: the key of its ground truth, which depends on the
    simulator, the runner and that scenario's definition only.  The baselines (plain TPE,
    random, grid) never run the guided proposals, so those modules are not part of their key:
    a change to the tuner's search re-runs the tuner's studies only."""
    t = ROOT / "tuner"
    files = [*(t / "sim").glob("*.py"), *(t / "trial" / f for f in (
        "inprocess.py", "stages.py", "memory_estimate.py", "result.py")),
        t / "search" / "bounds.py", t / "server" / "outcome.py",
        t / "bench" / "cell_errors.py"] if sc is not None else \
        [*(p for p in t.rglob("*.py") if "commands" not in p.parts
           and (method == "tuner" or p.relative_to(t).as_posix() not in TUNER_ONLY)),
         ROOT / "benchmarks" / "search_scenarios.py"]
    h = hashlib.sha256(repr((sc, sc.base_grid(), KV_SHARES, EDGE_SHARES)).encode() if sc
                       else b"")
    for path in sorted([*files, ROOT / "search_spaces" / "infinilm.yaml"]):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def _init() -> None:
    import torch
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--procs", type=int, default=2)
    add_scenarios_option(ap)
    ap.add_argument("--truth-only", action="store_true", help="compute the ground truths and stop")
    ap.add_argument("--per-budget", action="store_true",
                    help="also run the tuner as `tuner tune --trials N` does for N = 10, 20, 30 "
                    "(its start-up set for N), and rate it at N on that study")
    args = ap.parse_args()
    names = scenario_names(ap, args.scenarios)
    t0 = time.time()
    _init()
    scenarios = [by_name(n) for n in names]
    out = [f"{'budget':>8}  " + "  ".join(f"{m + ' med [min] >rnd':>21}" for m in METHODS)]
    failed = False
    with mp.Pool(args.procs, _init) as pool:
        for sc in scenarios:
            grid = ground_truth(sc, pool)
            best = max(r["throughput"] for r in grid)
            # a run that missed the SLOs is outcome "ok" at throughput 0 in the truth
            counts = Counter("slo" if r["outcome"] == "ok" and r["throughput"] <= 0
                             else r["outcome"] for r in grid)
            print(f"{sc.name}: truth {best:.1f} tok/s over {len(grid)} configs {dict(counts)} "
                  f"[{time.time() - t0:.0f} s]", flush=True)
            if args.truth_only:
                continue
            jobs: list[Any] = [(sc.name, m, s) for m in METHODS for s in range(args.seeds)]
            if args.per_budget:
                jobs += [(sc.name, "tuner", s, b) for b in BUDGETS[:-1]
                         for s in range(args.seeds)]
            results = pool.map(run_study, jobs)
            found = max(r["best"] for res in results for r in res["rows"])
            truth_best, best = best, max(best, found)  # the grid can miss the optimum
            lines = scenario_table(sc, results, best, args.seeds) if best > 0 else [
                "  FAIL: no config of the grid or of any study is feasible: the scenario cannot "
                "measure a search"]
            failed |= any("FAIL" in line for line in lines)
            head = f"{sc.name}{' (held out)' if sc.held_out else ''}: {sc.model} on {sc.gpu}, " \
                   f"SLO {sc.slo}, reference {best:.1f} tok/s (grid truth {truth_best:.1f}, " \
                   f"best any study found {found:.1f}); {sc.note}"
            out += [head, *lines]
            print("\n".join([head, *lines]) + f"\n[{time.time() - t0:.0f} s]", flush=True)
    print("\nbest/truth: median [min] over seeds, >rnd: seeds where the method beats random\n"
          + "\n".join(out))
    print(f"total {time.time() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
