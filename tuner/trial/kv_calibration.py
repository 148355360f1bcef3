"""What a study's OOMs and healthy runs say about the memory estimate's error.

Why: the estimate (`tuner.trial.memory_estimate`) is a model; its runtime overhead and its
transient forward bytes are off by amounts that differ between servers, models and cells.  Each
launched trial bounds that error: a start-up OOM proves the runtime larger than the room the
weights and pool left, an OOM under load proves the forward scale `k` above (card - static) /
forward for the cell it died in, and a healthy run proves it at most that.  `Calibration` keeps
the bounds; `tuner.trial.kv_share` renders KV pools with them and `tuner.study.proposals`
filters candidates with them.

The Llama-3.1-70B / H200 and Llama-3.2-1B / RTX 3090 figures quoted here predate the fix of
the in-process simulator (2026-12-01): those scenarios' feasible configs were then ones whose
pool refused their longest prompts (benchmarks/results/search_efficiency.md, round 7).  The
mechanisms stay; those figures do not stand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.study.record import TrialRecord
from tuner.trial.prescreen import HEALTHY, calibrated_runtime

MIN_STEP = 0.05             # smallest correction of the forward scale worth a trial


def _stored(t: TrialRecord) -> Mapping[str, Any] | None:
    """The memory estimate of a trial that ran on the server itself."""
    return t.memory if isinstance(t.memory, Mapping) and not t.unmeasured else None


@dataclass(frozen=True)
class Calibration:
    """What the study's outcomes say about the estimate's error (see module doc)."""

    runtime_floor: dict[bool, int]      # CUDA graphs -> a start-up OOM proves runtime above
    scale: dict[str, tuple[float, float]]  # mechanism -> (k proven above, k proven at most)

    def k(self, cell: str, graph: bool = False) -> float:
        """The forward scale the edge assumes for this mechanism (see module doc); with CUDA
        graphs and no evidence of their own, what the runs without graphs taught."""
        key = mechanism(cell, graph)
        lo, hi = self.scale.get(key if key in self.scale else cell, (0.0, math.inf))
        if lo >= hi:        # the runs disagree (the error differs between configs): the OOMs win
            return lo + MIN_STEP
        healthy = min(hi, 1.0)  # the estimate, or less where healthy runs proved it over
        if lo < healthy:    # an OOM never makes the scale smaller than the healthy runs alone
            return healthy  # would: on 70B / H200 one did, and the filter admitted OOMs
        gallop = lo + max(lo - 1.0, MIN_STEP)   # double the under-estimate proven so far
        return min(gallop, (lo + hi) / 2)       # never past the middle of the bracket


def mechanism(cell: str, graph: bool) -> str:
    """The key of one forward scale: the cell, and whether CUDA graphs were on.  An OOM with
    graphs says little about the forward without them: on Llama-3.1-70B / H200 the first graph
    config's OOM, charged to a shared scale, contradicted what the runs without graphs had
    proven, and the filter then admitted configs that OOMed in a third of the trials."""
    return f"{cell}+graph" if graph else cell


def _cell_evidence(t: TrialRecord, attr: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """(cell, failed) for every cell the trial ran, in order: the cells before an OOM and every
    cell of a healthy run held, the OOM's own cell did not.  The mechanism of an OOM is the cell
    it happened in, not the estimate's peak cell (on Llama-3.1-70B / H200 the estimate called the
    8k prompt the peak, while the runs died in the 2k cell's batched prefill); an OOM after all
    cells finished without error (the capacity search's heavier load) is charged to none."""
    keys = [row.get("cell", {}).get("key") if isinstance(row.get("cell"), Mapping) else None
            for row in t.cells]
    if not keys or None in keys:          # no cell keys stored: the estimate's peak cell
        return [(attr["peak_cell"], t.outcome == "oom")]
    after = all("error_class" in row and not row["error_class"] for row in t.cells)
    return [(str(k), t.outcome == "oom" and not after and i == len(keys) - 1)
            for i, k in enumerate(keys)]


def calibrate(trials: Sequence[TrialRecord], capacity: int) -> Calibration:
    """Bounds on runtime and forward scale from the OOMs and healthy runs seen so far."""
    floor = {False: 0, True: 0}
    scale: dict[str, tuple[float, float]] = {}
    runtimes = {g: calibrated_runtime(trials, g) for g in (False, True)}
    for t in trials:
        attr = _stored(t)
        if attr is None or t.outcome not in (*HEALTHY, "oom"):
            continue
        graph = bool(attr["cuda_graph"])
        if t.outcome == "oom" and not t.cells:   # died before any cell: the runtime was low
            floor[graph] = max(floor[graph], capacity - attr["weights"] - attr["pool"])
            continue
        room = capacity - attr["weights"] - attr["pool"] - runtimes[graph]
        forwards = attr.get("cell_forwards") or {attr["peak_cell"]: attr["forward"]}
        for cell, failed in _cell_evidence(t, attr):
            forward = forwards.get(cell, 0)
            if forward <= 0:
                continue
            key = mechanism(cell, graph)
            lo, hi = scale.get(key, (0.0, math.inf))
            bound = room / forward
            scale[key] = (max(lo, bound), hi) if failed else (lo, min(hi, bound))
    return Calibration(floor, scale)
