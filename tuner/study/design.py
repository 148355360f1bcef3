"""The start-up design: while the sampler has no model yet, every number is drawn from a Latin
hypercube on its own scale and the KV share from the upper half of the headroom; the first
point has the request caps at their tops.

Why a Latin hypercube: the first trials must show the model where each knob's good end is.
Independent uniform draws cluster: on a log range such as a batch cap in [1, 128] a quarter of
them land at 3 or less, and with four cap-like knobs most start-up configs have some degenerate
cap that meets no SLO or runs at a few percent of the best (benchmarks/search_efficiency.py,
Qwen2.5-7B / L40S).  A Latin hypercube over the start-up length puts exactly one draw per knob
in each of its strata.  Fixed levels were measured against it (median of 10 seeds at 20
trials, 8B / RTX 4090 and Qwen): three levels per number (both ends, the middle) 0.97 and
0.71, five levels 0.91 and 0.65, the hypercube 0.88 and 0.80.  Levels put a fifth to a third
of every knob at its lower end; the hypercube is the design that did not fail a scenario.

Why the first point opens the request caps: a cap on the requests of one step (the batch size, the
prefill and decode caps, the long-context batch, and the long-context guard's threshold, which
holds fewer requests apart the larger it is) caps least at the top of its range, which is what a
server does with the cap unset.  The best configs of every scenario of
benchmarks/search_efficiency.py have their caps in the upper half of their log ranges, and those of
Qwen2.5-7B / L40S and Mistral-7B / A100 at the top (batch and decode caps at 128, prefill cap at
35-64, Mistral's guard at 8192, above every prompt); four independent hypercube strata rarely put
all caps there together: seeds ended 20 trials at 0.65-0.80 of the best with one cap at a tenth of
its useful value.  So the first start-up point has every cap at its top (a categorical one at its
largest choice) and the rest of its knobs from the hypercube (where a cap must be low, TPE and the
local moves find it as before), once per study: a resumed study or a further worker builds a
design of its own and skips the corner when a config of the study already has it.  The token
budgets stay in the hypercube: a budget's forward takes memory from the KV pool
(`tuner.study.pool_trades`), and opened too (b3c32b5) the point ran out of memory in 9 of 20
Qwen seeds and 12 of 20 70B seeds, and lost 8B and Qwen at 40 trials.  Measured
on 20 seeds (benchmarks/search_ab.py), mean best/reference at 10 / 20 / 30 / 40 trials, before
(deaeb29), with the batch caps opened (7cc2639), and with the guard's threshold too (ffe5e75): 8B /
RTX 4090 .786 / .896 / .927 / .954, .824 / .953 / .981 / .986, .854 / .954 / .981 / .984; Qwen .634
/ .772 / .936 / .973, .820 / .938 / .967 / .986, .928 / .982 / .985 / .987; Mistral-7B / A100 .472
/ .812 / .950 / .981, .616 / .896 / .947 / .979, .884 / .965 / .983 / .990; Llama-3.2-1B / RTX 3090
.840 / .935 / .973 / .988, then .890 / .959 / .990 / .992 (its prompts, 8k-24k, are long at either
threshold); Llama-3.1-70B / H200 within .005 throughout (there memory binds: the best configs run a
~3k-token prefill budget beside the smallest pool).

Why the upper half of the share: a pool under half of what fits is rarely the best one.  The
throughput rises with the pool while the batch is KV-bound and is flat after, and a share above
the real edge is not wasted either: its OOM calibrates the edge (`tuner.trial.kv_share`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from tuner.study.record import KV_SHARE, TrialRecord

SHARE_FLOOR = 0.5               # start-up KV shares are drawn from [SHARE_FLOOR, 1]


def level(dist: IntDistribution | FloatDistribution, position: float) -> Any:
    """The value at `position` in [0, 1] of the range, on its log or linear scale, on its step."""
    low, high = float(dist.low), float(dist.high)
    if dist.log:
        value = math.exp(math.log(low) + position * (math.log(high) - math.log(low)))
    else:
        value = low + position * (high - low)
    step = dist.step
    if step is not None:
        value = low + round((value - low) / step) * step
    value = min(high, max(low, value))
    return int(round(value)) if isinstance(dist, IntDistribution) else value


class StartupDesign:
    """Draws of a Latin hypercube of `size` points: each knob's strata are used once, in an
    order of their own, before any is used again (rejected candidates use them up too).  The
    first point has the `limits` (knobs that cap the requests of a step) at their tops."""

    def __init__(self, size: int, rng: random.Random, limits: Collection[str] = ()) -> None:
        self._size = max(2, size)
        self._rng = rng
        self._strata: dict[str, list[int]] = {}
        self._limits = set(limits)

    def point(self, space: Mapping[str, BaseDistribution],
              seen: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """One start-up candidate: the open-limits corner first, unless a config of the study
        (`seen`: a resumed study's, another worker's) already has it; then hypercube points."""
        out = {name: self.draw(name, dist) for name, dist in space.items()}
        opened = {n: top for n, d in space.items()
                  if n in self._limits and (top := _top(d)) is not None}
        self._limits = set()
        if opened and any(all(p.get(n) == v for n, v in opened.items()) for p in seen):
            return out
        return {**out, **opened}

    def _position(self, name: str) -> float:
        left = self._strata.get(name)
        if not left:
            left = self._strata[name] = self._rng.sample(range(self._size), self._size)
        return (left.pop() + self._rng.random()) / self._size

    def draw(self, name: str, dist: BaseDistribution) -> Any:
        """One start-up value of knob `name` (see module doc)."""
        if isinstance(dist, CategoricalDistribution):
            choices = dist.choices
            return choices[min(len(choices) - 1, int(self._position(name) * len(choices)))]
        assert isinstance(dist, (IntDistribution, FloatDistribution))
        if name == KV_SHARE:
            low = max(SHARE_FLOOR, dist.low)
            return low + self._position(name) * (dist.high - low)
        return level(dist, self._position(name))


def corner_retry(trials: Sequence[TrialRecord], space: Mapping[str, BaseDistribution],
                 limits: Collection[str],
                 deferring: Callable[[dict[str, Any]], Collection[str]] = lambda p: (),
                 ) -> dict[str, Any] | None:
    """The open-limits corner again, where it is the only config of the study with every limit
    at its top and it failed for a reason other than its limits; None otherwise.  Asked while
    no run has met the SLOs, in a study with a waiting-time SLO (`tuner.study.proposals`).

    * It ran out of memory: at its edge (the KV share at 1: the edge its OOM corrected).
    * It did not start: with each choice of its other categorical knobs that no run has
      started with replaced by the choice most started runs had, at the edge too (under a
      waiting-time SLO the corner is the config that holds the most requests at once, and a
      pool under the edge holds fewer).  A choice the server refuses (the seed's block size
      128 with CUDA graphs on an RTX 4090) says nothing of the limits; on the Qwen2.5-7B /
      RTX 4090 RAG scenario of benchmarks/search_efficiency.py (p99 TTFT) one 10-trial seed's
      corner drew block size 128 with graphs, no corner ran again, and the seed ended with
      nothing feasible; seven of the other nine found their best with the corner's caps at
      the edge.
    * It missed the SLOs with decode-first on where the guard calls some prompts long
      (`deferring(params)`: the policy knobs that hold requests back): with it off, at the
      edge.  With every cap open, decode-first is what keeps those requests waiting (it
      defers a long prefill while anything decodes).  On a Llama-3.2-3B / H200 RAG
      scenario (p99 TTFT, round 37) two 10-trial seeds drew the corner with decode-first on;
      it missed, every later run kept decode-first, and the descent on the least miss
      (`tuner.study.miss_descent`) did not move it: the only run without it was the server's
      default, with small caps, the worst miss."""
    opened = {n: top for n, d in space.items() if n in limits and (top := _top(d)) is not None}
    if not opened or KV_SHARE not in space:
        return None
    runs = [t for t in trials if not t.unmeasured
            and all(t.params.get(n) == v for n, v in opened.items())]
    if len(runs) != 1 or not space.keys() <= runs[0].params.keys():
        return None
    corner = {k: runs[0].params[k] for k in space}
    if runs[0].outcome == "oom":
        return {**corner, KV_SHARE: 1.0}
    if runs[0].outcome == "startup":
        retry = _started_choices(corner, trials, space, opened)
        return None if retry is None else {**retry, KV_SHARE: 1.0}
    if runs[0].outcome == "slo":
        off = {n: False for n in deferring(corner) if corner.get(n) is True
               and isinstance(d := space.get(n), CategoricalDistribution) and False in d.choices}
        return {**corner, **off, KV_SHARE: 1.0} if off else None
    return None


def _started_choices(corner: dict[str, Any], trials: Sequence[TrialRecord],
                     space: Mapping[str, BaseDistribution],
                     opened: Mapping[str, Any]) -> dict[str, Any] | None:
    """`corner` with its never-started choices (limits aside) set to the choice most started
    runs had; None where it has no such choice or no run started with another."""
    started = [t.params for t in trials
               if not t.unmeasured and t.outcome != "startup"]
    out = dict(corner)
    for name, dist in space.items():
        if name in opened or not isinstance(dist, CategoricalDistribution):
            continue
        if any(p.get(name) == corner[name] for p in started):
            continue
        seen = [p[name] for p in started if name in p]
        if not seen:
            return None
        out[name] = max(dist.choices, key=lambda c: (seen.count(c), -dist.choices.index(c)))
    return out if out != corner else None


def _top(dist: BaseDistribution) -> Any:
    """A limit's least limiting value: its range's top, or its largest choice; None for
    choices that have no order."""
    if isinstance(dist, CategoricalDistribution):
        numbers = [c for c in dist.choices
                   if isinstance(c, (int, float)) and not isinstance(c, bool)]
        return max(numbers) if numbers and len(numbers) == len(dist.choices) else None
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    return dist.high
