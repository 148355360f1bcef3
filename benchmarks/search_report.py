"""The table benchmarks/search_efficiency.py prints: per scenario and budget, each method's
median [min] share of the best known config over the seeds, the seeds it beats random in, and
the issue's targets (see search_efficiency's docstring), each failure named."""

from __future__ import annotations

import math
import statistics
from typing import Any

from search_scenarios import Scenario

BUDGETS = (10, 20, 30, 40)
METHODS = ("tuner", "tpe", "random", "grid")


def prefix(rows: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """The trials up to and including the `budget`-th measured one."""
    out, n = [], 0
    for r in rows:
        if n >= budget:
            break
        out.append(r)
        n += r["measured"]
    return out


def scenario_table(sc: Scenario, results: list[dict[str, Any]], best: float,
                   n_seeds: int) -> list[str]:
    """One block of the table, and the failed targets appended to `fails`."""
    per = {m: {r["seed"]: r["rows"] for r in results if r["method"] == m
               and r.get("budget", BUDGETS[-1]) == BUDGETS[-1]} for m in METHODS}
    own = {(r["seed"], r["budget"]): r["rows"] for r in results  # --per-budget studies
           if r["method"] == "tuner" and r.get("budget", BUDGETS[-1]) != BUDGETS[-1]}
    lines, fails = [], []
    for budget in BUDGETS:
        ratios = {m: {s: max((r["best"] for r in prefix(
            own.get((s, budget), rows) if m == "tuner" else rows, budget)), default=0.0) / best
            for s, rows in per[m].items()} for m in METHODS}
        rnd = ratios["random"]
        cells = []
        for m in METHODS:
            v = list(ratios[m].values())
            wins = sum(ratios[m][s] > rnd.get(s, math.inf) for s in ratios[m])
            cells.append(f"{statistics.median(v):.3f} [{min(v):.3f}]" + (
                f" {wins:>2}/{len(v)}" if m != "random" else "       "))
        lines.append(f"  {budget:>6}  " + "  ".join(f"{c:>21}" for c in cells))
        tv = list(ratios["tuner"].values())
        wins = sum(ratios["tuner"][s] > rnd[s] for s in rnd)
        if budget == 30 and (statistics.median(tv) < 0.98 or min(tv) < 0.90):
            fails.append(f"at 30: median {statistics.median(tv):.3f} (>= 0.98), "
                         f"min {min(tv):.3f} (>= 0.90)")
        if budget == 20 and statistics.median(tv) < 0.90:
            fails.append(f"at 20: median {statistics.median(tv):.3f} (>= 0.90)")
        if wins < math.ceil(0.9 * n_seeds):
            ties = sum(ratios["tuner"][s] == rnd[s] for s in rnd)
            fails.append(f"at {budget}: beats random in {wins}/{n_seeds} (>= 9/10; "
                         f"{ties} tied)")
    rows = [r for s in per["tuner"].values() for r in prefix(s, BUDGETS[-1])]
    away = [a for r in results if r["method"] == "tuner" for a in r.get("away", [])]
    away_oom, away_ok = away.count("oom"), sum(a in ("ok", "slo") for a in away)
    would = [r for r in rows if (r["skipped"] and r["truth"] == "oom") or r["oom"]]
    skipped = sum(r["skipped"] and r["truth"] == "oom" for r in rows) + away_oom
    false = sum(r["skipped"] and r["truth"] in ("ok", "slo") for r in rows) + away_ok
    n_would = len(would) + away_oom
    late = [r for s in per["tuner"].values() for r in [x for x in prefix(s, BUDGETS[-1])
                                                       if x["measured"]][5:]]
    late_oom = sum(r["oom"] for r in late)
    own_false = sum(r["skipped"] and r["truth"] in ("ok", "slo")   # the 10/20/30-trial studies
                    for rows in own.values() for r in rows)
    lines.append(f"  pre-screen: {skipped}/{n_would} would-OOM configs not launched, {false} "
                 f"feasible not launched (of which turned away by the proposals' memory "
                 f"filter: {away_oom} would OOM, {away_ok} feasible at the smallest pool)"
                 + (f", {own_false} feasible not launched in the --per-budget studies" if own
                    else "") + f"; OOM launches after the first 5: {late_oom}/{len(late)}"
                 f" = {late_oom / max(1, len(late)):.1%}")
    if false or own_false or (n_would and skipped < 0.8 * n_would):
        fails.append(f"pre-screen: {skipped}/{n_would} not launched (>= 80%), {false} "
                     f"+ {own_false} feasible not launched (0)")
    if late_oom > 0.10 * len(late):
        fails.append(f"OOM launches {late_oom}/{len(late)} after the first 5 (<= 10%)")
    lines += [f"  FAIL {f}" for f in fails] or ["  all targets met"]
    return lines
