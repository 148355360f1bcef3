"""Memory pre-screen: record hopeless configs as infeasible without launching a server.

Why: an OOM costs a server start (a minute for an 8B model) plus the cells before it.  The
estimate (`tuner.trial.memory_estimate`) is rough, so the decision is calibrated on the study's
own evidence:

* runtime overhead: once a server was seen idle (`idle_bytes`: NVML on a real card, the
  simulator's figure in simulation), the measured idle - weights - pool replaces the prior
  (idle - weights where the server allocates its pool on first use: `pool_on_first_use`),
  per CUDA-graph setting (the other setting is shifted by the prior's difference);
* margin: before any evidence a config is skipped only when its need exceeds the card by
  `PRIOR_MARGIN` (the estimate errs low, so this skips only the certain cases).  Where the
  study's memory marks measured the forward smaller than estimated
  (`tuner.trial.kv_calibration`), that rule reads the calibrated need, the figure the KV edge
  is drawn with: on the H200 transformers study of Llama-3.1-8B under 24 GiB the forward
  measured 0.23 to 0.4 of the estimate, and the estimate alone skipped four pushes to the edge,
  48k- to 51k-token pools predicted at 27.9 to 28.7 GiB, that ran healthy at 22.6 to 22.9 GiB
  when launched (benchmarks/results/h200-transformers-8b-r11).
* OOMs: an OOM at need N lowers the bar to N (+ OOM_MARGIN of the card) for configs whose
  largest forward comes from the same cell, the cell the OOM happened in (`cell_evidence`; on
  Llama-3.2-3B / RTX 4090 two configs estimated to peak in a 6k-prompt cell ran out of memory
  in the chat cell after it, and their need skipped a config with a smaller chat-cell forward
  that runs healthy: benchmarks/results/search_efficiency.md, round 46), with the same
  CUDA-graph setting (the same failure mechanism: a long prefill and a wide decode are
  estimated with different errors, so comparing needs across mechanisms skipped healthy
  configs in the benchmark; in r11 one OOM without graphs skipped the graph configs above),
  and whose forward is no smaller (the estimate's error grows with the forward: on the H200
  transformers study two OOMs of 16k- and 54k-token batches, estimated at 18.5 GiB, got a
  config with a 3k-token batch and a larger pool, estimated at 21.5 GiB of a 24 GiB card,
  skipped without a run);
* proven scales: an OOM in a cell proves that cell's forward, of its form (a prefill of N
  prompts, beside M decodes or none; a decode), at least (card - weights - pool - runtime) /
  estimated forward times the estimate (`tuner.trial.kv_calibration.proven`); a config whose
  forward of that form cannot fit at that scale is skipped, whatever its pool.  The margin
  rule above needs a forward no smaller than the OOM's; this one transfers the scale instead,
  and only between configs whose worst case has the same form;
* measured scales: where the card's memory marks measured a cell's forward on a run
  (`tuner.trial.kv_calibration.measured`), a config whose forward of the same form, at the
  smallest scale measured for it, plus its weights, pool and the smallest runtime seen, cannot
  fit is skipped (the form must have been measured with the config's own CUDA-graph setting).
  No margin: every part is the least the study has seen, which is not a bound (within one form
  the scale still varies, down to half its median: benchmarks/estimate_error.py).  The OOM
  rules need an OOM first; on scenarios where a whole study meets one or two, each is the first
  of its cell, estimated 0-10% over the card (under the prior margin), and the marks of healthy
  runs of its form had often measured it (benchmarks/results/search_efficiency.md, round 20);
* the least any run measured: every cell runs at least one prompt's prefill alone
  (`tuner.trial.memory_estimate.least_forward`), and no form of forward was measured below
  the smallest scale the marks saw; a config whose weights, pool, least runtime seen and that
  prefill at that scale (at 0 before any mark: it cannot even start) cannot fit is skipped,
  whatever its own form.  The measured-scale rule needs the config's own form measured; on
  random search's proposals most forms never are (most configs of a random stream run out of
  memory), and the launched OOMs were mostly of forms no run had measured, or pools that did
  not leave the runtime room to start.  The smallest scale of all applied to the whole worst
  case skipped 9 feasible configs in 140 random studies of 40 launches (8B and 3B on an RTX
  4090: a compound form's worst case is rarely reached, and one run's few measured forms put
  the smallest scale at 0.98-1.09); applied to one prompt's prefill it skipped none, and took
  recall (would-OOM configs not launched) from 31 to 54% on Qwen2.5-7B / L40S and from 86
  to 95% on 70B / H200 (benchmarks/prescreen_recall.py, results round 23);
* a nearer measurement: the rules that carry evidence from other configs (the OOM margin,
  the proven and measured scales, the least of all) leave alone a cell the config's nearest
  measured config, fewer knobs away than every run that puts the cell's form higher, says
  fits (`tuner.trial.kv_calibration.vouched`);
* a footprint check (`Estimate.checked`, role `cache_memory_share`): the server's own
  arithmetic, so once a server was seen idle (the runtime measured) a config the check
  refuses is skipped without a margin; before that, only by the prior margin;
* healthy runs: a healthy run at need H raises the bar to at least H: a config whose need is
  at or below one seen running healthy is never skipped, whatever the OOMs say.  And an OOM
  bars no config whose own knobs (all but the pool) ran healthy at a need above the OOM's:
  for those knobs the two configs do not err alike, which is all the OOM rule rests on
  (Llama-3.1-8B / L40S open loop, round 52: a bisection between its own knobs' healthy run
  and their OOM was skipped by another config's OOM, 1.5 GiB under the healthy run's need, and
  it runs healthy).

Skipped trials are COMPLETE with constraint feasible=1 (the sampler learns the region is
infeasible), outcome 'skipped', with predicted_peak_bytes / capacity_bytes in their record.

Learned infeasibility, graded: every trial also gets the constraint `memory` = (predicted need -
capacity) / capacity, its sign forced to agree with what was seen (> 0 for an OOM or a skip,
< 0 otherwise).  A 0/1 constraint is a cliff a Gaussian process models badly; this one says how
far a config is from the memory edge, where the best configs of a KV-bound workload sit.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.study.record import TrialRecord
from tuner.trial.memory_estimate import Estimate, runtime_prior

PRIOR_MARGIN = 0.10
OOM_MARGIN = 0.03   # the estimate's error between two configs of one mechanism (benchmark: <= ~3%)
MEMORY_EPS = 0.01
HEALTHY = ("ok", "slo")


@dataclass(frozen=True)
class Decision:
    skip: bool
    need: int               # calibrated estimate of the config's peak bytes
    threshold: int          # skip above this
    reason: str


def estimate_attr(est: Estimate, cuda_graph: bool) -> dict[str, Any]:
    """What a trial stores so that later trials can recalibrate against it."""
    return {"weights": est.weights, "pool": est.pool, "forward": est.forward,
            "runtime": est.runtime, "cuda_graph": cuda_graph, "peak_cell": est.peak_cell,
            "cell_forwards": dict(est.cell_forwards), "cell_forms": dict(est.cell_forms),
            "checked": est.checked}


def _stored(t: TrialRecord) -> Mapping[str, Any] | None:
    if not t.original or not isinstance(t.memory, Mapping):
        return None
    return t.memory


def calibrated_runtime(trials: Sequence[TrialRecord], cuda_graph: bool,
                       pick: Callable[[list[int]], float] = statistics.median) -> int:
    """Median (or `pick` of the) measured runtime overhead for this graph setting (see module
    doc), else the prior."""
    seen: dict[bool, list[int]] = {False: [], True: []}
    lazy = pool_on_first_use(trials)
    for t in trials:
        attr, idle = _stored(t), t.idle_bytes
        if attr is not None and idle is not None and idle > 0:
            beyond = int(idle) - attr["weights"]
            seen[bool(attr["cuda_graph"])].append(max(0, beyond) if lazy
                                                  else beyond - attr["pool"])
    if seen[cuda_graph]:
        return int(pick(seen[cuda_graph]))
    other = seen[not cuda_graph]
    if other:
        return (
            int(pick(other))
            + runtime_prior(cuda_graph)
            - runtime_prior(not cuda_graph)
        )
    return runtime_prior(cuda_graph)


def pool_on_first_use(trials: Sequence[TrialRecord]) -> bool:
    """Whether the server allocates its pool on first use, not at start-up: some run idled
    under its weights + pool.  Then idle - weights is the runtime overhead, and the pool is
    allocated in the first cell.  (transformers serve idled at the same 15.5 GiB with pools of
    0.4 to 6 GiB on the H200; idle - weights - pool came out at -3.5 to -2 GiB, and a config
    was skipped against an OOM whose need that negative runtime had lowered.  Judged per run,
    the 0.36 GiB pool under its 0.52 GiB overhead passed as allocated at start-up.)"""
    return any(int(t.idle_bytes) - a["weights"] < a["pool"] for t in trials
               if (a := _stored(t)) is not None and t.idle_bytes is not None and t.idle_bytes > 0)


def cell_evidence(t: TrialRecord, attr: Mapping[str, Any]) -> list[tuple[str, bool]]:
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


def _check_need(attr: Mapping[str, Any], runtime: int) -> int:
    """The card the server's footprint check (module doc) asks of the config stored as
    `attr`, with this runtime overhead; 0 where there is no check."""
    checked = attr.get("checked") or 0
    return attr["weights"] + runtime + checked if checked else 0


def _need(attr: Mapping[str, Any], runtime: Mapping[bool, int]) -> int:
    r = runtime[bool(attr["cuda_graph"])]
    return int(max(attr["weights"] + attr["pool"] + attr["forward"] + r, _check_need(attr, r)))


def refused_by_check(attr: Mapping[str, Any], runtime: int, capacity: int) -> bool:
    """Whether the server's footprint check refuses the config stored as `attr`."""
    return _check_need(attr, runtime) > capacity


def decide(est: Estimate, capacity: int, trials: Sequence[TrialRecord],  # noqa: PLR0913
           calibrated: float | None = None, graph: bool = False,
           proven: Mapping[tuple[str, bool, str], float] | None = None,
           measured: Mapping[tuple[str, bool, str], float] | None = None,
           vouched: Collection[str] = (), siblings: Sequence[TrialRecord] = ()) -> Decision:
    """Skip or run a config whose (calibrated) estimate is `est` and CUDA-graph setting
    `graph`, given the study so far; `calibrated`: its need with the forward scale the study
    measured (see module doc), which the margin rule reads where it is lower.  The OOM rule
    compares estimates of one mechanism, so it keeps the estimate; `proven`: the forward
    scales the study's OOMs proved, per form of forward (`tuner.trial.kv_calibration.proven`);
    `measured`: the smallest its memory marks measured (`tuner.trial.kv_calibration.measured`);
    `vouched`: cells a nearer measurement clears (`tuner.trial.kv_calibration.vouched`), which
    the rules that carry evidence from other configs (scales, the OOM margin) leave alone;
    `siblings`: the runs of the config's own knobs at other pools, whose healthy needs refute
    the OOMs under them for these knobs (module doc)."""
    need = est.need
    certain = need if calibrated is None else min(need, int(calibrated))
    runtime = {g: calibrated_runtime(trials, g) for g in (False, True)}  # once, not per trial
    healthy = [_need(a, runtime) for t in trials
               if (a := _stored(t)) is not None and t.outcome in HEALTHY]
    own = max((_need(a, runtime) for t in siblings
               if (a := _stored(t)) is not None and t.outcome in HEALTHY), default=0)
    oom = [n for t in trials
           if (a := _stored(t)) is not None and t.outcome == "oom"
           and a.get("peak_cell") == est.peak_cell and (est.peak_cell, True) in cell_evidence(t, a)
           and bool(a["cuda_graph"]) == graph
           and a["forward"] <= est.forward
           and not refused_by_check(a, runtime[bool(a["cuda_graph"])], capacity)
           and (n := _need(a, runtime)) >= own]
    prior = int(capacity * (1 + PRIOR_MARGIN))
    floor = max(healthy, default=0)
    bar = min([prior, *oom])
    threshold = max(floor, bar)
    gib = 2 ** 30
    idle_seen = any(t.idle_bytes for t in trials if _stored(t) is not None)
    attr = estimate_attr(est, graph)
    if idle_seen and refused_by_check(attr, runtime[graph], capacity):
        want = _check_need(attr, runtime[graph])
        return Decision(True, need, threshold,
                        f"the server's footprint check wants {want / gib:.2f} GiB of the card's "
                        f"{capacity / gib:.2f} GiB (its cache memory share)")
    if need <= floor:
        return Decision(False, need, threshold,
                        f"needs {need / gib:.2f} GiB, no more than a config seen healthy")
    if certain > prior:
        return Decision(True, need, threshold,
                        f"predicted peak {certain / gib:.2f} GiB exceeds the card's "
                        f"{capacity / gib:.2f} GiB by more than {PRIOR_MARGIN:.0%}")
    least = calibrated_runtime(trials, graph, min)
    smallest = min((measured or {}).values(), default=0.0 if idle_seen else None)
    lone = dataclasses.replace(est, cell_forwards=est.cell_least, cell_forms=tuple(
        (cell, "one prompt's prefill") for cell, _ in est.cell_least))
    floor_scales = {} if smallest is None else {(c, graph, f): smallest
                                                for c, f in lone.cell_forms}
    rules = ((est, proven, est.runtime, "an OOM proved the forward of its form", "at least"),
             (est, measured, least, "runs measured the forward of its form", "at no less than"),
             (lone, floor_scales, least, "runs measured every form of forward",
              "at no less than"))
    for judged, scales, rt, who, bound in rules:
        hit = _beyond_scale(judged, scales or {}, graph, rt, capacity, vouched)
        if hit is not None:
            cell, form, scale, at = hit
            return Decision(True, need, threshold,
                            f"{who} ({form} in cell {cell}) {bound} {scale:.2f}x the estimate: "
                            f"at that scale it needs {at / gib:.2f} GiB of the card's "
                            f"{capacity / gib:.2f} GiB")
    if oom and need >= min(oom) + OOM_MARGIN * capacity and est.peak_cell not in vouched:
        return Decision(True, need, threshold,
                        f"predicted peak {need / gib:.2f} GiB is above that of a config that ran "
                        f"out of memory ({min(oom) / gib:.2f} GiB, same largest cell) by more "
                        f"than {OOM_MARGIN:.0%} of the card")
    return Decision(False, need, threshold, f"predicted peak {need / gib:.2f} GiB may fit")


def _beyond_scale(est: Estimate, scales: Mapping[tuple[str, bool, str], float], graph: bool,
                  runtime: int, capacity: int,
                  vouched: Collection[str]) -> tuple[str, str, float, int] | None:
    """(cell, form, scale, need) of the first cell not `vouched` for whose forward, at the
    scale `scales` holds for its form, does not fit beside the weights, the pool and
    `runtime`; None if all fit."""
    forms = dict(est.cell_forms)
    for cell, forward in est.cell_forwards:
        if cell in vouched:
            continue
        form = forms.get(cell, "")
        scale = scales.get((cell, graph, form))
        if scale is not None and (at := int(est.static + runtime + scale * forward)) > capacity:
            return cell, form, scale, at
    return None


def memory_constraint(need: int, capacity: int, outcome: str) -> float:
    """The graded `memory` constraint (see module doc): positive exactly when memory failed."""
    m = (need - capacity) / capacity
    return max(m, MEMORY_EPS) if outcome in ("oom", "skipped") else min(m, -MEMORY_EPS)
