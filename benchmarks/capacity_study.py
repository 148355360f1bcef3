"""Capacity under an SLO, on the simulator: default config vs tuned, search cost vs a sweep, and
what the prefix cache is worth on shared-prefix traffic.

Setting (in-process simulator, `tuner.simtrial.InProcessRunner`): Llama-3.1-8B on the RTX 4090
profile, search_spaces/infinilm.yaml resolved for that card, and studies/chat-capacity.yaml
(ShareGPT-format chat prompts from studies/data, SLOs p99 TTFT <= 2 s and p99 TPOT <= 50 ms).

* "default": InfiniLM's defaults (block size 256, max batch 8, no graphs, prefix cache on,
  scheduler variables unset) with the KV pool the seed report ran on a 4090 (64 x 256 blocks):
  upstream's 512-block default does not fit beside the weights on 24 GB.
* "tuned": the best capacity of a `--trials` TPE study with the single objective
  `max capacity_rps`, the default enqueued first (same TrialObjective/record code as `tune`).
* Search cost: load steps and simulated seconds of the capacity search, against a fixed rate
  sweep of the same resolution over [min_rate, max_rate] (every step run to its end on the
  same running server), in full and stopped at its first failing rate.
* Prefix cache: studies/shared-prefix.yaml (8 x 1024-token system prompts, 3-turn chats) with
  the default and chat-tuned configs, cache on vs `--disable-prefix-caching`; then the best of
  a `--trials` study with the cache pinned on, and one with it pinned off, for each of
  `--prefix-seeds` sampler seeds.  A server that runs out of memory ends its capacity search
  (capacity = the highest rate that passed before): the cache admits more sequences at once,
  which the simulator's memory model charges for, so on some configs it costs capacity.

Usage: python benchmarks/capacity_study.py [--trials 30] [--seed 0] [--prefix-seeds 3]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.bench.capacity import slo_limits  # noqa: E402
from tuner.search.bounds import resolve_space  # noqa: E402
from tuner.search.model import load_model_info  # noqa: E402
from tuner.search.objectives import parse_objectives  # noqa: E402
from tuner.search.space import SearchSpace  # noqa: E402
from tuner.search.space_file import load_space  # noqa: E402
from tuner.search.warmstart import clip_to_space  # noqa: E402
from tuner.search.workload import Workload, load_workload  # noqa: E402
from tuner.sim.api import open_engine  # noqa: E402
from tuner.sim.capacity_run import measure_step, sim_capacity  # noqa: E402
from tuner.sim.profiles import get_profile  # noqa: E402
from tuner.study.objective import TrialObjective  # noqa: E402
from tuner.study.sampler import make_sampler  # noqa: E402
from tuner.trial.context import HOST, TrialContext  # noqa: E402
from tuner.trial.inprocess import InProcessRunner  # noqa: E402
from tuner.trial.pipeline import AdaptivePipeline  # noqa: E402

MODEL = str(ROOT / "models" / "llama-3.1-8b")
GPU = "rtx4090"
SEED_KV_TOKENS = 64 * 256


def setting(workload: str) -> tuple[SearchSpace, Workload]:
    w = load_workload(ROOT / "studies" / workload)
    space = resolve_space(load_space(ROOT / "search_spaces" / "infinilm.yaml"),
                          load_model_info(MODEL), get_profile(GPU).memory_bytes, w.cells)
    return space, w


def default_config(space: SearchSpace) -> dict[str, Any]:
    params = {p.name: p.default for p in space.parameters if p.default is not None}
    params["kv_cache_tokens"] = SEED_KV_TOKENS
    return clip_to_space(space, params)


def argv_env(space: SearchSpace, params: dict[str, Any], out_len: int) -> tuple[list[str], dict]:
    return space.render(params, model=MODEL, host=HOST, port=0, max_output_len=out_len,
                        simulate=GPU, extra_placeholders={"time_scale": "1"})


def tune(space: SearchSpace, w: Workload, trials: int, seed: int) -> tuple[dict, float, float]:
    """-> (best params, best capacity, wall seconds)."""
    ctx = TrialContext(space=space, workload=w, model_dir=MODEL, simulate=GPU)
    objectives = parse_objectives(["max capacity_rps"])
    study = optuna.create_study(directions=["maximize"],
                                sampler=make_sampler("tpe", seed, trials))
    study.enqueue_trial({k: v for k, v in default_config(space).items()
                         if k in {p.name for p in space.parameters}})
    t0 = time.monotonic()
    pipeline = AdaptivePipeline(ctx, objectives, load_model_info(MODEL),
                                get_profile(GPU).memory_bytes, runner=InProcessRunner(GPU),
                                screen_cells=0)
    objective = TrialObjective(ctx, objectives, Path("/nonexistent"), trials, pipeline=pipeline)
    study.optimize(objective, n_trials=trials)
    feasible = [t for t in study.trials if t.values and t.user_attrs.get("outcome") == "ok"
                and all(v <= 0 for v in t.constraints.values())]
    if not feasible:
        return {}, 0.0, time.monotonic() - t0
    best = max(feasible, key=lambda t: t.values[0])
    return best.params, best.values[0], time.monotonic() - t0


def search_and_sweep(space: SearchSpace, w: Workload, params: dict) -> dict[str, Any]:
    spec = w.capacity
    assert spec is not None
    cell = w.cells[spec.cell]
    argv, env = argv_env(space, params, cell.output_len)
    res = sim_capacity(open_engine(MODEL, GPU, argv, env), cell, spec, w.slo)
    engine = open_engine(MODEL, GPU, argv, env)
    limits = slo_limits(w.slo)
    sweep = [measure_step(engine, cell, r, spec, limits, 1000 + i, cut_short=False)
             for i, r in enumerate(spec.sweep_rates())]
    first_fail = next((i for i, s in enumerate(sweep) if not s.passed), len(sweep))
    return {"capacity": res.capacity_rps, "steps": len(res.steps), "cost": res.cost_s,
            "sweep_capacity": sweep[first_fail - 1].rate if first_fail else 0.0,
            "sweep_steps": len(sweep), "sweep_cost": sum(s.cost_s for s in sweep),
            "sweep_first_fail_steps": min(first_fail + 1, len(sweep)),
            "sweep_first_fail_cost": sum(s.cost_s for s in sweep[:first_fail + 1]),
            "search_rows": [s.row() for s in res.steps]}


def prefix_effect(space: SearchSpace, params: dict) -> dict[str, Any]:
    """One config's capacity search with the cache on and off (a fresh server each): capacity,
    p99 TTFT of the first, lightly loaded step, the hit rate, whether the server died."""
    _, w = setting("shared-prefix.yaml")
    spec = w.capacity
    assert spec is not None
    cell = w.cells[spec.cell]
    out = {}
    for cache in (True, False):
        argv, env = argv_env(space, {**params, "disable_prefix_caching": not cache},
                             cell.output_len)
        engine = open_engine(MODEL, GPU, argv, env)
        res = sim_capacity(engine, cell, spec, w.slo)
        out["on" if cache else "off"] = {
            "capacity": res.capacity_rps, "hit": engine.cache.hit_rate,
            "ttft": res.steps[0].metrics.get("p99_ttft_ms", 0.0), "rate": res.steps[0].rate,
            "died": engine.failed is not None}
    return out


def pinned(space: SearchSpace, cache: bool) -> SearchSpace:
    """The space without the prefix-cache knob, the cache fixed on or off."""
    flags = space.fixed_flags if cache else (*space.fixed_flags, "--disable-prefix-caching")
    return replace(space, parameters=tuple(p for p in space.parameters
                                           if p.name != "disable_prefix_caching"),
                   fixed_flags=tuple(flags))


def short(params: dict) -> str:
    keys = {"kv_cache_tokens": "kv", "block_size": "bs", "max_batch_size": "mb",
            "enable_graph": "graph", "disable_prefix_caching": "no_pc",
            "max_num_batched_tokens": "tok_budget", "prefill_batch_cap": "pf_cap",
            "decode_batch_cap": "dec_cap", "long_context_threshold": "long",
            "long_context_max_batch": "long_mb", "decode_first_when_running": "dec_first",
            "long_context_use_total_len": "long_total"}
    return " ".join(f"{keys.get(k, k)}={v}" for k, v in sorted(params.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefix-seeds", type=int, default=3,
                    help="studies per cache state on the shared-prefix workload")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space, w = setting("chat-capacity.yaml")
    default = default_config(space)
    tuned, best, wall = tune(space, w, args.trials, args.seed)
    print(f"workload {w.name}: SLO {w.slo}; capacity search {w.capacity}")
    print(f"tuning: {args.trials} trials (TPE, seed {args.seed}) in {wall:.1f} s wall\n")
    rows = {"default": search_and_sweep(space, w, default),
            "tuned": search_and_sweep(space, w, tuned)}
    print(f"{'config':8} {'capacity':>9} {'steps':>6} {'sim s':>8} | {'sweep cap':>9} "
          f"{'steps':>6} {'sim s':>8} | {'to 1st fail':>11} {'sim s':>8}")
    for name, r in rows.items():
        print(f"{name:8} {r['capacity']:9.3f} {r['steps']:6d} {r['cost']:8.0f} | "
              f"{r['sweep_capacity']:9.3f} {r['sweep_steps']:6d} {r['sweep_cost']:8.0f} | "
              f"{r['sweep_first_fail_steps']:11d} {r['sweep_first_fail_cost']:8.0f}")
    print(f"\ndefault: {short(default)}\ntuned:   {short(tuned)}")
    for name, r in rows.items():
        print(f"\n{name} search steps:")
        for row in r["search_rows"]:
            print("  " + " ".join(f"{k}={v}" for k, v in row.items()))
    sp_space, sp = setting("shared-prefix.yaml")
    print(f"\nprefix cache, {sp.name}.yaml (SLO {sp.slo}); p99 TTFT of the first step, "
          "prefix hit rate over the search:")
    for name, params in (("default", default), ("chat-tuned", tuned)):
        for state, e in prefix_effect(sp_space, params).items():
            died = "; the server ran out of memory at a higher rate" if e["died"] else ""
            print(f"  {name:10} cache {state:3}: capacity {e['capacity']:6.3f} req/s, "
                  f"p99 TTFT {e['ttft']:6.1f} ms at {e['rate']:g} req/s, "
                  f"hit rate {e['hit']:.2f}{died}")
    for seed in range(args.seed, args.seed + args.prefix_seeds):
        for cache in (True, False):
            params, best, _ = tune(pinned(sp_space, cache), sp, args.trials, seed)
            print(f"  tuned for {sp.name} ({args.trials} trials, seed {seed}), cache "
                  f"{'on ' if cache else 'off'}: capacity {best:6.3f} req/s  [{short(params)}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
