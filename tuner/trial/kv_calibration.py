"""What a study's OOMs and healthy runs say about the memory estimate's error.

Why: the estimate (`tuner.trial.memory_estimate`) is a model; its runtime overhead and its
transient forward bytes are off by amounts that differ between servers, models and cells.  Each
launched trial bounds that error: a start-up OOM proves the runtime larger than the room the
weights and pool left, an OOM under load proves the forward scale `k` above (card - static) /
forward for the cell it died in, and a healthy run proves it at most that.  Where the card's
memory high-water mark was read per cell (`tuner.server.memwatch`; the simulator's own figure),
a cell that raised the mark measured its forward outright: mark - idle, a scale seen without an
OOM, and the estimate's scale for that mechanism is at least the largest seen (before, the
first OOM of each mechanism was what taught the scale: most OOM launches of the benchmark
suite were configs just past an edge the uncalibrated estimate had put too high).
`Calibration` keeps the bounds; `tuner.trial.kv_share` renders KV pools with them and
`tuner.study.proposals` filters candidates with them.

The Llama-3.1-70B / H200 and Llama-3.2-1B / RTX 3090 figures quoted here predate the fix of
the in-process simulator (2026-12-01): those scenarios' feasible configs were then ones whose
pool refused their longest prompts (benchmarks/results/search_efficiency.md, round 7).  The
mechanisms stay; those figures do not stand.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.study.record import TrialRecord, config_key
from tuner.trial.memory_estimate import Estimate
from tuner.trial.prescreen import (
    HEALTHY,
    calibrated_runtime,
    cell_evidence,
    pool_on_first_use,
    refused_by_check,
)

MIN_STEP = 0.05             # smallest correction of the forward scale worth a trial


def _stored(t: TrialRecord) -> Mapping[str, Any] | None:
    """The memory estimate of a trial that ran on the server itself."""
    return t.memory if isinstance(t.memory, Mapping) and not t.unmeasured else None


@dataclass(frozen=True)
class Calibration:
    """What the study's outcomes say about the estimate's error (see module doc)."""

    runtime_floor: dict[bool, int]      # CUDA graphs -> a start-up OOM proves runtime above
    scale: dict[str, tuple[float, float]]  # mechanism -> (k proven above, k proven at most)
    seen: dict[str, float] = field(default_factory=dict)  # mechanism -> largest k measured
    # (a measured config's knobs but its pool, the scales it measured), per config
    own: list[tuple[dict[str, Any], dict[str, float]]] = field(default_factory=list)
    shaped: dict[tuple[str, str], float] = field(default_factory=dict)  # (cell, form_class) ->
    # the smallest k a memory mark measured on a forward of that shape, CUDA graphs or not
    # (a config's knobs but its pool, the largest pool (bytes) it ran out of memory at, the
    # scale each of its OOMs proved it over), per config
    oomed: list[tuple[dict[str, Any], int, dict[str, float]]] = field(default_factory=list)
    held: list[tuple[dict[str, Any], int]] = field(default_factory=list)  # (knobs, the largest
    # pool it ran healthy at), per config
    _near: dict[tuple[str, str], tuple[int, float]] = field(
        default_factory=dict, compare=False, repr=False)
    _lo: dict[tuple[str, str], float] = field(default_factory=dict, compare=False, repr=False)

    def k(self, cell: str, graph: bool = False,
          knobs: Mapping[str, Any] | None = None, form: str | None = None) -> float:
        """`scale_of`, never below the least that memory marks measured on forwards of the
        same shape (`form_class` of `form`), unless the config's own run measured the cell.

        Why: the estimate's forward adds a prefill's activations, which every run of its shape
        reaches, to the context of the decodes beside it, an upper bound the arrivals reach or
        not; its error differs between shapes far more than within one.  On Qwen2.5-7B / RTX
        3090 (q-qwen7b-3090-open, seed 1) six runs of one prompt's prefill beside decodes
        measured 1.02-1.03 of their estimate, while a healthy run of five prompts' prefill put
        the cell's scale at most 0.77, and the proposals sized a pool 21% past the edge for a
        config of the first shape: two OOMs.  The least, not the largest, of the shape: the
        largest kept pools under their edge (9 q-qwen7b studies of 20-40 trials lost 4-12%,
        benchmarks/results/search_efficiency.md, round 43)."""
        scale = self.scale_of(cell, graph, knobs)
        near = self.nearest(cell, graph, knobs) if knobs is not None else None
        if form is None or (near is not None and near[0] == 0):
            return scale
        return max(scale, self.shaped.get((cell, form_class(form)), 0.0))

    def scale_of(self, cell: str, graph: bool = False,
                 knobs: Mapping[str, Any] | None = None) -> float:
        """The forward scale the edge assumes for this mechanism (see module doc); with CUDA
        graphs and no evidence of their own, what the runs without graphs taught.  For a config
        (`knobs`: its params but the pool) whose own run measured this mechanism, that
        measurement; else the scale the nearest measured config saw (`nearest`), in place of
        the estimate's 1.0.  The scale differs between configs (0.87 to 1.14 between the
        healthy runs of one Llama-3.1-8B / RTX 4090 study), and the largest of all kept the
        best configs' pools hundreds of MiB under their edge.  Of the OOMs, those a controlled
        comparison charges to knobs the config does not have are left out (`oom_bound`)."""
        key = mechanism(cell, graph)
        near = self.nearest(cell, graph, knobs) if knobs is not None else None
        if near is not None and near[0] == 0:
            return near[1]
        lo, hi = self.scale.get(key if key in self.scale else cell, (0.0, math.inf))
        if knobs is not None and self.oomed:
            lo = self.oom_bound(key if key in self.scale else cell, knobs)
        if lo >= hi:        # the runs disagree (the error differs between configs): the OOMs win
            return lo + MIN_STEP
        # the estimate (or the scale a high-water mark measured), or less where healthy runs
        # proved it over
        prior = near[1] if near is not None else \
            self.seen.get(key if key in self.seen else cell, 1.0)
        healthy = min(hi, prior)
        if lo < healthy:    # an OOM never makes the scale smaller than the healthy runs alone
            return healthy  # would: on 70B / H200 one did, and the filter admitted OOMs
        gallop = lo + max(lo - 1.0, MIN_STEP)   # double the under-estimate proven so far
        return min(gallop, (lo + hi) / 2)       # never past the middle of the bracket

    def oom_bound(self, key: str, knobs: Mapping[str, Any]) -> float:
        """The largest scale the OOMs proved the mechanism `key` over (0.0: none did), but for
        an OOM a controlled comparison charges to knobs that `knobs` does not share: a config
        that ran healthy at a pool at least as large, whose knobs `knobs` has wherever it and
        the config that ran out differ.

        Why: that pair shows which knobs took the memory, and a config without them errs as
        the healthy one does.  On Qwen2.5-7B / RTX 3090 (q-qwen7b-3090-open, seed 7 at 30
        trials) the incumbent ran healthy at 41.6k tokens and its flip to a 1024-token
        long-context guard ran out of memory at 41.5k; the cell's scale galloped for every
        config, and the incumbent's next eight neighbours, none with that guard, ran at
        40.7k and each missed the p99 TTFT SLO the incumbent met at 41.6k (one of them, run
        at 41.6k, fits)."""
        def explained(theirs: Mapping[str, Any], pool: int) -> bool:
            return any(held >= pool and (apart := [n for n, v in theirs.items() if ok.get(n) != v])
                       and all(knobs.get(n) == ok.get(n) for n in apart)
                       for ok, held in self.held)
        memo = (config_key(knobs), key)
        if memo not in self._lo:
            self._lo[memo] = max((bounds[key] for theirs, pool, bounds in self.oomed
                                  if key in bounds and not explained(theirs, pool)), default=0.0)
        return self._lo[memo]

    def nearest(self, cell: str, graph: bool,
                knobs: Mapping[str, Any]) -> tuple[int, float] | None:
        """(knobs apart, scale) of the measured configs nearest `knobs` in this cell: the
        fewest knobs set differently, the largest scale of those; None if none measured it.
        A flip or a neighbour of a config errs as that config does more than as the study's
        runs do on average.  However far the nearest is, its scale counts: capping the reach
        at two knobs (a draw further off taking the largest scale seen) cut OOM launches after
        the first 5 of 350 (10 seeds) from 15 to 11 on Llama-3.1-8B / RTX 4090 and 18 to 10 on
        Mistral-7B, all under the 10% target either way, but took the 1B long-context scenario
        from 9 to 8 seeds of 10 that beat random at 30 and 40 trials (results/search_efficiency.md).
        A config with CUDA graphs also reads what configs without them measured (the graph
        pool is allocated at start-up: the idle memory calibrates it), and one of those is a
        knob apart: on the 8B / RTX 4090 scenario the graph flip of an
        incumbent, sized by the one graph config run, far from it, ran at 0.72 of its pool."""
        key = mechanism(cell, graph)
        memo = (config_key(knobs), key)
        if memo not in self._near:
            found = [(sum(knobs.get(n) != v for n, v in theirs.items()),
                      -scales.get(key, scales.get(cell, 0.0)))
                     for theirs, scales in self.own if key in scales or cell in scales]
            best = min(found, default=None)
            self._near[memo] = (best[0], -best[1]) if best is not None else (-1, 0.0)
        dist, scale = self._near[memo]
        return None if dist < 0 else (dist, scale)


def form_class(form: str) -> str:
    """A forward's form (`tuner.trial.memory_estimate.cell_forward`) without how many decodes
    run beside it: that count grows with the pool, the shape does not."""
    head, beside, _ = form.partition(" beside ")
    return f"{head} beside decodes" if beside else head


def mechanism(cell: str, graph: bool) -> str:
    """The key of one forward scale: the cell, and whether CUDA graphs were on.  An OOM with
    graphs says little about the forward without them: on Llama-3.1-70B / H200 the first graph
    config's OOM, charged to a shared scale, contradicted what the runs without graphs had
    proven, and the filter then admitted configs that OOMed in a third of the trials."""
    return f"{cell}+graph" if graph else cell


def calibrate(trials: Sequence[TrialRecord], capacity: int,
              knobs_of: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
              ) -> Calibration:
    """Bounds on runtime and forward scale from the OOMs and healthy runs seen so far;
    `knobs_of(params)`: a config's params but its pool, for the scales each one measured."""
    floor = {False: 0, True: 0}
    scale: dict[str, tuple[float, float]] = {}
    seen: dict[str, float] = {}
    shaped: dict[tuple[str, str], float] = {}
    own: dict[str, tuple[dict[str, Any], dict[str, float]]] = {}
    oomed: dict[str, tuple[dict[str, Any], int, dict[str, float]]] = {}
    held: dict[str, tuple[dict[str, Any], int]] = {}
    runtimes = {g: calibrated_runtime(trials, g) for g in (False, True)}
    lazy = pool_on_first_use(trials)
    for t in trials:
        attr = _stored(t)
        if attr is None or t.outcome not in (*HEALTHY, "oom"):
            continue
        graph = bool(attr["cuda_graph"])
        if t.outcome == "oom" and refused_by_check(attr, runtimes[graph], capacity):
            continue    # the server's footprint check: neither runtime nor forward (prescreen)
        if t.outcome == "oom" and not t.cells:   # died before any cell: the runtime was low
            floor[graph] = max(floor[graph], capacity - attr["weights"] - attr["pool"])
            continue
        room = capacity - attr["weights"] - attr["pool"] - runtimes[graph]
        forwards = attr.get("cell_forwards") or {attr["peak_cell"]: attr["forward"]}
        knobs = knobs_of(t.params) if knobs_of is not None else {}
        for cell, failed in cell_evidence(t, attr):
            forward = forwards.get(cell, 0)
            if forward <= 0:
                continue
            key = mechanism(cell, graph)
            lo, hi = scale.get(key, (0.0, math.inf))
            bound = room / forward
            scale[key] = (max(lo, bound), hi) if failed else (lo, min(hi, bound))
            if failed:
                _, ran, proved = oomed.get(config_key(knobs), (knobs, 0, {}))
                proved[key] = max(proved.get(key, 0.0), bound)
                oomed[config_key(knobs)] = (knobs, max(ran, int(attr["pool"])), proved)
        if t.outcome in HEALTHY:
            ran = max(held.get(config_key(knobs), (knobs, 0))[1], int(attr["pool"]))
            held[config_key(knobs)] = (knobs, ran)
        mine = own.setdefault(config_key(knobs), (knobs, {}))[1]
        for cell, measured in _measured_forwards(t, attr, lazy).items():
            if forwards.get(cell, 0) > 0:
                key, ratio = mechanism(cell, graph), measured / forwards[cell]
                seen[key] = max(seen.get(key, 0.0), ratio)
                mine[key] = max(mine.get(key, 0.0), ratio)
                shape = (cell, form_class(attr.get("cell_forms", {}).get(cell, "")))
                shaped[shape] = min(shaped.get(shape, math.inf), ratio)
    mapped = [entry for entry in own.values() if entry[1]] if knobs_of is not None else []
    named = knobs_of is not None
    return Calibration(floor, scale, seen, mapped, shaped,
                       list(oomed.values()) if named else [], list(held.values()) if named else [])


def proven(trials: Sequence[TrialRecord], capacity: int) -> dict[tuple[str, bool, str], float]:
    """(cell, CUDA graphs, form of the forward) -> the largest forward scale an OOM in that
    cell proved: the room its weights, pool and runtime left over its estimated forward.  The
    pre-screen skips a config whose forward of that form, at that scale, cannot fit.  Keyed by
    form (`tuner.trial.memory_estimate.cell_forward`), not only by cell as `calibrate` is:
    whether an estimated worst case happens depends on its form (a prefill of two 4k prompts
    arriving together, on the simulated Llama-3.1-8B / RTX 4090, ran one at a time, at 0.54 of
    the estimate, where single prefills ran at 1.02 or more).  With it (and decode-first's
    running set counted right), the pre-screen on random search's proposals skipped 84% of the
    would-OOM configs of Llama-3.1-70B / H200 where the OOM-margin rule alone skipped 30%, with
    no feasible config skipped (benchmarks/prescreen_recall.py, results round 19)."""
    runtimes = {g: calibrated_runtime(trials, g) for g in (False, True)}
    out: dict[tuple[str, bool, str], float] = {}
    for t in trials:
        attr = _stored(t)
        if attr is None or t.outcome != "oom" or not t.cells or "cell_forms" not in attr:
            continue
        graph = bool(attr["cuda_graph"])
        if refused_by_check(attr, runtimes[graph], capacity):
            continue
        room = capacity - attr["weights"] - attr["pool"] - runtimes[graph]
        for cell, failed in cell_evidence(t, attr):
            forward = attr["cell_forwards"].get(cell, 0)
            if failed and forward > 0:
                key = (cell, graph, attr["cell_forms"].get(cell, ""))
                out[key] = max(out.get(key, 0.0), room / forward)
    return out


def measured(trials: Sequence[TrialRecord]) -> dict[tuple[str, bool, str], float]:
    """(cell, CUDA graphs, form of the forward) -> the smallest forward scale the memory marks
    of the runs measured (`_measured_forwards` over the estimate), from every cell that held.
    The pre-screen skips a config whose forward of that form, at that scale, cannot fit: the
    OOM rules need an OOM of the cell first, while on the scenarios where a study sees one or
    two OOMs in all, those were each the first of their cell, estimated 0-10% over the card,
    and healthy runs had often measured their form before them (results round 20).  The
    smallest, not the median: within one form the scale still differs between configs (0.97
    to 1.07 for one 4k prefill beside 3 decodes on Llama-3.1-8B / RTX 4090).  A form measured
    with the config's own CUDA-graph setting is needed; where the other setting measured it
    smaller, that smaller scale is the one (the graph pool is in the idle memory the marks are
    measured from, and `Calibration.nearest` reads both): on Qwen2.5-7B / A100 40 GB the graph
    flip of an incumbent, put at its edge by the incumbent's 1.044, was skipped on a far graph
    config's 1.050 (40 MB over the card), and ran healthy.  The other setting's scale alone is
    not enough: applied to forms only it had measured, it skipped 2 feasible configs of 70B."""
    lazy = pool_on_first_use(trials)
    own: dict[tuple[str, bool, str], float] = {}
    for t in trials:
        attr = _stored(t)
        if attr is None or t.outcome not in (*HEALTHY, "oom") or "cell_forms" not in attr:
            continue
        for cell, bytes_ in _measured_forwards(t, attr, lazy).items():
            forward = attr["cell_forwards"].get(cell, 0)
            if forward > 0:
                key = (cell, bool(attr["cuda_graph"]), attr["cell_forms"].get(cell, ""))
                own[key] = min(own.get(key, math.inf), bytes_ / forward)
    return {(cell, graph, form): min(scale, own.get((cell, not graph, form), math.inf))
            for (cell, graph, form), scale in own.items()}


def vouched(trials: Sequence[TrialRecord], est: Estimate, graph: bool, knobs: Mapping[str, Any],
            cal: Calibration, knobs_of: Callable[[Mapping[str, Any]], dict[str, Any]],
            capacity: int) -> frozenset[str]:
    """The cells of a config (`knobs`: its params but the pool) whose forward its nearest
    measurement vouches for: at the scale the proposals' model sizes the config by
    (`Calibration.k`: the nearest measured config's, `Calibration.nearest`, corrected by the
    OOMs and healthy runs) the forward fits, and the nearest measured config is fewer knobs
    away than every run that puts the forward of the cell's form higher than that scale (a
    memory mark, or the room an OOM in it, or with it as its largest cell, left).  The
    pre-screen's rules that carry a scale or a need from other configs
    (`tuner.trial.prescreen.decide`) do not judge such a cell.

    Why: within a form the scale differs between configs, and a config errs as its own knobs
    and their neighbours do more than as a far config of the same form does
    (`Calibration.nearest`).  The tuner proposes moves of measured configs at the edge their
    own scales put; the pre-screen then skipped 15 such configs over the 560 tuner studies of
    the search suite (round 22), each 0.1-0.8% over the card at a scale carried from another
    config (one 4.4% over by the OOM-margin rule), and each ran healthy when launched.  In all
    of them the condemned cell had been measured on the config's own knobs (7 of 11 replayed)
    or one knob away.

    Why that scale, not the nearest's alone: the proposals size a config by it, and an OOM
    that proved a scale under it said nothing the model had not taken in.  Judged by the
    nearest's scale, two pushes to the edge the model drew were skipped 0.0-0.3% over the card
    by the scale a farther OOM proved (Qwen2.5-7B / RTX 3090 and Mistral-7B / RTX 4090 open
    loop, round 45); both ran healthy when launched."""
    runtimes = {g: calibrated_runtime(trials, g) for g in (False, True)}
    lazy = pool_on_first_use(trials)
    forms = dict(est.cell_forms)
    near = {cell: n for cell, _ in est.cell_forwards
            if (n := cal.nearest(cell, graph, knobs)) is not None}
    edge = {cell: cal.k(cell, graph, knobs, forms.get(cell)) for cell in near}
    far: dict[str, int] = {}
    for t in trials:
        attr = _stored(t)
        if attr is None or t.outcome not in (*HEALTHY, "oom") or "cell_forms" not in attr:
            continue
        sized, theirs = attr["cell_forwards"], attr["cell_forms"]
        scales = {c: b / sized[c] for c, b in _measured_forwards(t, attr, lazy).items()
                  if sized.get(c, 0) > 0}
        if t.outcome == "oom":      # the room it left: its forward's scale was above that
            left = capacity - attr["weights"] - attr["pool"] - runtimes[bool(attr["cuda_graph"])]
            failed = {c for c, f in cell_evidence(t, attr) if f} | {attr["peak_cell"]}
            scales |= {c: left / sized[c] for c in failed if sized.get(c, 0) > 0}
        apart = sum(knobs.get(n) != v for n, v in knobs_of(t.params).items())
        for cell, scale in scales.items():
            if cell in near and theirs.get(cell) == forms.get(cell) and scale > edge[cell]:
                far[cell] = min(far.get(cell, apart), apart)
    room = capacity - est.static - runtimes[graph]
    forwards = dict(est.cell_forwards)
    return frozenset(cell for cell, (apart, _) in near.items()
                     if apart < far.get(cell, apart + 1) and edge[cell] * forwards[cell] <= room)


def _measured_forwards(t: TrialRecord, attr: Mapping[str, Any], lazy: bool) -> dict[str, int]:
    """Cell key -> the transient bytes the cell measured (high-water mark over the loaded
    server), for each held cell that raised the mark: the mark only grows, so a cell that left
    it where it was measured nothing of its own.  A server that allocates its pool on first use
    (`lazy`, `tuner.trial.prescreen.pool_on_first_use`) raises the mark by the pool in its first
    cell, so the pool is counted in the base, not in the cell's forward.  Empty without an idle
    reading or marks."""
    if t.idle_bytes is None:
        return {}
    base = int(t.idle_bytes) + (int(attr["pool"]) if lazy else 0)
    high, out = base, {}
    for row in t.cells:
        mark, cell = row.get("peak_bytes"), row.get("cell")
        if row.get("error_class") or mark is None or not isinstance(cell, Mapping):
            break       # an OOM's mark holds the failed allocation, or no mark at all
        if int(mark) > high:
            out[str(cell.get("key"))] = int(mark) - base
            high = int(mark)
    return out
