"""How much search does the tuner save?  Ground truth from a grid, then tuner vs random vs grid.

Setting (all simulated in-process, `tuner.trial.inprocess.InProcessRunner`): Llama-3.1-8B on an
RTX 4090 profile, the InfiniLM space of search_spaces/infinilm.yaml (bounds resolved for this
card), and a subset of the seed's matrix (WORKLOAD below: 8 of its 30 cells, fewer prompts per
cell so that one config simulates in well under a second).

Scalar figure of merit: output throughput (tokens/s over the whole matrix) of a config that runs
every cell healthy and meets the SLO p99_tpot_ms <= 50 (the seed's TPOT target).  The studies
are single-objective (max output_throughput) with that SLO as a constraint, run through the same
TrialObjective / record / pre-screen / staging / warm-start code as `tuner tune`.

Cost: simulated GPU seconds = LAUNCH_S per server launch (an 8B model loads in about a minute)
+ the simulated duration of every cell run.  A pre-screen skip costs nothing.

Methods, each at budgets of 20, 40 and 60 trials over 10 seeds (budgets are prefixes of one
60-trial study per seed and method, see `_prefix`):
* tuner `auto` (multivariate TPE with constraints, defaults enqueued, pre-screen, 3 screening
  cells);
* with `--methods ...,gp`: the same pipeline with GPSampler, to check what `auto` should pick
  (GP asks take ~2-4 s each on 2 cores: this adds ~17 minutes);
* random: RandomSampler, every config runs the full matrix (a plain Optuna setup);
* grid: GridSampler over the ground-truth grid, visited in seeded random order, full matrix.
A budget-40 comparison of the KV parametrisations (tokens + block size vs blocks + block size)
runs on every seed.  Results are cached under benchmarks/out/ (git-ignored).

Usage: python benchmarks/search_efficiency.py [--seeds 10] [--procs 2] [--methods auto,tpe,...]
(finished studies are cached per code version under benchmarks/out/studies/, so a run that was
interrupted, or one with more methods, redoes only what is missing)
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import math
import multiprocessing as mp
import pickle
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.commands.tune_options import warm_start  # noqa: E402
from tuner.bench.records import Cell  # noqa: E402
from tuner.search.bounds import resolve_space  # noqa: E402
from tuner.trial.memory_estimate import estimate, knobs_from_params  # noqa: E402
from tuner.search.model import load_model_info  # noqa: E402
from tuner.search.objectives import parse_objectives  # noqa: E402
from tuner.trial.pipeline import AdaptivePipeline  # noqa: E402
from tuner.sim import SimCellResult, StartupFailure, simulate  # noqa: E402
from tuner.sim.profiles import get_profile  # noqa: E402
from tuner.trial.inprocess import InProcessRunner  # noqa: E402
from tuner.search.space import SearchSpace  # noqa: E402
from tuner.search.space_file import load_space  # noqa: E402
from tuner.trial.stages import stress_order  # noqa: E402
from tuner.study.objective import TrialObjective, counted  # noqa: E402
from tuner.study.sampler import make_sampler  # noqa: E402
from tuner.trial.context import TrialContext  # noqa: E402
from tuner.search.workload import Workload  # noqa: E402

OUT = ROOT / "benchmarks" / "out"
MODEL = str(ROOT / "models" / "llama-3.1-8b")
GPU = "rtx4090"
LAUNCH_S = 60.0
SLO = {"p99_tpot_ms": 50.0}
BUDGETS = (20, 40, 60)
WORKLOAD = Workload("seed-subset", 0, None, (
    Cell(4, 4096, 1024, 8), Cell(1, 4096, 256, 4), Cell(64, 256, 256, 64), Cell(64, 32, 256, 64),
    Cell(16, 256, 256, 32), Cell(16, 32, 1024, 16), Cell(4, 256, 1024, 8), Cell(1, 256, 256, 4)),
    ("max output_throughput",), SLO)
GRID = {  # the ground-truth grid: 2304 configs of the InfiniLM space
    "kv_cache_tokens": [6144, 10240, 14336, 18432, 24576, 32768], "block_size": [16, 256],
    "max_batch_size": [8, 64], "enable_graph": [False, True],
    "max_num_batched_tokens": [4096, 32768], "prefill_batch_cap": [1, 8, 64],
    "decode_batch_cap": [16, 128], "long_context_threshold": [2048, 8192],
    "long_context_max_batch": [1], "long_context_use_total_len": [False],
    "decode_first_when_running": [False, True]}

_CACHE: dict[str, Any] = {}
_NEW: dict[str, Any] = {}


# ----- simulation with a cache ------------------------------------------------------------
def _key(argv: list[str], env: dict[str, str], cells: list[Cell]) -> str:
    flags = argv[argv.index("--device"):] if "--device" in argv else argv
    return repr((flags, sorted(env.items()), [c.key for c in cells]))


def cached_simulate(model_dir: str, gpu: str, argv: list[str], env: dict[str, str],
                    cells: list[Cell], seed: int = 0) -> list[SimCellResult]:
    """tuner.sim.simulate, remembered by (flags, env, cell order); records are not kept."""
    key = _key(argv, env, cells)
    if key not in _CACHE:
        try:
            sims = simulate(model_dir, gpu, argv, env, cells, seed=seed)
            _CACHE[key] = [(s.duration_s, s.metrics, s.error_class, s.error, s.peak_bytes,
                            s.capacity_bytes, s.idle_bytes, s.log[-6:]) for s in sims]
        except StartupFailure as exc:
            _CACHE[key] = ("startup", str(exc), exc.log_lines)
        _NEW[key] = _CACHE[key]
    entry = _CACHE[key]
    if entry[0] == "startup":
        raise StartupFailure(entry[1], entry[2])
    return [SimCellResult(c, [], *e[:2], error_class=e[2], error=e[3], peak_bytes=e[4],
                          capacity_bytes=e[5], idle_bytes=e[6], log=e[7]) for c, e in zip(cells, entry)]


# ----- the setting ------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def spaces() -> dict[str, SearchSpace]:
    """The shipped space (KV capacity in tokens) and a blocks variant, resolved for the card."""
    model = load_model_info(MODEL)
    cap = get_profile(GPU).memory_bytes
    raw = yaml.safe_load((ROOT / "search_spaces" / "infinilm.yaml").read_text())
    params = {"num_blocks": {"type": "int", "low": 16, "high": "auto", "step": 8,
                             "flag": "--num-blocks", "role": "kv_blocks", "default": 512}}
    params.update((k, v) for k, v in raw["parameters"].items() if k != "kv_cache_tokens")
    raw["parameters"] = params
    text = yaml.safe_dump(raw, sort_keys=False)
    variant = OUT / "infinilm-blocks.yaml"
    if not variant.is_file() or variant.read_text() != text:  # workers find it written by main
        OUT.mkdir(parents=True, exist_ok=True)
        variant.write_text(text)
    return {name: resolve_space(load_space(path), model, cap, WORKLOAD.cells)
            for name, path in (("tokens", ROOT / "search_spaces" / "infinilm.yaml"),
                               ("blocks", OUT / "infinilm-blocks.yaml"))}


def context(space: SearchSpace) -> TrialContext:
    return TrialContext(space=space, workload=WORKLOAD, model_dir=MODEL, simulate=GPU)


def truth(space: SearchSpace, params: dict[str, Any]) -> dict[str, Any]:
    """What running the config on the full matrix (stress-first, stop at failure) gives."""
    ctx = context(space)
    cells = stress_order(WORKLOAD.cells, estimate(load_model_info(MODEL),
                                                  knobs_from_params(space, params),
                                                  list(WORKLOAD.cells)))
    res = InProcessRunner(GPU, simulate_fn=cached_simulate)(ctx, params, Path("/nonexistent"), cells=cells)
    meets = all(res.metrics.get(m, math.inf) <= v for m, v in SLO.items())
    ok = res.outcome.kind == "ok"
    return {"outcome": res.outcome.kind, "good": ok and meets,
            "throughput": res.metrics.get("output_throughput", 0.0) if ok and meets else 0.0,
            "cost": LAUNCH_S + (res.sim_seconds or 0.0)}


# ----- workers ----------------------------------------------------------------------------
def _init(cache_path: str) -> None:
    import torch
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if Path(cache_path).is_file():
        _CACHE.update(pickle.loads(Path(cache_path).read_bytes()))


def _grid_chunk(configs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    space = spaces()["tokens"]
    _NEW.clear()
    return [truth(space, p) for p in configs], dict(_NEW)


def run_study(method: str, seed: int, budget: int, space_name: str = "tokens") -> dict[str, Any]:
    """One study of `budget` trials; per-trial facts for any budget prefix."""
    _NEW.clear()
    space = spaces()[space_name]
    ctx = context(space)
    objectives = parse_objectives(list(WORKLOAD.objectives))
    adaptive = method in ("auto", "gp")
    pipeline = AdaptivePipeline(ctx, objectives, load_model_info(MODEL), get_profile(GPU).memory_bytes,
                                runner=InProcessRunner(GPU, simulate_fn=cached_simulate),
                                prescreen=adaptive, screen_cells=3 if adaptive else 0)
    if method == "grid":
        sampler = optuna.samplers.GridSampler(GRID, seed=seed)
    else:
        sampler = make_sampler(method, seed, budget)
    study = optuna.create_study(directions=["maximize"], sampler=sampler)
    if adaptive:
        warm_start(study, space, argparse.Namespace(no_defaults=False, seed_config=None,
                                                    warm_start_from=None), "", OUT)
    objective = TrialObjective(ctx, objectives, OUT / "trials", budget, pipeline=pipeline)
    while len(counted(study)) < budget:
        study.optimize(objective, n_trials=budget - len(counted(study)))
    rows = []
    for t in sorted(study.trials, key=lambda t: t.number)[:budget]:
        a = t.user_attrs
        full_ok = a.get("outcome") == "ok" and a.get("stage", "full") == "full" and \
            all(v <= 0 for v in t.constraints.values()) and "cached_from" not in a
        launched = a.get("outcome") != "skipped" and "cached_from" not in a
        row = {"best": a["metrics"]["output_throughput"] if full_ok else 0.0,
               "cost": (LAUNCH_S + a.get("sim_seconds", 0.0)) if launched else 0.0,
               "skipped": a.get("outcome") == "skipped", "truth": None}
        if "cached_from" not in a:
            row["truth"] = truth(space, t.params)["outcome"]
        rows.append(row)
    return {"method": method, "seed": seed, "budget": budget, "space": space_name,
            "rows": rows, "new": dict(_NEW)}


def code_fingerprint() -> str:
    """Hash of the tuner's code and this script: a cached study result is reused only if the
    code that produced it is the code that would run now."""
    h = hashlib.sha256()
    for path in sorted([*(ROOT / "tuner").rglob("*.py"), Path(__file__).resolve(),
                        ROOT / "search_spaces" / "infinilm.yaml"]):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def _run_job(job: tuple) -> dict[str, Any]:
    """run_study, remembered under benchmarks/out/studies/ per code version."""
    path = OUT / "studies" / code_fingerprint() / ("-".join(map(str, job)) + ".pkl")
    if path.is_file():
        return {**pickle.loads(path.read_bytes()), "new": {}}
    res = run_study(*job)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({k: v for k, v in res.items() if k != "new"}))
    return res


# ----- reporting --------------------------------------------------------------------------
def summarise(rows: list[dict[str, Any]]) -> dict[str, float]:
    skipped = [r for r in rows if r["skipped"]]
    would_oom = [r for r in rows if r["truth"] == "oom"]
    return {"best": max((r["best"] for r in rows), default=0.0),
            "cost": sum(r["cost"] for r in rows),
            "true_skips": sum(r["truth"] == "oom" for r in skipped),
            "false_skips": sum(r["truth"] in ("ok", "slo") for r in skipped),
            "would_oom": len(would_oom), "oom_skipped": sum(r["skipped"] for r in would_oom)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--methods", default="auto,blocks,random,grid",
                    help="which studies to run (blocks: auto on the num-blocks parametrisation; "
                         "gp: the pipeline with GPSampler, slow)")
    args = ap.parse_args()
    t0 = time.time()
    cache_path = OUT / "simcache.pkl"
    OUT.mkdir(parents=True, exist_ok=True)
    _init(str(cache_path))
    names = list(GRID)
    configs = [dict(zip(names, vals)) for vals in itertools.product(*GRID.values())]
    print(f"ground truth: {len(configs)} grid configs ({len(_CACHE)} simulations cached)", flush=True)
    chunks = [configs[i::32] for i in range(32)]
    grid_truth: list[dict[str, Any]] = []
    with mp.Pool(args.procs, _init, (str(cache_path),)) as pool:
        for i, (part, new) in enumerate(pool.imap_unordered(_grid_chunk, chunks)):
            grid_truth += part
            _CACHE.update(new)
            if i % 8 == 7:
                print(f"  grid {len(grid_truth)}/{len(configs)}  {time.time() - t0:.0f} s", flush=True)
    cache_path.write_bytes(pickle.dumps(_CACHE))
    grid_best = max(t["throughput"] for t in grid_truth)
    grid_cost = sum(t["cost"] for t in grid_truth)
    counts = {k: sum(t["outcome"] == k for t in grid_truth) for k in ("ok", "slo", "oom", "startup")}
    print(f"grid: best {grid_best:.1f} tok/s, cost {grid_cost / 3600:.1f} GPU-h, "
          f"{sum(t['good'] for t in grid_truth)} meet the SLO, outcomes {counts}", flush=True)
    seeds = range(args.seeds)
    wanted = args.methods.split(",")
    jobs = [("gp", s, 60) for s in seeds if "gp" in wanted] + \
           [("auto", s, 40, "blocks") for s in seeds if "blocks" in wanted] + \
           [(m, s, 60) for m in ("auto", "random", "grid") if m in wanted for s in seeds]
    results = []
    with mp.Pool(args.procs, _init, (str(cache_path),)) as pool:
        for res in pool.imap_unordered(_run_job, jobs):
            results.append(res)
            _CACHE.update(res["new"])
            s = summarise(res["rows"])
            print(f"  {res['method']:6} {res['space']:6} seed {res['seed']} budget {res['budget']}: "
                  f"best {s['best'] / grid_best:.3f} of grid-best, cost {s['cost'] / grid_cost:.4f}"
                  f"  [{len(results)}/{len(jobs)}, {time.time() - t0:.0f} s]", flush=True)
    cache_path.write_bytes(pickle.dumps(_CACHE))
    report(results, grid_best, grid_cost, args.seeds)
    print(f"total {time.time() - t0:.0f} s")
    return 0


def _prefix(results: list[dict[str, Any]], method: str, budget: int, space: str = "tokens") -> dict[int, dict]:
    """Per seed, the summary of the first `budget` trials of its study.  Budgets 20 and 40 are
    prefixes of the 60-trial study: random and grid samplers do not know their budget; TPE and
    GP do (random start-up trials: min(10, budget // 3) for TPE, min(8, budget // 3) for GP), so
    their 20-trial figures come from samplers that started with 10 (TPE) or 8 (GP) random trials
    instead of the 6 of `--trials 20`; at 40 and 60 the prefix is exactly the shorter study."""
    out = {}
    for r in results:
        if r["method"] != method or r["space"] != space:
            continue
        if r["budget"] >= budget:
            out[r["seed"]] = summarise(r["rows"][:budget])
    return out


def report(results: list[dict[str, Any]], grid_best: float, grid_cost: float, n_seeds: int) -> None:
    print(f"\nscalar: output_throughput with {SLO}; grid-best {grid_best:.1f} tok/s; "
          f"cost = {LAUNCH_S:.0f} s per launch + simulated cell time; grid cost {grid_cost:.0f} s")
    head = (f"{'method':8}{'budget':>7}{'best/grid-best med [min]':>27}{'cost/grid med [max]':>22}"
            f"{'>random':>9}{'skips true/false':>18}{'would-OOM skipped':>19}")
    print(head + "\n" + "-" * len(head))
    for budget in BUDGETS:
        rand = _prefix(results, "random", budget)
        for method in ("auto", "gp", "random", "grid"):
            per = _prefix(results, method, budget)
            if not per:
                continue
            best = [p["best"] / grid_best for p in per.values()]
            cost = [p["cost"] / grid_cost for p in per.values()]
            wins = sum(per[s]["best"] > rand[s]["best"] for s in per if s in rand)
            ts, fs = sum(p["true_skips"] for p in per.values()), sum(p["false_skips"] for p in per.values())
            woom = sum(p["would_oom"] for p in per.values())
            skipped = sum(p["oom_skipped"] for p in per.values())
            print(f"{method:8}{budget:>7}{statistics.median(best):>18.3f} [{min(best):.3f}]"
                  f"{statistics.median(cost):>14.4f} [{max(cost):.4f}]"
                  f"{(f'{wins}/{len(per)}' if method != 'random' else '-'):>9}{f'{ts}/{fs}':>18}"
                  f"{(f'{skipped}/{woom} = {skipped / woom:.0%}' if woom else '-'):>19}")
    blocks = _prefix(results, "auto", 40, "blocks")
    tokens = _prefix(results, "auto", 40)
    if blocks:
        common = sorted(set(blocks) & set(tokens))
        bt = [tokens[s]["best"] / grid_best for s in common]
        bb = [blocks[s]["best"] / grid_best for s in common]
        print(f"\nparametrisation at budget 40, seeds {common}: kv tokens + block size "
              f"median {statistics.median(bt):.3f} (mean {statistics.fmean(bt):.3f}); "
              f"num blocks + block size median {statistics.median(bb):.3f} (mean {statistics.fmean(bb):.3f}); "
              f"tokens better in {sum(a > b for a, b in zip(bt, bb))}, blocks better in "
              f"{sum(b > a for a, b in zip(bt, bb))} of {len(common)}")
    print(f"targets: >= 0.98 of grid-best at <= 0.10 of its cost; beats random in >= 8 of {n_seeds}; "
          ">= 80% of would-OOM configs skipped with 0 false skips")


if __name__ == "__main__":
    sys.exit(main())
