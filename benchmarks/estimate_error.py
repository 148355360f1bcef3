"""How far is the memory estimate's forward from what the simulated server reaches, per form?

Why: the pre-screen and the KV edge transfer what one config's run taught (a forward scale:
reached transient bytes / estimated forward) to other configs of the same cell, CUDA-graph
setting and form of forward (`tuner.trial.memory_estimate.cell_forward`: a prefill of N
prompts, beside M live decodes or none; a decode).  That is only as good as the scale is alike within
such a group.  This script measures it: random configs of each scenario of
benchmarks/search_scenarios.py (Optuna's RandomSampler over the resolved InfiniLM space,
absolute KV pools), each cell run alone on a clone of the scenario's card with unbounded memory
(so that a config that would run out of memory still shows the peak it would reach), and per
(cell, graphs, form) the spread of reached / estimated.  A group whose minimum sits far under
its median is one where the estimate's worst case often does not happen: a scale learned there
from one config misjudges the next.

Usage: python benchmarks/estimate_error.py [--configs 100] [--procs 2] [--scenarios a,b]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from statistics import median

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from scenario_args import add_scenarios_option, scenario_names  # noqa: E402
from search_efficiency import _init, setting  # noqa: E402
from search_scenarios import by_name  # noqa: E402

from tuner.sim import StartupFailure, simulate  # noqa: E402
from tuner.sim.profiles import PROFILES  # noqa: E402
from tuner.trial.memory_estimate import estimate, knobs_from_params  # noqa: E402

UNBOUNDED_MIB = 1 << 30


def ratios(job: tuple[str, int, int]) -> list[tuple[tuple[str, bool, str], float]]:
    """((cell, graphs, form), reached / estimated forward) for every cell of `n` random
    configs of one scenario that start (a start-up quirk of the card is not memory)."""
    name, seed, n = job
    sc = by_name(name)
    ctx, model, _ = setting(sc)
    clone = f"{sc.gpu}-unbounded"
    PROFILES[clone] = replace(PROFILES[sc.gpu], name=clone, memory_mib=UNBOUNDED_MIB)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        trial = study.ask(ctx.space.distributions())
        study.tell(trial, 0.0)
        knobs = knobs_from_params(ctx.space, trial.params)
        est = estimate(model, knobs, list(sc.cells))
        forwards, forms = dict(est.cell_forwards), dict(est.cell_forms)
        for cell in sc.cells:
            if forwards[cell.key] <= 0:
                continue
            argv, env = ctx.render(trial.params, cells=[cell], simulate=clone, in_process=True)
            try:
                res = simulate(ctx.model_dir, clone, argv, env, [cell])[0]
            except StartupFailure:
                break
            out.append(((cell.key, knobs.cuda_graph, forms[cell.key]),
                        (res.peak_bytes - res.idle_bytes) / forwards[cell.key]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=100, help="random configs per scenario")
    ap.add_argument("--procs", type=int, default=2)
    add_scenarios_option(ap)
    args = ap.parse_args()
    names = scenario_names(ap, args.scenarios)
    if args.configs < 1 or args.procs < 1:
        ap.error("--configs and --procs must be at least 1")
    t0 = time.time()
    chunks = max(1, args.configs // 20)
    jobs = [(n, seed, len(range(seed, args.configs, chunks))) for n in names
            for seed in range(chunks)]
    with mp.Pool(args.procs, _init) as pool:
        results = pool.map(ratios, jobs)
    print("reached / estimated forward, random configs on a card with unbounded memory; per "
          "cell and CUDA-graph setting: all forms, then the widest spread within one form "
          "(min / median of the forms seen 3+ times)")
    for name in names:
        groups: dict[tuple[str, bool], dict[str, list[float]]] = defaultdict(
            lambda: defaultdict(list))
        for (n, _, _), part in zip(jobs, results):
            if n == name:
                for (cell, graph, form), r in part:
                    groups[(cell, graph)][form].append(r)
        print(f"{name}:")
        for (cell, graph), forms in sorted(groups.items()):
            every = sorted(r for rs in forms.values() for r in rs)
            within = min(((min(rs) / median(rs), form) for form, rs in forms.items()
                          if len(rs) >= 3), default=None)
            print(f"  {cell:18} {'graphs' if graph else 'eager':6} n={len(every):4d} "
                  f"min {every[0]:.3f} median {median(every):.3f} max {every[-1]:.3f}; "
                  f"{len(forms)} forms, min / median of one form "
                  + (f"{within[0]:.2f} ({within[1]})" if within else "-"))
    print(f"total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
