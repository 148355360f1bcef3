"""Two revisions of the tuner's search, side by side, on the suite's scenarios and many seeds.

Why: a change to the search moves one seed's path and then everything after it, so the 10 seeds
of benchmarks/search_efficiency.py cannot tell a change of a few hundredths from chance.  This
runs the tuner method only (the same `run_study` as the suite) for two git revisions and more
seeds, and prints per scenario and budget the mean, median and 10th percentile of best/reference
for each, and the seeds each one wins.  The reference is the best config either revision or the
ground truth (when cached) found.

Usage: python benchmarks/search_ab.py REV_A REV_B [--seeds 30] [--procs 2] [--scenarios a,b]
Each revision is checked out into a temporary git worktree (removed at the end); finished
studies are cached in benchmarks/out/ by code fingerprint, so a rerun or a third revision only
runs what is new.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = (10, 20, 30, 40)


def worker(seeds: int, procs: int, scenarios: list[str]) -> None:
    """In a revision's tree: every study's best feasible throughput after each budget."""
    import multiprocessing as mp

    sys.path.insert(0, str(Path.cwd() / "benchmarks"))
    import search_efficiency as se

    jobs = [(sc, "tuner", s) for sc in scenarios for s in range(seeds)]
    with mp.Pool(procs, se._init) as pool:
        results = pool.map(se.run_study, jobs, chunksize=1)
    out: dict[str, dict[int, list[float]]] = {}
    for (sc, _, seed), res in zip(jobs, results):
        measured = [r["best"] for r in res["rows"] if r["measured"]]
        out.setdefault(sc, {})[seed] = [max(measured[:b], default=0.0) for b in BUDGETS]
    truths = {}
    for sc in scenarios:
        path = se.OUT / "truth" / f"{sc}-{se.fingerprint(se.by_name(sc))}.pkl"
        if path.is_file():
            truths[sc] = max(r["throughput"] for r in pickle.loads(path.read_bytes()))
    print(json.dumps({"runs": out, "truths": truths}))


def run_revision(rev: str, tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Check `rev` out into `tree` and run its studies there, in a process group of its own."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                   check=True, capture_output=True)
    (ROOT / "benchmarks" / "out").mkdir(exist_ok=True)
    (tree / "benchmarks" / "out").symlink_to(ROOT / "benchmarks" / "out")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--seeds", str(args.seeds),
           "--procs", str(args.procs), "--scenarios", args.scenarios]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{rev}: the studies failed (exit {proc.returncode})")
    return json.loads(stdout.strip().splitlines()[-1])


def table(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> list[str]:
    """The side-by-side lines, per scenario and budget."""
    lines = [f"{'budget':>8}  " + "  ".join(f"{n[:12] + ' mean/med/p10':>26}" for n in names)
             + "   wins A/B"]
    for sc, runs_a in a["runs"].items():
        runs_b = b["runs"][sc]
        ref = max([v[-1] for v in (*runs_a.values(), *runs_b.values())]
                  + [a["truths"].get(sc, 0.0)])
        if ref <= 0:
            lines.append(f"{sc}: nothing feasible in any study of either revision, "
                         f"{len(runs_a)} seeds")
            continue
        lines.append(f"{sc}: reference {ref:.1f} tok/s, {len(runs_a)} seeds")
        for i, budget in enumerate(BUDGETS):
            cols, per = [], []
            for runs in (runs_a, runs_b):
                vals = sorted(v[i] / ref for v in runs.values())
                per.append([runs[s][i] for s in sorted(runs)])
                cols.append(f"{statistics.mean(vals):.3f} / {statistics.median(vals):.3f} / "
                            f"{vals[len(vals) // 10]:.3f}")
            wins = (sum(x > y for x, y in zip(*per)), sum(y > x for x, y in zip(*per)))
            lines.append(f"{budget:>8}  " + "  ".join(f"{c:>26}" for c in cols)
                         + f"   {wins[0]:>4}/{wins[1]}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revs", nargs="*", help="two git revisions: REV_A REV_B")
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--procs", type=int, default=2)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from search_scenarios import SCENARIOS
    ap.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.seeds, args.procs, args.scenarios.split(","))
        return 0
    if len(args.revs) != 2:
        ap.error("give two revisions, e.g. HEAD~1 HEAD")
    with tempfile.TemporaryDirectory() as tmp:
        trees = [Path(tmp) / f"rev{i}" for i in range(2)]
        try:
            results = [run_revision(rev, tree, args) for rev, tree in zip(args.revs, trees)]
        finally:
            for tree in trees:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(tree)], check=False, capture_output=True)
    print("best/reference: mean / median / 10th percentile over seeds; wins: seeds where A, B "
          "is better")
    print("\n".join(table(results[0], results[1], (f"A {args.revs[0]}", f"B {args.revs[1]}"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
