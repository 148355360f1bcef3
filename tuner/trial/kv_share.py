"""KV capacity sampled as a share of the memory headroom, with the edge found by bisection.

Why: the best configs of a KV-bound workload sit in a narrow band just under the memory limit,
and where that limit lies depends on every other knob (a larger prefill budget or batch leaves
less room for the pool).  A sampler that draws the pool as an absolute size spends most of its
trials far from the band, or beyond it.  So the sampler draws `kv_share` in [0, 1] instead, and
the pool is that share of the way from the knob's lower bound to the *edge*: the largest pool
whose memory need, as the study currently understands it, fits the card.  The KV knob is then
suggested as a single value: every record, export and report still sees blocks or tokens.
The edge moves as the study learns (the seed's walk, 96 -> 80 -> 64 blocks, done by proposals):

* runtime overhead: `tuner.prescreen.calibrated_runtime` (measured idle memory), raised to what
  a start-up OOM proves (weights + pool + runtime > card);
* forward scale, per mechanism (`tuner.trial.kv_calibration`: the cell, CUDA graphs or not): the
  estimate's transient bytes are multiplied by `k`.  An OOM at a config whose static need is
  S and forward F proves k > (card - S) / F; a healthy run proves k <= (card - S) / F.  The
  edge uses the lower bound plus the under-estimate it proves (at least `MIN_STEP`: twice the
  under-estimate), never past the middle of the interval.  With no OOM seen, k = 1 or what
  healthy runs proved below it, and an OOM never lowers k below that.  Where a run read the
  card's memory high-water mark (`tuner.server.memwatch`), the scale it measured replaces the
  1: a config's own, else the nearest measured config's (`Calibration.nearest`).  Why not the middle
  itself: an OOM near the edge bounds k tightly, a healthy run far below the edge loosely.  On
  the 8B / RTX 4090 scenario one graph OOM proved k > 1.004 and a healthy run at a small pool
  k <= 1.55; the middle, 1.28, put the graph edge of the incumbent's knobs at 10.2k tokens
  where 14.3k ran, at the best throughput of the scenario, and the seed ended 40 trials at
  0.86 of it.  Measured on 20 seeds (benchmarks/search_ab.py), mean best at 20 / 30 / 40
  trials: 8B .954 / .981 / .984 -> .966 / .994 / .997 (10th percentile at 40
  .972 -> .995); Llama-3.2-1B at 20 .959 -> .966; Qwen, Mistral and 70B within .003;
* the real edge of one config's other knobs: once they ran healthy at one pool and out of
  memory at a larger one, the edge is the midpoint of that bracket until it is narrower than
  `EDGE_TOL` (a bisection against the stress cell, which runs first), then the pool that held.
  The model alone was 40% over the simulator's edge for the 8B / RTX 4090 scenario's best
  knobs, and its error differs between configs: calibration alone never lands a pool in the
  band just under the edge.  While these knobs have only run out of memory, each further pool
  is under the smallest that failed by the way down from the largest that failed (doubling
  steps), and by at least `EDGE_TOL`: one step below the last OOM walked a Qwen2.5-7B / L40S
  seed down 246783, 246687, 246623, 246591 tokens, and an 8B seed through six OOMs from 13568
  to 11263 tokens, where 10000 ran.

The Llama-3.1-70B / H200 figure quoted in `KvEdge.slack_of` predates the fix of the
in-process simulator (2026-12-01): that scenario's feasible configs were then ones whose pool
refused its longest prompts (benchmarks/results/search_efficiency.md, round 7).  The
mechanism stays; the figure does not stand.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from tuner.bench.records import Cell
from tuner.search.bounds import TEMPLATE_TOKENS, smallest_pool
from tuner.search.model import ModelInfo
from tuner.search.space import Param, SearchSpace
from tuner.study.record import KV_SHARE, TrialRecord, config_key, kv_value
from tuner.trial.kv_calibration import Calibration, calibrate, mechanism, vouched
from tuner.trial.memory_estimate import (
    Estimate,
    estimate,
    knobs_from_params,
)
from tuner.trial.prescreen import HEALTHY, calibrated_runtime

KV_ROLES = ("kv_tokens", "kv_blocks")
EDGE_TOL = 0.02             # a bracket of the real edge narrower than this share is closed


def peak_demand(cells: Sequence[Cell], block_size: int,
                max_batch: int | None = None) -> int | None:
    """Tokens of KV the workload can hold at once at this block size: the heaviest cell's
    requests all in flight (no more than `max_batch`, the requests a config admits at once),
    each with its chat template and in whole blocks.  A pool larger than that serves the
    workload no better: its random prompts share no prefix a larger pool could keep cached.
    None where some cell's prompts come from a source (a dataset, a trace, conversations,
    shared prefixes), whose prefixes a larger pool can keep cached."""
    if not cells or any(c.source is not None for c in cells):
        return None
    block = max(block_size, 1)
    return max(min(c.concurrency, c.num_prompts or c.concurrency, max_batch or c.concurrency)
               * -(-(c.input_len + c.output_len + TEMPLATE_TOKENS) // block) * block
               for c in cells)


def kv_param(space: SearchSpace) -> Param | None:
    """The space's auto-bounded KV knob, the one the share replaces; None without one."""
    return next((p for p in space.parameters if p.role in KV_ROLES and p.high_auto), None)


@dataclass(frozen=True)
class KvEdge:
    """Renders a share of the headroom as a KV knob value for one study's model and card."""

    space: SearchSpace
    model: ModelInfo
    capacity: int
    cells: tuple[Cell, ...]
    pinned: dict[int, int] = field(default_factory=dict, compare=False)  # trial -> its pool

    @property
    def param(self) -> Param:
        p = kv_param(self.space)
        assert p is not None, "KvEdge needs a space with an auto-bounded KV knob"
        return p

    def grid(self, params: Mapping[str, Any]) -> tuple[int, int, int]:
        """(low, high, step) of the knob for a config with these other knobs: a pool counted
        in blocks starts at the blocks that hold the workload's largest request at the
        config's block size (the range's lower bound is one count for every block size: on
        the H200 transformers study 64 blocks of 32 tokens could not hold a 2083-token
        request, and two trials ran unhealthy at the bottom of the range)."""
        p = self.param
        low, high = int(p.bounds[0]), int(p.bounds[1])
        step = int(p.step or 1)
        tokens = smallest_pool(self.cells)
        if p.role == "kv_blocks" and tokens:
            need = -(-tokens // knobs_from_params(self.space, dict(params)).block_size)
            if need > low:  # up to it on the knob's step, never past the range
                low = min(high, low + -(-(need - low) // step) * step)
        return low, high, step

    def floors(self) -> dict[int, int]:
        """Per block size, the knob's lowest value (`_grid`) where it differs from the range's
        lower bound: the banner shows them, the range alone hides them."""
        block = next((p for p in self.space.parameters
                      if p.role == "block_size" and p.type == "categorical"), None)
        if block is None:
            return {}
        low = int(self.param.bounds[0])
        floors = {int(size): self.grid({block.name: size})[0] for size in block.choices}
        return {size: floor for size, floor in floors.items() if floor != low}

    def useful(self, params: Mapping[str, Any]) -> int | None:
        """The smallest KV value (on the knob's step) whose pool holds the workload's peak
        demand (`peak_demand`) for a config with these other knobs: a larger pool serves it no
        better.  None where the demand is not bounded.  On the Llama-3.2-3B / A100 80 GB
        scenario of benchmarks/search_efficiency.py the pool held ~500k tokens where the
        heaviest cell needs 68k, and 5 of one seed's 40 trials went to pushes of incumbents to
        their edge that measured exactly what the incumbents had.  The demand is the
        config's own: a running batch capped at 26 requests holds 26 requests' blocks."""
        knobs = knobs_from_params(self.space, dict(params))
        block = knobs.block_size
        tokens = peak_demand(self.cells, block, knobs.max_batch)
        if tokens is None:
            return None
        low, high, step = self.grid(params)
        value = tokens if self.param.role == "kv_tokens" else -(-tokens // block)
        return min(high, low + max(0, -(-(value - low) // step)) * step)

    def within_demand(self, params: Mapping[str, Any], value: int) -> int:
        """`value`, lowered to `useful` where that is lower: what the pushes and pool trades
        aim at."""
        useful = self.useful(params)
        return value if useful is None else min(value, useful)

    def carried(self, value: int, source: Mapping[str, Any], target: Mapping[str, Any]) -> int:
        """The KV value that gives config `target` the pool `value` gives `source`: for a pool
        in tokens, the tokens `source`'s whole blocks hold (on Llama-3.1-70B / H200, 4991
        tokens of 128-token blocks held 4864, the flip to 16-token blocks carried 4991 and ran
        out of memory twice on its way down to 4895); for one in blocks, the same tokens at
        `target`'s block size (a flip of the block size from 256 to 32 at the same 65 blocks
        ran an eighth of the incumbent's pool on the H200 transformers study, under one
        request)."""
        if self.param.role != "kv_blocks":
            held = knobs_from_params(self.space, {**source, self.param.name: value}).kv_tokens
            return value if held is None else max(self.grid(target)[0], held)
        before = knobs_from_params(self.space, dict(source)).block_size
        after = knobs_from_params(self.space, dict(target)).block_size
        return max(self.grid(target)[0], round(value * before / after))

    def need(self, params: dict[str, Any], value: int, cal: Calibration, runtime: int) -> float:
        """The config's need with the calibrated runtime and forward scale."""
        return self.needs(params, value, cal, runtime)[0]

    def needs(self, params: dict[str, Any], value: int, cal: Calibration,
              runtime: int) -> tuple[float, str, int, float]:
        """`need`, the mechanism of its largest calibrated forward (`mechanism`), what the
        server's footprint check asks (0: no check), and that forward."""
        knobs = knobs_from_params(self.space, {**params, self.param.name: value})
        est = estimate(self.model, knobs, list(self.cells),
                       runtime=max(runtime, cal.runtime_floor[knobs.cuda_graph] + 1))
        forwards = est.cell_forwards or ((est.peak_cell, est.forward),)
        mine = self.knobs_of(params)
        form = dict(est.cell_forms).get
        scaled, cell = max((cal.k(c, knobs.cuda_graph, mine, form(c)) * f, c) for c, f in forwards)
        # the footprint check is exact: no scale
        return max(est.static + est.runtime + scaled, est.check_need), \
            mechanism(cell, knobs.cuda_graph), est.check_need, scaled


    def forward(self, params: dict[str, Any], value: int, trials: Sequence[TrialRecord]) -> float:
        """The config's largest calibrated forward at KV value `value` (`needs`)."""
        graph = knobs_from_params(self.space, params).cuda_graph
        return self.needs(params, value, calibrate(trials, self.capacity, self.knobs_of),
                          calibrated_runtime(trials, graph))[3]

    def calibrated_need(self, params: dict[str, Any], trials: Sequence[TrialRecord]) -> float:
        """The need of `params` (its pool included) with what the study's runs taught: the
        pre-screen's figure where the memory marks measured the forward (`tuner.trial.prescreen`,
        `decide`'s `calibrated`)."""
        return self._calibrated_need(params, trials, calibrate(trials, self.capacity,
                                                                self.knobs_of))

    def screen_evidence(self, params: dict[str, Any], trials: Sequence[TrialRecord],
                        est: Estimate) -> tuple[float, frozenset[str]]:
        """What the pre-screen takes from the proposals' model, from one calibration: the
        calibrated need of `params`, and where that fits the card the cells whose nearest
        measurement clears them of evidence from farther configs
        (`tuner.trial.kv_calibration.vouched`)."""
        cal = calibrate(trials, self.capacity, self.knobs_of)
        need = self._calibrated_need(params, trials, cal)
        if need > self.capacity:
            return need, frozenset()
        graph = knobs_from_params(self.space, params).cuda_graph
        return need, vouched(trials, est, graph, self.knobs_of(params), cal, self.knobs_of,
                             self.capacity)

    def _calibrated_need(self, params: dict[str, Any], trials: Sequence[TrialRecord],
                         cal: Calibration) -> float:
        graph = knobs_from_params(self.space, params).cuda_graph
        return self.need(params, int(params[self.param.name]), cal,
                         calibrated_runtime(trials, graph))

    def knobs_of(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A config's params but its pool (and the share it was drawn from)."""
        return {k: v for k, v in params.items() if k not in (self.param.name, KV_SHARE)}

    def modelled(self, params: dict[str, Any], trials: Sequence[TrialRecord]) -> int:
        """The largest KV value (on the knob's step) whose calibrated need fits the card."""
        low, high, step = self.grid(params)
        cal = calibrate(trials, self.capacity, self.knobs_of)
        runtime = calibrated_runtime(trials, knobs_from_params(self.space, params).cuda_graph)

        def fits(n: int) -> bool:
            return self.need(params, low + n * step, cal, runtime) <= self.capacity
        return low + (largest(fits, (high - low) // step) if fits(0) else 0) * step

    def edge(self, params: dict[str, Any], trials: Sequence[TrialRecord]) -> int:
        """`modelled`, corrected by the outcomes of these very knobs (`bracket`)."""
        low, _, step = self.grid(params)
        modelled = self.modelled(params, trials)
        healthy, ooms = self._own_pools(params, trials)
        held, failed = max(healthy, default=None), min(ooms, default=None)
        if held is None and failed is not None:
            drop = max(step, max(ooms) - failed, int(EDGE_TOL * failed))
            return min(modelled, max(low, low + (failed - drop - low) // step * step))
        if held is None:
            return modelled
        if failed is None:
            return max(modelled, held)
        if failed - held > max(step, EDGE_TOL * held):
            return held + (failed - held) // 2 // step * step   # bisect the real edge
        return held

    def bracket(self, params: dict[str, Any],
                trials: Sequence[TrialRecord]) -> tuple[int | None, int | None]:
        """(largest pool seen to fit, smallest seen to run out of memory) among the trials that
        ran exactly these other knobs: the real edge lies between, whatever the model says."""
        healthy, ooms = self._own_pools(params, trials)
        return max(healthy, default=None), min(ooms, default=None)

    def _own_pools(self, params: dict[str, Any],
                   trials: Sequence[TrialRecord]) -> tuple[list[int], list[int]]:
        """(pools that ran healthy, pools that ran out of memory) of the measured trials with
        exactly these other knobs."""
        name = self.param.name
        key = others_key(params, name)
        healthy: list[int] = []
        ooms: list[int] = []
        for t in trials:
            value = t.params.get(name)
            if t.unmeasured or value is None or others_key(t.params, name) != key:
                continue
            if t.outcome in HEALTHY:
                healthy.append(int(value))
            elif t.outcome == "oom":
                ooms.append(int(value))
        return healthy, ooms

    def slack_of(self, trials: Sequence[TrialRecord]) -> Callable[[dict[str, Any]], float]:
        """Per config: the card's bytes the calibrated need leaves at the smallest pool (> 0:
        the config can fit at all); see `room_at`."""
        room = self.room_at(trials)
        return lambda params: room(params, self.grid(params)[0])

    def room_at(self, trials: Sequence[TrialRecord]) -> Callable[[dict[str, Any], int], float]:
        """Per config and KV value: the card's bytes the calibrated need leaves (the
        calibration is computed once for many configs).  As in the pre-screen, a need no
        larger than that of a config seen healthy fits, whatever the calibration says: when
        OOMs and healthy runs disagree on the forward scale (the estimate's error differs
        between configs), the scale sides with the OOMs, and on Llama-3.1-70B / H200 the
        filter then turned away 291 of 496 candidates that run.

        A healthy config clears configs whose largest calibrated forward is of another
        mechanism (`tuner.trial.kv_calibration.mechanism`) only below every OOM's need: the
        estimate errs differently per mechanism, and an OOM under the healthy need shows that
        here it erred the other way.  On Llama-3.1-70B / H200 (with the prompts as the server
        counted them) one start-up config ran healthy at an estimated 140.45 GiB of a 140.40 GiB
        card, and it cleared eleven flips estimated at 140.42 GiB, each of its own mechanism,
        one after another: each ran out of memory (benchmarks/results/search_efficiency.md,
        round 24).  Within a mechanism the healthy need clears as before.

        No run clears a config the server's footprint check refuses: the check is a formula of
        the config, not an estimate that errs.  On the r36 H200 transformers study a run at 24.74
        GiB on the 24 GiB cap cleared two configs whose check wanted that much (both skipped)."""
        cal = calibrate(trials, self.capacity, self.knobs_of)
        runtimes = {g: calibrated_runtime(trials, g) for g in (False, True)}

        def need(params: dict[str, Any], value: int) -> tuple[float, str, int]:
            graph = knobs_from_params(self.space, params).cuda_graph
            return self.needs(params, value, cal, runtimes[graph])[:3]
        name = self.param.name
        held: dict[str, float] = {}
        oom = math.inf
        for t in trials:
            if name not in t.params:
                continue
            if t.outcome in HEALTHY and not t.unmeasured:
                n, mech, _ = need(dict(t.params), int(t.params[name]))
                held[mech] = max(held.get(mech, 0.0), n)
            elif t.outcome == "oom":
                oom = min(oom, need(dict(t.params), int(t.params[name]))[0])
        across = min(max(held.values(), default=0.0), oom)

        def room(params: dict[str, Any], value: int) -> float:
            n, mech, check = need(params, value)
            if check > self.capacity:
                return self.capacity - check
            return max(self.capacity - n, held.get(mech, 0.0) - n, across - n)
        return room

    def value(self, params: dict[str, Any], share: float, trials: Sequence[TrialRecord]) -> int:
        """The KV knob's value at `share` of the way from its lower bound to the edge."""
        low, _, step = self.grid(params)
        edge = self.edge(params, trials)
        return low + int(round(share * (edge - low) / step)) * step

    def share_of(self, params: dict[str, Any], value: int,
                 trials: Sequence[TrialRecord]) -> float:
        """The share that renders to `value` (clipped to [0, 1]): for enqueued configs."""
        low = self.grid(params)[0]
        edge = self.edge(params, trials)
        return 1.0 if edge <= low else min(1.0, max(0.0, (value - low) / (edge - low)))

    def suggest(self, trial: optuna.Trial, params: dict[str, Any],
                trials: Sequence[TrialRecord]) -> dict[str, Any]:
        """Suggest the share, then the KV knob as the single value it renders to."""
        share = trial.suggest_float(KV_SHARE, 0.0, 1.0)
        name = self.param.name
        fixed = kv_value(trial)
        if fixed is None:  # a re-queued trial carries its pool as an enqueued (fixed) param
            fixed = getattr(trial, "_fixed_params", {}).get(name)
        if fixed is None:  # a probe's pool, set by the proposals (`tuner.study.flips`)
            fixed = self.pinned.pop(trial.number, None)
        value = int(fixed) if fixed is not None else self.value(params, share, trials)
        params[name] = trial.suggest_int(name, value, value, log=_stored_log(trial.study, name))
        return params


def others_key(params: Mapping[str, Any], kv_name: str | None) -> str:
    """A config's identity without its KV pool (and the share the pool was drawn from)."""
    return config_key({k: v for k, v in params.items() if k != kv_name})


def _stored_log(study: optuna.Study, name: str) -> bool:
    """Whether the study already drew `name` from a log range: a study begun before the KV share
    (or resumed with --kv-absolute) did, and Optuna refuses one name with two `log` settings, so
    the single value keeps the study's."""
    for t in study.get_trials(deepcopy=False):
        dist = t.distributions.get(name)
        if dist is not None:
            return bool(getattr(dist, "log", False))
    return False


def largest(fits: Callable[[int], bool], top: int) -> int:
    """The largest n in [0, top] with fits(n), by bisection; fits(0) must hold (need grows with
    the pool, so fits is monotone)."""
    lo, hi = 0, top
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo
