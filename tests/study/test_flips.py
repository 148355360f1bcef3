"""Flips: a choice compared once as a pair of healthy runs, run at the incumbent's pool."""

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution

from tests.study.test_proposals import DISTS, SPACE, _record
from tuner.bench.records import Cell
from tuner.study.flips import at_pool, companions, controlled_flips, fell_over, repairs
from tuner.study.record import TrialRecord


def test_a_choice_is_flipped_until_two_healthy_runs_compared_it_alone():
    base = {"x": 8, "y": 0.5, "c": 128}
    ran = [_record({**base, "kv": 10}), _record({"x": 3, "y": 0.1, "c": 256, "kv": 5}, value=3.0),
           _record({"x": 2, "y": 0.2, "c": 16, "kv": 5}, value=2.0)]
    # both other choices are uncompared and one step away; the one a better trial had first
    assert controlled_flips(base, ran, SPACE, "kv", 1.0) == [{**base, "c": 256}, {**base, "c": 16}]
    assert controlled_flips(base, ran, SPACE, "kv", -1.0)[0] == {**base, "c": 16}  # minimize
    # 256 compared alone (another pool does not matter): no longer flipped, wherever the base is
    ran.append(_record({**base, "c": 256, "kv": 7}, value=0.5))
    assert controlled_flips(base, ran, SPACE, "kv", 1.0) == [{**base, "c": 16}]
    # a pair whose flip ran out of memory compared nothing: 16 stays to be compared
    ran.append(_record({**base, "c": 16, "kv": 10}, outcome="oom"))
    assert controlled_flips(base, ran, SPACE, "kv", 1.0) == [{**base, "c": 16}]


GRAPHS = {**SPACE, "g": CategoricalDistribution([False, True])}


def _rec(params, outcome="ok", value=1.0):
    """A finished trial of the space with a two-way knob `g` beside `c`."""
    dists = {**DISTS, **GRAPHS}
    return TrialRecord.of(optuna.trial.create_trial(
        params=params, distributions={k: dists[k] for k in params}, values=[value],
        user_attrs={"outcome": outcome}))


def test_every_knob_is_flipped_once_before_any_knob_again_two_way_knobs_first():
    """Breadth first over knobs; within a knob, the choice farthest along its order first."""
    space = GRAPHS
    base = {"x": 8, "y": 0.5, "c": 16, "g": False}
    ran = [_rec({**base, "kv": 10}), _rec({"x": 3, "y": 0.1, "c": 128, "g": True, "kv": 5},
                                                value=3.0)]
    # the two-way knob first; of c's choices the farthest first, although 128 did better
    assert controlled_flips(base, ran, space, "kv", 1.0) == [
        {**base, "g": True}, {**base, "c": 256}, {**base, "c": 128}]
    ran.append(_rec({**base, "c": 128, "kv": 10}, value=0.5))   # c compared (16 vs 128)
    ran.append(_rec({**base, "g": True, "kv": 10}, outcome="oom"))   # g not compared
    # g before c's other choice: c has been compared once, g never
    assert controlled_flips(base, ran, space, "kv", 1.0) == [{**base, "g": True},
                                                              {**base, "c": 256}]


def test_a_choice_that_won_its_comparison_is_flipped_again_on_a_new_incumbent():
    """Graphs won a pair on an old incumbent; the new one lacks them: that flip comes first.
    Once graphs have lost as often as they won, they are compared and not flipped again."""
    space = GRAPHS
    old = {"x": 3, "y": 0.1, "c": 16}
    base = {"x": 8, "y": 0.5, "c": 16, "g": False}
    ran = [_rec({**old, "g": False, "kv": 10}, value=1.0),
           _rec({**old, "g": True, "kv": 10}, value=1.4), _rec({**base, "kv": 10}, value=2.0)]
    assert controlled_flips(base, ran, space, "kv", 1.0)[0] == {**base, "g": True}
    # minimizing, the same pair says graphs lost: compared, so no graph flip at all
    assert {**base, "g": True} not in controlled_flips(base, ran, space, "kv", -1.0)
    # a healthy run that missed its SLO loses to a feasible one: one win, one loss
    lost = [_rec({**old, "c": 128, "g": False, "kv": 10}, value=0.8),
            _rec({**old, "c": 128, "g": True, "kv": 10}, outcome="slo", value=9.0)]
    assert {**base, "g": True} not in controlled_flips(base, ran + lost, space, "kv", 1.0)
    # so does a loss at the new incumbent itself
    ran.append(_rec({**base, "g": True, "kv": 10}, value=1.5))
    assert {**base, "g": True} not in controlled_flips(base, ran, space, "kv", 1.0)


def test_a_knob_whose_comparisons_moved_nothing_is_flat_and_not_flipped_again():
    """Two healthy runs that differ in g alone and within 1% of each other: g is flat, its
    flips stop; c, compared with a real difference, still has an uncompared choice."""
    space = GRAPHS
    base = {"x": 8, "y": 0.5, "c": 16, "g": False}
    ran = [_rec({**base, "kv": 10}, value=100.0), _rec({**base, "g": True, "kv": 10}, value=100.9),
           _rec({**base, "c": 256, "kv": 10}, value=80.0)]
    assert controlled_flips(base, ran, space, "kv", 1.0) == [{**base, "c": 128}]
    # a difference of more than 1% somewhere: not flat
    ran[1] = _rec({**base, "g": True, "kv": 10}, value=101.5)
    assert {**base, "g": True} in controlled_flips(base, ran, space, "kv", 1.0)
    # nor when one side of the pair missed its SLO
    ran[1] = _rec({**base, "g": True, "kv": 10}, outcome="slo", value=100.0)
    assert {**base, "g": True} not in controlled_flips(base, ran, space, "kv", 1.0)  # it lost
    assert base in controlled_flips({**base, "g": True}, ran, space, "kv", 1.0)  # the winner


def test_a_flip_that_fell_over_of_memory_is_paired_with_another_choice_roomiest_first():
    space = GRAPHS
    base = {"x": 8, "y": 0.5, "c": 16, "g": False}
    flip = {**base, "g": True}
    ran = [_rec({**base, "kv": 10}), _rec({**flip, "kv": 10}, outcome="slo")]
    assert not fell_over(flip, ran, "kv")
    ran.append(_rec({**flip, "kv": 7}, outcome="oom"))   # at another pool: still the flip
    assert fell_over(flip, ran, "kv") and not fell_over(base, ran, "kv")
    never = [_rec({**base, "kv": 10}), _rec({**flip, "kv": 10}, outcome="startup")]
    assert fell_over(flip, never, "kv")   # a flip that never started is paired the same way
    # the model gives larger blocks more room (it ranks every pair; the proposals try those
    # with room: see the test below)
    slack = lambda params: params["c"] - 200.0  # noqa: E731
    assert companions(flip, base, space, slack) == [{**flip, "c": 256}, {**flip, "c": 128}]


def _edge(*cells):
    """The KV edge of Llama-3.1-8B on a 24 GiB card, InfiniLM's space, for `cells`."""
    from pathlib import Path

    from tuner.search.bounds import resolve_space
    from tuner.search.model import load_model_info
    from tuner.search.space_file import load_space
    from tuner.trial.kv_share import KvEdge

    root = Path(__file__).resolve().parents[2]
    model = load_model_info(root / "models" / "llama-3.1-8b")
    cap = 24 * 2 ** 30
    space = resolve_space(load_space(root / "search_spaces" / "infinilm.yaml"), model, cap, cells)
    return KvEdge(space, model, cap, cells)


def _ran(knobs, pool):
    """A healthy run of `knobs` at KV pool `pool` (tokens)."""
    return TrialRecord.of(optuna.trial.create_trial(
        params={**knobs, "kv_cache_tokens": pool}, values=[1.0], user_attrs={"outcome": "ok"},
        distributions={k: CategoricalDistribution([v]) for k, v in knobs.items()} |
        {"kv_cache_tokens": IntDistribution(pool, pool)}))


CHAT = Cell(16, 1024, 256, 32)
KNOBS = {"block_size": 16, "max_batch_size": 16, "max_num_batched_tokens": 4096,
         "enable_graph": False}


def test_a_flip_runs_at_the_incumbents_pool_where_the_model_allows():
    """Graphs flipped on at the incumbent's share would get a smaller pool (the model's graph
    need is larger); the flip keeps the pool (the tokens its whole blocks hold), or the largest
    the model allows, and the pool is pinned for the trial that runs it."""
    edge = _edge(CHAT)
    flip = {**KNOBS, "enable_graph": True}
    for pool in (edge.edge(flip, []) // 2, edge.edge(KNOBS, [])):
        top = _ran(KNOBS, pool)
        params, pinned = at_pool({**flip, "kv_share": 0.5}, top, edge, [top])
        assert pinned == min(pool // 16 * 16, edge.edge(flip, [top]))   # whole blocks
        assert 0.0 <= params["kv_share"] <= 1.0
    assert pinned < edge.edge(KNOBS, [])   # the graphs' need: the incumbent's pool did not fit
    trial = optuna.create_study().ask()
    edge.pinned[trial.number] = pinned
    assert edge.suggest(trial, dict(flip), [])["kv_cache_tokens"] == pinned
    assert not edge.pinned                 # used once: a later trial of that number renders


def test_a_flip_that_frees_memory_runs_at_its_own_edge_where_the_incumbent_ran_at_its():
    """Graphs switched off free the graph pool's memory: from an incumbent at its edge the flip
    runs at the edge of its own knobs (each choice with the pool it can have); from one below
    its edge it keeps the incumbent's pool."""
    edge = _edge(CHAT)
    knobs = {**KNOBS, "enable_graph": True}
    flip = KNOBS
    ones = edge.edge(knobs, [])
    assert edge.edge(flip, []) > ones * 1.01           # the graphs' memory goes to KV
    pinned = {}
    for pool in (ones, ones // 2):
        top = _ran(knobs, pool)
        pinned[pool] = at_pool({**flip, "kv_share": 0.5}, top, edge, [top])[1]
    assert pinned[ones] == edge.within_demand(flip, edge.edge(flip, []))
    assert pinned[ones] > ones
    assert pinned[ones // 2] == ones // 2 // 16 * 16   # below its edge: the incumbent's pool
    # a guard that admits one long prompt at a time: the model's forward shrinks and its edge
    # rises by half, but that memory is the estimate's guess; the flip keeps the pool
    edge = _edge(CHAT, Cell(8, 6000, 64, 8))
    knobs = {**knobs, "max_num_batched_tokens": 8192, "long_context_threshold": 1024,
             "long_context_max_batch": 8}
    guard = {**knobs, "long_context_max_batch": 1}
    ones = edge.edge(knobs, [])
    assert edge.edge(guard, []) > ones * 1.2
    top = _ran(knobs, ones)
    assert at_pool({**guard, "kv_share": 0.5}, top, edge, [top])[1] == ones // 16 * 16


def test_the_local_move_after_a_flip_fell_over_of_memory_is_that_flip_with_a_companion():
    from optuna.study import StudyDirection

    from tuner.study.proposals import GuidedSampler

    base = {"x": 8, "y": 0.5, "c": 16, "g": False}
    ran = [_rec(base, value=2.0), _rec({**base, "g": True}, outcome="oom"),
           _rec({"x": 2, "y": 0.1, "c": 128, "g": False}, value=1.0),
           _rec({"x": 3, "y": 0.2, "c": 256, "g": False}, value=1.0)]
    sampler = GuidedSampler(optuna.samplers.RandomSampler(seed=0), None, startup=0, seed=0)
    fits = lambda params: 0.0  # noqa: E731
    params, pool = sampler._local(ran, [StudyDirection.MAXIMIZE], GRAPHS, fits, set(),
                                  start_up=False)
    assert params == {**base, "g": True, "c": 128} and pool is None


def test_a_flip_that_fell_over_of_memory_is_paired_where_the_model_says_it_fits():
    """Graphs take 60 of the card's room, 256-token blocks give back 40, x costs 2 a unit and
    the incumbent's pool 10: first the companion with room (256-token blocks), then the relief
    (x lowered to the largest value that fits at that pool: 15), never the 128-token companion
    the model says cannot fit."""
    from optuna.distributions import FloatDistribution

    from tuner.study.pool_trades import pairs_of

    def slack(p):
        return 100 - 2 * p["x"] - 60 * p["g"] + (40 if p["c"] == 256 else 0)

    class Edge:
        param = type("P", (), {"name": "kv"})()

        def room_at(self, trials):
            return lambda p, pool: slack(p) - pool / 10

        def carried(self, value, source, target):
            return value

    space = {**GRAPHS, "y": FloatDistribution(0.0, 1.0), "kv_share": FloatDistribution(0.0, 1.0)}
    base = {"x": 32, "y": 0.5, "c": 16, "g": False, "kv_share": 0.5}
    top = _rec({**base, "kv": 100}, value=2.0)
    pairs = pairs_of({**base, "g": True}, top, base, [top], space, slack,
                     Edge(), ())  # type: ignore[arg-type]
    assert pairs == [{**base, "g": True, "c": 256}, {**base, "g": True, "x": 15}]


def test_a_flip_the_model_rules_out_everywhere_runs_once_at_the_floor_of_its_roomiest_number():
    """Graphs ran only once, out of memory with other knobs, and the model fits them at no
    value of any number: the local move is the graph flip with x (whose floor frees the most
    room) at its lowest value; once that ran, y's floor; none once graphs ran healthy."""
    from optuna.distributions import FloatDistribution
    from optuna.study import StudyDirection

    from tuner.study.pool_trades import floor_relief
    from tuner.study.proposals import GuidedSampler

    def slack(p):
        return -10.0 - p["x"] - p["y"] if p["g"] else 1.0

    space = {**GRAPHS, "y": FloatDistribution(0.0, 1.0)}
    base = {"x": 32, "y": 0.5, "c": 16, "g": False}
    ran = [_rec(base, value=2.0), _rec({**base, "c": 128}, value=1.0),
           _rec({**base, "c": 256}, value=1.5),
           _rec({"x": 100, "y": 0.9, "c": 256, "g": True}, outcome="oom")]
    sampler = GuidedSampler(optuna.samplers.RandomSampler(seed=0), None, startup=0, seed=0)
    params, pool = sampler._local(ran, [StudyDirection.MAXIMIZE], space, slack, set(),
                                  start_up=False)
    assert params == {**base, "g": True, "x": 1} and pool is None
    flip = {**base, "g": True}
    assert floor_relief(flip, base, space, [*ran, _rec(params, outcome="oom")], slack) == \
        [{**flip, "y": 0.0}]
    healthy = _rec({"x": 100, "y": 0.9, "c": 256, "g": True}, value=0.5)
    assert floor_relief(flip, base, space, [*ran, healthy], slack) == []


def test_a_run_that_missed_the_slo_gets_the_choice_that_won_where_it_beat_the_incumbent():
    """The incumbent's graph flip missed the SLO (g=False won); a run with g=True that missed
    the SLO at a higher throughput than the incumbent gets g=False.  A miss under the
    incumbent's figure is not repaired, nor one without a lost comparison."""
    space = GRAPHS
    base = {"x": 8, "y": 0.5, "c": 16, "g": False}
    corner = {"x": 128, "y": 0.9, "c": 256, "g": True}
    ran = [_rec({**base, "kv": 10}, value=2.0), _rec({**corner, "kv": 20}, "slo", 2.5),
           _rec({"x": 2, "y": 0.1, "c": 16, "g": True, "kv": 5}, "slo", 1.5)]
    assert repairs(ran, space, "kv", 1.0, 2.0) == []   # nothing was compared yet
    ran.append(_rec({**base, "g": True, "kv": 10}, "slo", 1.8))
    assert repairs(ran, space, "kv", 1.0, 2.0) == [(ran[1], {**corner, "g": False})]
    assert repairs(ran, space, "kv", 1.0, 3.0) == []   # the miss is under the incumbent
    assert repairs(ran, space, "kv", -1.0, -1.0) == []   # minimizing: 2.5 is no better
