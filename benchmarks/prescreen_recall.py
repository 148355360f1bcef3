"""How many would-OOM configs does the pre-screen keep from launching, on a stream it did not
choose?  Plain Optuna random search with absolute KV pools, the pre-screen on, per scenario of
benchmarks/search_scenarios.py.

Why a second figure beside search_efficiency.py's pre-screen line: the tuner's own proposals are
drawn inside the headroom the calibrated memory model leaves (`tuner.trial.kv_share`), so the
would-OOM configs it launches are almost only its deliberate probes of the edge, which that
model rates as fitting; its pre-screen line is then 0 of a handful on most scenarios and says
little about the pre-screen.  Random search draws pools across the whole range, so here the
pre-screen meets the would-OOM configs the issue's target is about: its recall (would-OOM
configs skipped) and its false skips (feasible configs skipped), the same decision code as
`tuner tune` with the same study-calibrated evidence (the launched trials of that study).

Each skipped config is run on the simulator's full matrix afterwards (not counted in the study)
to learn what it would have done.  Target (issue 14): >= 80% of would-OOM configs skipped, 0
feasible configs skipped; exit 1 when a scenario misses it.

Usage: python benchmarks/prescreen_recall.py [--seeds 10] [--trials 40] [--procs 2]
       [--scenarios a,b]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from collections import Counter
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from scenario_args import add_scenarios_option, scenario_names  # noqa: E402
from search_efficiency import OUT, _init, setting, truth  # noqa: E402
from search_scenarios import by_name  # noqa: E402

from tuner.search.objectives import parse_objectives  # noqa: E402
from tuner.study.objective import TrialObjective, counted  # noqa: E402
from tuner.study.record import TrialRecord  # noqa: E402
from tuner.trial.inprocess import InProcessRunner  # noqa: E402
from tuner.trial.pipeline import AdaptivePipeline  # noqa: E402

FEASIBLE = ("ok", "slo")


def run_stream(job: tuple[str, int, int]) -> list[tuple[str, str]]:
    """(pre-screen verdict, what the config does on the full matrix) for every trial of one
    random study of `trials` launched configs."""
    name, seed, trials = job
    sc = by_name(name)
    ctx, model, cap = setting(sc)
    objectives = parse_objectives(["max output_throughput"])
    pipeline = AdaptivePipeline(ctx, objectives, model, cap, runner=InProcessRunner(sc.gpu),
                                prescreen=True, screen_cells=0, kv_share=False)
    study = optuna.create_study(directions=["maximize"],
                                sampler=optuna.samplers.RandomSampler(seed=seed))
    objective = TrialObjective(ctx, objectives, OUT / "trials", trials, pipeline=pipeline)
    while len(counted(study)) < trials and len(study.trials) < 4 * trials:
        study.optimize(objective, n_trials=trials - len(counted(study)))
    out = []
    for t in study.trials:
        outcome = TrialRecord.of(t).outcome
        out.append((outcome, truth(sc, t.params)["outcome"] if outcome == "skipped" else outcome))
    return out


def summary(pairs: list[tuple[str, str]]) -> tuple[str, bool]:
    """One scenario's line, and whether it meets the target."""
    would = [v for v, real in pairs if real == "oom"]
    skipped = would.count("skipped")
    false = sum(v == "skipped" and real in FEASIBLE for v, real in pairs)
    other = Counter(real for v, real in pairs if v == "skipped" and real not in (*FEASIBLE, "oom"))
    ok = false == 0 and (not would or skipped >= 0.8 * len(would))
    line = (f"would-OOM {len(would)}, skipped {skipped} ({skipped / max(1, len(would)):.0%}); "
            f"feasible skipped {false}; skipped that fail otherwise {dict(other) or 0}; "
            f"{len(pairs)} configs in all")
    return line, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=40, help="launched configs per study")
    ap.add_argument("--procs", type=int, default=2)
    add_scenarios_option(ap)
    args = ap.parse_args()
    names = scenario_names(ap, args.scenarios)
    if args.seeds < 1 or args.trials < 1 or args.procs < 1:
        ap.error("--seeds, --trials and --procs must be at least 1")
    t0 = time.time()
    _init()
    jobs = [(n, s, args.trials) for n in names for s in range(args.seeds)]
    with mp.Pool(args.procs, _init) as pool:
        streams = pool.map(run_stream, jobs)
    failed = False
    print(f"pre-screen on random search's proposals, {args.seeds} seeds x {args.trials} "
          "launched configs; target >= 80% of would-OOM skipped, 0 feasible skipped")
    for n in names:
        line, ok = summary([p for (name, _, _), s in zip(jobs, streams) if name == n for p in s])
        failed |= not ok
        print(f"  {n}: {line}{'' if ok else '  FAIL'}")
    print(f"total {time.time() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
