"""What counts as a config not run yet."""

from types import SimpleNamespace
from typing import Any

import optuna
from optuna.distributions import FloatDistribution, IntDistribution

from tuner.bench.records import Cell
from tuner.search.space import Param
from tuner.study.local_moves import fresh_in
from tuner.study.record import KV_SHARE, TrialRecord

DISTS = {"cap": IntDistribution(1, 128), KV_SHARE: FloatDistribution(0.0, 1.0),
         "kv": IntDistribution(0, 10 ** 6)}


class _Edge:
    """A share renders to that share of a 40k-token edge; `cap` caps the requests of a step,
    beside a cell that keeps 60 in flight."""

    param = SimpleNamespace(name="kv")
    space = SimpleNamespace(parameters=[Param("cap", "int", role="max_batch"),
                                        Param("kv", "int", role="kv_tokens")])
    cells = (Cell(60, 128, 64, 120),)

    def value(self, params: dict[str, Any], share: float, trials: Any) -> int:
        return int(40_000 * share)


def _run(cap: int, kv: int) -> TrialRecord:
    t = optuna.trial.create_trial(params={"cap": cap, KV_SHARE: 0.9, "kv": kv},
                                  distributions=DISTS, values=[1.0],
                                  user_attrs={"outcome": "ok"})
    return TrialRecord.of(t)


def test_a_pool_within_the_edge_tolerance_of_one_its_knobs_ran_at_is_that_run_again():
    """cap 45 ran at 38.0k tokens: 38.4k (1%) is the same config, 40k (5%) is not; other knobs
    at 38.4k are new.  A pinned pool counts the same way."""
    fresh = fresh_in([_run(45, 38_000)], _Edge())
    fits = lambda cand: 0.0  # noqa: E731
    assert not fresh({"cap": 45, KV_SHARE: 0.96}, fits)              # 38.4k
    assert fresh({"cap": 45, KV_SHARE: 1.0}, fits)                   # 40.0k
    assert fresh({"cap": 46, KV_SHARE: 0.96}, fits)
    assert not fresh({"cap": 45, KV_SHARE: 1.0}, fits, pool=38_500)
    assert not fresh({"cap": 46, KV_SHARE: 1.0}, lambda cand: -1.0)  # does not fit


def test_a_cap_that_binds_neither_before_nor_after_is_that_run_again():
    """60 requests in flight: cap 64 and cap 100 hold all of them, so 100 at cap 64's pool is
    cap 64's run again; 45 holds fewer and is new."""
    fresh = fresh_in([_run(64, 38_000)], _Edge())
    fits = lambda cand: 0.0  # noqa: E731
    assert not fresh({"cap": 100, KV_SHARE: 0.95}, fits)
    assert fresh({"cap": 100, KV_SHARE: 1.0}, fits)     # another pool
    assert fresh({"cap": 45, KV_SHARE: 0.95}, fits)
