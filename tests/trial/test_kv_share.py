"""KV share of the headroom: the edge fits the card, moves down after an OOM (bisection of the
estimate's error), and trial 0 is made runnable."""

import math
from pathlib import Path

import optuna
from optuna.distributions import FloatDistribution, IntDistribution

from tuner.bench.records import Cell
from tuner.search.bounds import resolve_space
from tuner.search.model import load_model_info
from tuner.search.space_file import load_space
from tuner.search.workload import load_workload
from tuner.study.record import TrialRecord, records
from tuner.trial.kv_calibration import MIN_STEP, Calibration, calibrate
from tuner.trial.kv_share import EDGE_TOL, KvEdge, kv_param, peak_demand
from tuner.trial.memory_estimate import Estimate, estimate, knobs_from_params
from tuner.trial.prescreen import estimate_attr
from tuner.trial.runnable_default import runnable

ROOT = Path(__file__).resolve().parents[2]
GIB = 2 ** 30
CAP = 24 * GIB
CELLS = (Cell(4, 4096, 256, 8), Cell(16, 256, 256, 32))
MODEL = load_model_info(ROOT / "models" / "llama-3.1-8b")


def _space():
    return resolve_space(load_space(ROOT / "search_spaces" / "infinilm.yaml"), MODEL, CAP, CELLS)


def _trial(est: Estimate, outcome: str, idle: int | None = None, ran: bool = True,
           graph: bool = False):
    attrs = {"memory_estimate": estimate_attr(est, graph), "outcome": outcome,
             "cells": [{"cell": "c"}] if ran else []}
    if idle is not None:
        attrs["idle_bytes"] = idle
    return TrialRecord.of(optuna.trial.create_trial(
        params={"x": 1}, distributions={"x": IntDistribution(0, 2)}, values=[0.0],
        user_attrs=attrs))


def _est(pool_gib: float, forward_gib: float = 1.0, cell: str = "c") -> Estimate:
    return Estimate(15 * GIB, int(pool_gib * GIB), 2 * GIB, int(forward_gib * GIB), cell)


def test_forward_scale_is_bisected_between_oom_and_healthy_runs():
    assert calibrate([], CAP).k("c") == 1.0
    oom = _trial(_est(6.0, 1.0), "oom")            # proves k > (24 - 15 - 6 - 2) / 1 = 1
    cal = calibrate([oom, _trial(_est(4.0, 1.0), "ok")], CAP)   # proves k <= 3
    assert cal.scale["c"] == (1.0, 3.0)
    # the OOM's bound is tight, the healthy run's loose: a step up from the OOM's, not the middle
    assert math.isclose(cal.k("c"), 1.0 + MIN_STEP)
    oom2 = _trial(_est(5.0, 1.0), "oom")           # k > 2: with no healthy bound, gallop
    assert calibrate([oom2], CAP).k("c") == 3.0
    assert calibrate([oom2, _trial(_est(4.5, 1.0), "ok")], CAP).k("c") == 2.25
    assert calibrate([oom2], CAP).k("another cell") == 1.0     # per mechanism


def test_startup_oom_raises_the_runtime_floor():
    cal = calibrate([_trial(_est(8.0), "oom", ran=False)], CAP)
    assert cal.runtime_floor[False] == CAP - 15 * GIB - 8 * GIB and cal.scale == {}
    # the floor belongs to the config's CUDA-graph setting: a graph capture that ran out of
    # memory at start-up says nothing about the runtime without graphs (on 70B / H200 one such
    # OOM raised every config's need, and the filter then admitted what the estimate underrates)
    graphs = calibrate([_trial(_est(8.0), "oom", ran=False, graph=True)], CAP)
    assert graphs.runtime_floor == {False: 0, True: CAP - 15 * GIB - 8 * GIB}


def test_edge_is_the_largest_pool_that_fits_and_moves_down_after_an_oom():
    space = _space()
    edge = KvEdge(space, MODEL, CAP, CELLS)
    params = {"block_size": 16, "max_batch_size": 8, "max_num_batched_tokens": 8192}
    top = edge.edge(params, [])
    p = kv_param(space)
    assert p is not None and p.low < top < p.high
    need = lambda v: estimate(MODEL, knobs_from_params(space, {**params, p.name: v}),
                              list(CELLS)).need
    assert need(top) <= CAP < need(top + 1)
    assert edge.value(params, 1.0, []) == top and edge.value(params, 0.0, []) == p.low
    knobs = knobs_from_params(space, {**params, p.name: top})
    at_top = estimate(MODEL, knobs, list(CELLS))
    history = [_trial(at_top, "oom")]
    assert edge.edge(params, history) < top
    assert math.isclose(edge.share_of(params, edge.value(params, 0.5, []), []), 0.5, abs_tol=1e-3)


def test_runnable_lowers_only_a_pool_that_does_not_fit():
    space = _space()
    default = {**space.default_params(), "kv_cache_tokens": 131072}
    fitted = runnable(space, MODEL, CAP, CELLS, default)
    assert fitted["kv_cache_tokens"] < 131072
    knobs = knobs_from_params(space, fitted)
    assert estimate(MODEL, knobs, list(CELLS), runtime=4 * GIB).need <= CAP
    small = {**default, "kv_cache_tokens": 8192}
    assert runnable(space, MODEL, CAP, CELLS, small) == small


def test_pipeline_samples_the_share_and_trial_0_is_a_default_that_runs(tmp_path):
    import argparse

    from tuner.commands.tune_options import warm_start
    from tuner.search.objectives import parse_objectives
    from tuner.search.workload import Workload
    from tuner.study.objective import TrialObjective
    from tuner.trial.context import TrialContext
    from tuner.trial.inprocess import InProcessRunner
    from tuner.trial.pipeline import AdaptivePipeline

    cap = 24564 * 2 ** 20                          # the simulated RTX 4090
    space = resolve_space(load_space(ROOT / "search_spaces" / "infinilm.yaml"), MODEL, cap, CELLS)
    workload = Workload("t", 0, None, CELLS, ("max output_throughput",), {})
    ctx = TrialContext(space=space, workload=workload, model_dir=str(ROOT / "models" / "llama-3.1-8b"),
                       simulate="rtx4090")
    objectives = parse_objectives(["max output_throughput"])
    pipe = AdaptivePipeline(ctx, objectives, MODEL, cap, runner=InProcessRunner("rtx4090"),
                            screen_cells=0, kv_share=True)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    args = argparse.Namespace(no_defaults=False, seed_config=None, warm_start_from=None,
                              sampler="auto")
    assert warm_start(study, space, args, "", tmp_path, pipe) == 1
    study.optimize(TrialObjective(ctx, objectives, tmp_path, 3, pipeline=pipe), n_trials=3)
    first = study.trials[0]
    assert first.user_attrs["is_default"] and first.user_attrs["outcome"] == "ok"
    assert first.params["kv_cache_tokens"] < space.param("kv_cache_tokens").default
    # the knobs infinilm.yaml gives no default (the server's is "no cap") were sampled
    assert TrialRecord.of(first).sampled == sorted(
        p.name for p in space.parameters if p.default is None)
    p = space.param("kv_cache_tokens")
    for t in study.trials:
        assert "kv_share" in t.params and p.low <= t.params["kv_cache_tokens"] <= p.high
        assert t.distributions["kv_cache_tokens"].single()


def test_screening_only_when_it_saves_at_least_half_the_matrix():
    from tuner.search.objectives import parse_objectives
    from tuner.search.workload import Workload
    from tuner.trial.context import TrialContext
    from tuner.trial.pipeline import AdaptivePipeline

    ctx = TrialContext(space=_space(), workload=Workload("t", 0, None, CELLS, (), {}),
                       model_dir="m", simulate="rtx4090")
    pipe = AdaptivePipeline(ctx, parse_objectives(["max output_throughput"]), MODEL, CAP,
                            screen_cells=3)
    assert pipe._screener([], 5, {}) is None          # 3 of 5 cells: saves too little
    assert pipe._screener([], 6, {}) is not None


def test_an_oom_is_charged_to_the_cell_it_happened_in():
    """The estimate's peak cell ran first and held; the OOM came in the next cell: the first
    cell's scale is bounded from above, the second's from below."""
    est = Estimate(15 * GIB, 4 * GIB, 2 * GIB, 2 * GIB, "big",
                   cell_forwards=(("big", 2 * GIB), ("small", GIB)))
    t = TrialRecord.of(optuna.trial.create_trial(
        params={"x": 1}, distributions={"x": IntDistribution(0, 2)}, values=[0.0],
        user_attrs={"memory_estimate": estimate_attr(est, False), "outcome": "oom",
                    "cells": [{"cell": {"key": "big"}}, {"cell": {"key": "small"}}]}))
    cal = calibrate([t], CAP)     # room = 24 - 15 - 4 - 2 = 3 GiB
    assert cal.scale == {"big": (0.0, 1.5), "small": (3.0, math.inf)}
    assert cal.k("big") == 1.0 and cal.k("small") == 5.0


def test_an_oom_after_every_cell_finished_is_charged_to_none():
    """The server died in the capacity search, after both cells ran without error: both cells'
    forwards held, neither is proven larger than the estimate."""
    est = Estimate(15 * GIB, 4 * GIB, 2 * GIB, 2 * GIB, "big",
                   cell_forwards=(("big", 2 * GIB), ("small", GIB)))
    rows = [{"cell": {"key": k}, "error_class": None} for k in ("big", "small")]
    t = TrialRecord.of(optuna.trial.create_trial(
        params={"x": 1}, distributions={"x": IntDistribution(0, 2)}, values=[0.0],
        user_attrs={"memory_estimate": estimate_attr(est, False), "outcome": "oom",
                    "cells": rows}))
    assert calibrate([t], CAP).scale == {"big": (0.0, 1.5), "small": (0.0, 3.0)}
    rows[1]["error_class"] = "unhealthy"        # died in the second cell: that one is charged
    t2 = TrialRecord.of(optuna.trial.create_trial(
        params={"x": 1}, distributions={"x": IntDistribution(0, 2)}, values=[0.0],
        user_attrs={"memory_estimate": estimate_attr(est, False), "outcome": "oom",
                    "cells": rows}))
    assert calibrate([t2], CAP).scale == {"big": (0.0, 1.5), "small": (3.0, math.inf)}


def test_slack_is_what_the_smallest_pool_leaves():
    space = _space()
    edge = KvEdge(space, MODEL, CAP, CELLS)
    p = kv_param(space)
    assert p is not None
    params = {"block_size": 16, "max_batch_size": 8, "max_num_batched_tokens": 8192}
    need = estimate(MODEL, knobs_from_params(space, {**params, p.name: int(p.low)}),
                    list(CELLS)).need
    assert edge.slack_of([])(params) == CAP - need


def test_share_resumes_a_study_that_drew_the_pool_as_a_log_size():
    """A study from before the KV share (kv_cache_tokens from a log range) goes on with it."""
    space = _space()
    edge = KvEdge(space, MODEL, CAP, CELLS)
    p = kv_param(space)
    assert p is not None
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(
        params={p.name: 16384}, values=[1.0],
        distributions={p.name: IntDistribution(int(p.low), int(p.high), log=True)}))
    trial = study.ask()
    params = edge.suggest(trial, {"block_size": 256, "max_batch_size": 8}, [])
    study.tell(trial, 2.0)
    assert p.low <= params[p.name] <= p.high
    assert study.trials[-1].distributions[p.name].log


def test_a_requeued_trial_keeps_its_pool():
    """A dead worker's trial is re-queued with its params: its pool is run again as it was,
    not re-rendered from the share against an edge that has moved since."""
    space = _space()
    edge = KvEdge(space, MODEL, CAP, CELLS)
    p = kv_param(space)
    assert p is not None
    params = {"block_size": 256, "max_batch_size": 8}
    rendered = edge.value(params, 0.5, [])
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({p.name: rendered + 256, "kv_share": 0.5})
    trial = study.ask()
    assert edge.suggest(trial, dict(params), [])[p.name] == rendered + 256
    study.tell(trial, 1.0)
    dist = study.trials[-1].distributions[p.name]  # the report rebuilds trials from it
    assert dist.low == dist.high == rendered + 256


def _run(params, outcome):
    """A measured trial of `params` (the KV knob included) with no memory record."""
    dists = {k: IntDistribution(0, 1 << 20) for k in params}
    return TrialRecord.of(optuna.trial.create_trial(
        params=params, distributions=dists, values=[1.0], user_attrs={"outcome": outcome}))


def test_the_real_edge_of_one_config_is_bisected_between_its_own_runs():
    """The model's edge until these very knobs ran; then the midpoint of the pool that held and
    the pool that ran out, until the bracket is narrower than EDGE_TOL; other knobs: unmoved."""
    space = _space()
    edge = KvEdge(space, MODEL, CAP, CELLS)
    params = {"block_size": 16, "max_batch_size": 8, "max_num_batched_tokens": 8192}
    top = edge.edge(params, [])
    held = _run({**params, "kv_cache_tokens": 8192}, "ok")
    failed = _run({**params, "kv_cache_tokens": top - 4096}, "oom")
    assert edge.bracket(params, [held, failed]) == (8192, top - 4096)
    mid = edge.edge(params, [held, failed])
    assert 8192 < mid < top - 4096 and abs(mid - (8192 + top - 4096) / 2) <= 16
    close = _run({**params, "kv_cache_tokens": 8192 + 64}, "oom")   # within 2%: closed
    assert edge.edge(params, [held, close]) == 8192
    other = {**params, "max_batch_size": 16}
    assert edge.edge(other, [held, failed]) == edge.edge(other, [])
    bigger = _run({**params, "kv_cache_tokens": top + 1024}, "slo")   # the model was low
    assert edge.edge(params, [bigger]) == top + 1024


def test_a_config_that_only_ran_out_of_memory_descends_in_doubling_steps():
    """Without a pool of these knobs that held, each further OOM doubles the way down from the
    first one, at least EDGE_TOL of the pool: on a Qwen2.5-7B / L40S study of
    benchmarks/search_efficiency.py the walk went 246783, 246687, 246623, 246591 tokens."""
    space = _space()
    edge = KvEdge(space, MODEL, CAP, CELLS)
    params = {"block_size": 16, "max_batch_size": 8, "max_num_batched_tokens": 8192}
    top = edge.edge(params, [])
    first = _run({**params, "kv_cache_tokens": top}, "oom")
    once = edge.edge(params, [first])
    assert once <= top - int(EDGE_TOL * top)
    near = _run({**params, "kv_cache_tokens": top - 200}, "oom")     # a second OOM just under
    assert edge.edge(params, [first, near]) <= top - 200 - int(EDGE_TOL * (top - 200))
    far = _run({**params, "kv_cache_tokens": top - 2000}, "oom")
    assert edge.edge(params, [first, far]) <= top - 4000            # twice the way down
    held = _run({**params, "kv_cache_tokens": 8192}, "ok")           # a pool held: bisect
    assert abs(edge.edge(params, [first, far, held]) - (8192 + top - 2000) / 2) <= 16


def _oom(space, ran, params):
    """A trial stored with `params` that ran out of memory in the peak cell of config `ran`."""
    est = estimate(MODEL, knobs_from_params(space, ran), list(CELLS))
    return TrialRecord.of(optuna.trial.create_trial(
        params=params, distributions={k: IntDistribution(0, 10 ** 6) for k in params},
        values=[0.0], user_attrs={"memory_estimate": estimate_attr(est, False),
                                  "outcome": "oom", "cells": [{"cell": {"key": est.peak_cell}}]}))


def test_the_filter_never_rejects_a_need_seen_healthy():
    """OOMs that put the forward scale above what a healthy run allows must not turn that
    healthy config (or a smaller one) away."""
    space = _space()
    edge = KvEdge(space, MODEL, CAP, CELLS)
    params = {"block_size": 16, "max_batch_size": 8, "max_num_batched_tokens": 8192}
    ran = {**params, "kv_cache_tokens": 8192}
    oom = _oom(space, ran, {"x": 1})
    assert edge.slack_of([oom])(params) < 0
    assert edge.slack_of([oom, _run(ran, "ok")])(params) >= 0


def test_a_need_seen_healthy_clears_other_mechanisms_only_below_every_oom():
    """Two runs of one config disagree on the 4k prefill's scale (an OOM at 8192 tokens, a
    healthy run at 10240): the scale sides with the OOM, so the healthy run's own calibrated
    need is over the card.  It still clears configs of its mechanism up to its need (the test
    above).  A config with CUDA graphs is another mechanism: the OOM's need bounds what the
    healthy run clears for it."""
    space = _space()
    edge = KvEdge(space, MODEL, CAP, CELLS)
    params = {"block_size": 16, "max_batch_size": 8, "max_num_batched_tokens": 8192}
    ran = {**params, "kv_cache_tokens": 8192}
    trials = [_oom(space, ran, ran), _run({**params, "kv_cache_tokens": 10240}, "ok")]
    cal = calibrate(trials, CAP, edge.knobs_of)
    graph = {**params, "enable_graph": True}
    at_oom = edge.need(params, 8192, cal, 2 * GIB)
    held = edge.need(params, 10240, cal, 2 * GIB)
    same = edge.need(params, 9216, cal, 2 * GIB)
    other = edge.need(graph, 4608, cal, int(2.5 * GIB))
    assert CAP < at_oom < other < held and at_oom < same < held
    room = edge.room_at(trials)
    assert room(params, 10240) >= 0 and room(params, 9216) >= 0
    assert room(graph, 4608) < 0


def test_an_oom_the_estimate_predicted_does_not_make_it_more_optimistic():
    """An OOM proves the forward scale above room/forward; when the estimate already called the
    config too big (that bound under 1), the estimate stands: the OOM must not lower k."""
    def k(lo: float, hi: float) -> float:
        return Calibration({False: 0, True: 0}, {"c": (lo, hi)}).k("c")
    assert k(0.3, math.inf) == 1.0 and k(0.3, 1.5) == 1.0
    assert k(0.0, 0.8) == 0.8           # healthy runs proved it smaller
    assert k(0.8, 0.98) == 0.98         # an OOM below that leaves it there, never lower
    assert k(0.44, 0.37) > 0.44         # the runs disagree: the OOM wins
    assert Calibration({False: 0, True: 0}, {"c": (1.2, math.inf)}).k("c") > 1.2


def test_an_oom_with_cuda_graphs_calibrates_the_graph_configs_only():
    oom = _trial(_est(5.0, 1.0), "oom", graph=True)          # proves k > 1.5 with graphs
    healthy = _trial(_est(4.0, 2.0), "ok")                   # proves k <= 1.5 without
    cal = calibrate([oom, healthy], CAP)
    assert cal.k("c", graph=False) == 1.0 and cal.k("c", graph=True) > 1.0
    assert calibrate([healthy], CAP).k("c", graph=True) == 1.0   # no evidence: the shared one


def test_a_pool_in_blocks_holds_the_largest_request_at_every_block_size():
    """The transformers space counts its pool in blocks from one lower bound (64) for every
    block size; at share 0 the pool still holds the longest request with its template."""
    from tuner.search.bounds import TEMPLATE_TOKENS
    cells = (Cell(32, 2048, 32, 32), Cell(1, 128, 32, 2))
    space = resolve_space(load_space(ROOT / "search_spaces" / "transformers.yaml"), MODEL, CAP,
                          cells)
    edge = KvEdge(space, MODEL, CAP, cells)
    assert edge.param.name == "cb_num_blocks" and edge.param.low == 64
    for block in (32, 64, 128, 256):
        params = {"cb_block_size": block, "cb_max_batch_tokens": 512,
                  "max_requests_per_batch": 16}
        blocks = edge.value(params, 0.0, [])
        assert blocks * block >= 2048 + 32 + TEMPLATE_TOKENS and blocks >= 64
        assert edge.share_of(params, blocks, []) == 0.0
        assert edge.value(params, 0.0, []) == {32: 67}.get(block, 64)  # 2144 / 32
    assert edge.floors() == {32: 67}     # what the tune banner adds to the range [64, ...]


def test_the_peak_demand_is_the_heaviest_cell_in_whole_blocks_and_unbounded_with_a_source():
    """Every request of a cell in flight at once, with its template, in whole blocks; a cell
    of fewer prompts than its concurrency never has more in flight; prompts from a source can
    share prefixes a larger pool keeps cached, so their demand has no bound."""
    from tuner.bench.sources import SharedPrefixSource
    from tuner.search.bounds import TEMPLATE_TOKENS
    cells = (Cell(4, 4096, 256, 8), Cell(64, 100, 28, 2))
    per = 4096 + 256 + TEMPLATE_TOKENS
    assert peak_demand(cells, 1) == 4 * per
    assert peak_demand(cells, 256) == 4 * -(-per // 256) * 256
    assert peak_demand((Cell(64, 100, 28, 2),), 16) == 2 * 192
    # a config that admits 3 requests at once holds 3 requests' blocks
    assert peak_demand(cells, 1, max_batch=3) == max(3 * per, 3 * (100 + 28 + TEMPLATE_TOKENS))
    shared = Cell(8, 512, 64, 16, source=SharedPrefixSource(2, 256, 64, 2, 64))
    assert peak_demand((*cells, shared), 16) is None
    assert peak_demand((), 16) is None


def test_the_useful_pool_is_the_peak_demand_in_the_knobs_units():
    """In tokens for the InfiniLM space, in blocks of the config's block size for the
    transformers space; never above the range."""
    cells = (Cell(4, 4096, 256, 8),)
    space = resolve_space(load_space(ROOT / "search_spaces" / "infinilm.yaml"), MODEL, CAP,
                          cells)
    edge = KvEdge(space, MODEL, CAP, cells)
    assert edge.useful({"block_size": 64}) == peak_demand(cells, 64)
    blocks = resolve_space(load_space(ROOT / "search_spaces" / "transformers.yaml"), MODEL, CAP,
                           cells)
    edge = KvEdge(blocks, MODEL, CAP, cells)
    assert edge.useful({"cb_block_size": 32}) == peak_demand(cells, 32) // 32
    huge = (Cell(10 ** 4, 4096, 256, 10 ** 4),)
    assert KvEdge(blocks, MODEL, CAP, huge).useful({"cb_block_size": 32}) == \
        edge.param.bounds[1]


def test_a_block_size_flip_keeps_the_pools_tokens_not_its_block_count():
    from tuner.study.flips import at_pool
    cells = (Cell(32, 2048, 32, 32),)
    space = resolve_space(load_space(ROOT / "search_spaces" / "transformers.yaml"), MODEL, CAP,
                          cells)
    edge = KvEdge(space, MODEL, CAP, cells)
    top_params = {"cb_block_size": 256, "cb_max_batch_tokens": 512, "max_requests_per_batch": 16,
                  "cb_num_blocks": 65, "kv_share": 1.0}
    top = TrialRecord.of(optuna.trial.create_trial(
        params=top_params, distributions={k: IntDistribution(0, 10 ** 6) for k in top_params
                                          if k != "kv_share"} | {
            "kv_share": optuna.distributions.FloatDistribution(0.0, 1.0)},
        values=[1.0], user_attrs={"outcome": "ok"}))
    flip = {k: v for k, v in top_params.items() if k != "cb_num_blocks"} | {"cb_block_size": 32}
    _, pool = at_pool(flip, top, edge, [top])
    assert pool == 65 * 8                      # 16640 tokens either way
    assert edge.carried(65, top_params, {"cb_block_size": 256}) == 65   # same size: unchanged


def test_a_pool_the_proposals_pin_is_the_pool_that_runs_even_above_the_edge(tmp_path):
    """The proposals pin a pool on the pipeline's edge (flips at the incumbent's pool, edge
    probes); the trial must run that pool, not the share's rendering, which stops at the edge."""
    from tuner.search.objectives import parse_objectives
    from tuner.search.workload import Workload
    from tuner.trial.context import TrialContext
    from tuner.trial.pipeline import AdaptivePipeline

    cap = 24564 * 2 ** 20
    space = resolve_space(load_space(ROOT / "search_spaces" / "infinilm.yaml"), MODEL, cap, CELLS)
    ctx = TrialContext(space=space, workload=Workload("t", 0, None, CELLS,
                                                      ("max output_throughput",), {}),
                       model_dir=str(ROOT / "models" / "llama-3.1-8b"), simulate="rtx4090")
    pipe = AdaptivePipeline(ctx, parse_objectives(["max output_throughput"]), MODEL, cap,
                            kv_share=True)
    assert pipe.kv_edge is pipe.kv_edge
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    edge = pipe.kv_edge
    rest = {"block_size": 256, "max_num_batched_tokens": 4096}
    above = edge.edge(rest, []) + 4096
    edge.pinned[trial.number] = above
    params = pipe.suggest(trial)
    assert params["kv_cache_tokens"] == above


def test_a_flip_carries_the_tokens_the_incumbents_whole_blocks_hold():
    """4991 tokens of 128-token blocks are 38 blocks, 4864 tokens: a flip to 16-token blocks
    runs 4864, not the 4991 the incumbent asked for; never below the target's floor."""
    edge = KvEdge(_space(), MODEL, CAP, CELLS)
    assert edge.param.name == "kv_cache_tokens"
    assert edge.carried(4991, {"block_size": 128}, {"block_size": 16}) == 4864
    assert edge.carried(4864, {"block_size": 16}, {"block_size": 128}) == 4864
    floor = edge.value({"block_size": 16}, 0.0, [])
    assert edge.carried(floor - 1, {"block_size": 256}, {"block_size": 16}) == floor


def test_a_cell_that_raised_the_memory_mark_measured_its_scale_without_an_oom():
    """Idle 21 GiB (15 weights, 4 pool, 2 runtime); the big cell raised the mark by 1.5 GiB
    where the estimate said 1: k = 1.5 for that cell, before any OOM.  The small cell left the
    mark where it was and measured nothing; the mark of a failed cell is never read."""
    est = Estimate(15 * GIB, 4 * GIB, 2 * GIB, GIB, "big",
                   cell_forwards=(("big", GIB), ("small", GIB // 2)))
    idle, mark = 21 * GIB, int(22.5 * GIB)

    def run(outcome, errors):
        rows = [{"cell": {"key": k}, "error_class": e, "peak_bytes": mark}
                for k, e in zip(("big", "small"), errors)]
        return TrialRecord.of(optuna.trial.create_trial(
            params={"x": 1}, distributions={"x": IntDistribution(0, 2)}, values=[0.0],
            user_attrs={"memory_estimate": estimate_attr(est, False), "outcome": outcome,
                        "cells": rows, "idle_bytes": idle}))
    cal = calibrate([run("ok", (None, None))], CAP)
    assert cal.seen == {"big": 1.5} and cal.k("big") == 1.5 and cal.k("small") == 1.0
    assert cal.k("big", graph=True) == 1.5          # no graph evidence of its own yet
    assert calibrate([run("oom", ("oom", None))], CAP).seen == {}
    # a healthy run closer to the edge bounds the scale lower than the mark said
    near = _trial(_est(6.0, 1.0, "big"), "ok")      # k <= (24 - 15 - 6 - 2) / 1 = 1
    assert calibrate([run("ok", (None, None)), near], CAP).k("big") == 1.0


def _marked(params, ratio, form=""):
    """A healthy run of `params` whose one cell ("big", estimated 1 GiB of forward of `form`)
    raised the memory mark `ratio` GiB over its idle 21 GiB: it measured the scale `ratio`."""
    est = Estimate(15 * GIB, 4 * GIB, 2 * GIB, GIB, "big", cell_forwards=(("big", GIB),),
                   cell_forms=(("big", form),))
    return TrialRecord.of(optuna.trial.create_trial(
        params=params, values=[0.0],
        distributions={n: IntDistribution(0, 100000) for n in params},
        user_attrs={"memory_estimate": estimate_attr(est, False), "outcome": "ok",
                    "idle_bytes": 21 * GIB, "cells": [{"cell": {"key": "big"},
                    "error_class": None, "peak_bytes": int((21 + ratio) * GIB)}]}))


def test_a_pool_allocated_on_first_use_is_not_counted_as_forward():
    """Idle at weights + 0.5 GiB, under weights + pool (the server allocates its 4 GiB pool on
    the first request): a mark 5.5 GiB over idle is the pool and 1.5 GiB of forward."""
    est = Estimate(15 * GIB, 4 * GIB, 2 * GIB, GIB, "big", cell_forwards=(("big", GIB),))
    run = TrialRecord.of(optuna.trial.create_trial(
        params={"x": 1}, distributions={"x": IntDistribution(0, 2)}, values=[0.0],
        user_attrs={"memory_estimate": estimate_attr(est, False), "outcome": "ok",
                    "idle_bytes": int(15.5 * GIB), "cells": [
                        {"cell": {"key": "big"}, "error_class": None,
                         "peak_bytes": int(21 * GIB)}]}))
    assert calibrate([run], 32 * GIB).seen == {"big": 1.5}


def test_a_server_seen_allocating_its_pool_on_first_use_does_so_at_every_pool():
    """Two runs idle at weights + 0.5 GiB: one with a 4 GiB pool (idle under weights + pool:
    the server allocates on first use), one with a 0.25 GiB pool (which alone would pass as
    allocated at start-up).  Both marks are read over idle + pool, and the runtime is 0.5."""
    from tuner.trial.prescreen import calibrated_runtime, pool_on_first_use

    def run(pool_gib, mark_gib):
        est = Estimate(15 * GIB, int(pool_gib * GIB), 2 * GIB, GIB, "big",
                       cell_forwards=(("big", GIB),))
        return TrialRecord.of(optuna.trial.create_trial(
            params={"x": pool_gib}, distributions={"x": FloatDistribution(0, 8)}, values=[0.0],
            user_attrs={"memory_estimate": estimate_attr(est, False), "outcome": "ok",
                        "idle_bytes": int(15.5 * GIB), "cells": [
                            {"cell": {"key": "big"}, "error_class": None,
                             "peak_bytes": int(mark_gib * GIB)}]}))
    small = run(0.25, 16.25)                     # forward 0.5 GiB over idle + pool
    assert not pool_on_first_use([small])
    both = [run(4.0, 20.0), small]
    assert pool_on_first_use(both)
    assert calibrate(both, 32 * GIB).seen == {"big": 0.5}
    assert calibrated_runtime(both, False) == GIB // 2


def test_a_config_without_a_mark_of_its_own_takes_the_scale_of_the_nearest_measured():
    """Two measured configs: A (x=1, y=1) saw 1.2, B (x=2, y=2) saw 0.9.  A config measured
    itself gets its own scale; another the nearest's (fewest knobs apart; of a tie, the
    largest); the pool and the share never count as a difference."""
    cal = calibrate([_marked({"x": 1, "y": 1, "kv": 100}, 1.2),
                     _marked({"x": 2, "y": 2, "kv": 200}, 0.9)], CAP,
                    lambda p: {k: v for k, v in p.items() if k != "kv"})
    assert math.isclose(cal.k("big", knobs={"x": 2, "y": 2}), 0.9)
    assert math.isclose(cal.k("big", knobs={"x": 2, "y": 3}), 0.9)
    assert math.isclose(cal.k("big", knobs={"x": 1, "y": 2}), 1.2)
    assert math.isclose(cal.k("big"), 1.2)             # no config named: the largest seen


def test_the_incumbent_below_its_own_edge_is_pushed_to_it_or_to_the_peak_demand_once():
    """An incumbent whose pool sits more than EDGE_TOL under its edge is proposed at share 1.0
    (its edge), or, where the workload's heaviest cell needs less, at the pool that holds that
    cell's requests all at once; at that pool, nothing is pushed."""
    from optuna.distributions import FloatDistribution

    from tuner.study.edge_pushes import at_edge
    from tuner.study.record import KV_SHARE

    space = _space()
    rest = {"block_size": 256, "max_num_batched_tokens": 4096}
    search_space = {"block_size": space.param("block_size").distribution(),
                    "max_num_batched_tokens": space.param("max_num_batched_tokens").distribution(),
                    KV_SHARE: FloatDistribution(0.0, 1.0)}

    def top(pool, outcome="ok", number=0):
        t = optuna.trial.create_trial(
            params={**rest, KV_SHARE: 0.5, "kv_cache_tokens": pool},
            distributions={**search_space, "kv_cache_tokens": IntDistribution(1, 10 ** 6)},
            values=[1.0], user_attrs={"outcome": outcome})
        t.number = number
        return TrialRecord.of(t)
    heavy = (Cell(64, 4096, 256, 64),)           # 64 x 4608 tokens: more than the card holds
    edge = KvEdge(space, MODEL, CAP, heavy)
    top_edge = edge.edge(rest, [])
    assert edge.useful(rest) > top_edge
    low = top(top_edge // 2)
    assert at_edge(low, [low], search_space, edge) == {**rest, KV_SHARE: 1.0}
    at = top(top_edge)
    assert at_edge(at, [at], search_space, edge) is None
    # the same knobs missed the SLOs at a larger pool: no push (edge_pushes.outgrown)
    larger = top(top_edge * 3 // 4, outcome="slo", number=1)
    assert at_edge(low, [low, larger], search_space, edge) is None

    edge = KvEdge(space, MODEL, CAP, CELLS)      # 4 x 4608 tokens in 256-token blocks
    assert edge.useful(rest) == 4 * 4608 < edge.edge(rest, [])
    low = top(4 * 4608 // 2)
    pushed = at_edge(low, [low], search_space, edge)
    assert edge.value(rest, pushed[KV_SHARE], [low]) == 4 * 4608
    at = top(4 * 4608)
    assert at_edge(at, [at], search_space, edge) is None


def test_the_edge_keeps_the_pool_inside_the_servers_footprint_check():
    """transformers' `cb_max_memory_percent` (role cache_memory_share): the r14 H200 study's two
    OOMs were pools at shares 0.58 and 0.51 over what that share of the free memory allowed;
    the edge of a config is now the largest pool whose footprint fits its share."""
    from tuner.trial.memory_estimate import estimate, knobs_from_params
    cells = (Cell(4, 4096, 32, 8), Cell(64, 256, 64, 64))
    space = resolve_space(load_space(ROOT / "search_spaces" / "transformers.yaml"), MODEL, CAP,
                          cells)
    edge = KvEdge(space, MODEL, CAP, cells)
    base = {"cb_block_size": 256, "cb_max_batch_tokens": 837, "cb_use_cuda_graph": False,
            "scheduler_type": "fifo", "max_requests_per_batch": 64}
    # the runtime r14 measured (idle - weights: the pool is allocated at the first request)
    runtime = 16616587264 - MODEL.weight_bytes
    seen = [_trial(Estimate(MODEL.weight_bytes, GIB, runtime, GIB, "c"), "ok",
                   idle=16616587264)]
    edges = {share: edge.edge({**base, "cb_max_memory_percent": share}, seen)
             for share in (0.5, 0.58, 0.95)}
    assert edges[0.5] < edges[0.58] < edges[0.95]
    for share in (0.5, 0.58):           # at 0.95 the card, not the check, bounds the pool
        params = {**base, "cb_max_memory_percent": share}
        for n, fits in ((edges[share], True), (edges[share] + 1, False)):
            knobs = knobs_from_params(space, {**params, "cb_num_blocks": n})
            est = estimate(MODEL, knobs, cells, runtime=runtime)
            assert (est.check_need <= CAP) == fits
    assert edges[0.58] < 146        # r14's trial 1 (146 blocks at 0.58) is past the edge


def test_no_healthy_run_clears_a_config_the_servers_footprint_check_refuses():
    """The r36 H200 transformers study: trial 10 (no CUDA graphs) ran at a need of 24.74 GiB on
    the 24 GiB cap, and that cleared, for the proposals, trials 17 and 21, whose footprint check
    wanted 24.74 GiB: both were proposed and the pre-screen skipped both.  The check is a formula
    of the config, so no run clears it; a need seen healthy still clears its own config."""
    cells = tuple(load_workload(ROOT / "benchmarks" / "h200" / "workload-seed8b.yaml").cells)
    space = resolve_space(load_space(ROOT / "search_spaces" / "transformers.yaml"), MODEL, CAP,
                          cells)
    edge = KvEdge(space, MODEL, CAP, cells)
    db = ROOT / "benchmarks" / "results" / "h200-transformers-8b-seedwl-r36" / "study.db"
    study = optuna.load_study(study_name="h200-transformers-8b-seedwl-r35",
                              storage=f"sqlite:///{db}")
    trials = records(study, (optuna.trial.TrialState.COMPLETE,))
    by_number = {t.number: t for t in trials}
    before = [t for t in trials if t.number < 17]
    room = edge.room_at(before)
    for n in (17, 21):
        params = dict(by_number[n].params)
        assert by_number[n].outcome == "skipped"
        assert room(params, int(params["cb_num_blocks"])) < 0
    ran = dict(by_number[10].params)
    cal = calibrate(before, CAP, edge.knobs_of)
    assert edge.need(ran, int(ran["cb_num_blocks"]), cal, 0) > CAP
    assert room(ran, int(ran["cb_num_blocks"])) >= 0


def test_a_shape_measured_by_other_configs_floors_the_scale_of_a_config_of_that_shape():
    """q-qwen7b-3090-open, seed 1: runs of one prompt's prefill beside decodes measured 1.02,
    a healthy run of five prompts' prefill proved the cell's scale at most 0.77 (its estimate
    was loose), and a config of the first shape was sized at 0.77: 21% past its edge.  The
    smallest scale the shape measured is a floor for a config that did not measure the cell
    itself, whatever the number of decodes beside it; a config's own measurement stands."""
    def loose(params):
        """A healthy run of five prompts' prefill: no mark, room over its forward 0.77."""
        est = Estimate(15 * GIB, int(6.23 * GIB), 2 * GIB, GIB, "big",
                       cell_forwards=(("big", GIB),), cell_forms=(("big", "prefill of 5"),))
        return TrialRecord.of(optuna.trial.create_trial(
            params=params, values=[0.0],
            distributions={n: IntDistribution(0, 100000) for n in params},
            user_attrs={"memory_estimate": estimate_attr(est, False), "outcome": "ok",
                        "cells": [{"cell": {"key": "big"}}]}))
    trials = [_marked({"x": 1, "y": 1, "kv": 100}, 1.02, "prefill of 1 beside 16 decodes"),
              _marked({"x": 1, "y": 2, "kv": 100}, 1.04, "prefill of 1 beside 11 decodes"),
              _marked({"x": 2, "y": 2, "kv": 100}, 0.6, "prefill of 2 beside 1 decode"),
              loose({"x": 3, "y": 3, "kv": 100})]
    cal = calibrate(trials, CAP, lambda p: {k: v for k, v in p.items() if k != "kv"})
    other = {"x": 2, "y": 1}                    # measured nothing of its own
    assert cal.k("big", knobs=other) < 0.78    # the cell's bound: no shape given
    floor = cal.k("big", knobs=other, form="prefill of 1 beside 23 decodes")
    assert math.isclose(floor, 1.02, rel_tol=1e-6)
    assert cal.k("big", knobs=other, form="prefill of 5") < 0.78     # no mark of that shape
    own = cal.k("big", knobs={"x": 2, "y": 2}, form="prefill of 1 beside 3 decodes")
    assert math.isclose(own, 0.6, rel_tol=1e-6)


def test_an_oom_a_controlled_comparison_charges_to_other_knobs_leaves_the_scale_alone():
    """q-qwen7b-3090-open, seed 7: the incumbent A ran healthy and measured its scale; its
    flip B (x 1 -> 2) ran out of memory at a smaller pool and proved the cell's scale over
    1.05.  The pair charges the memory to x=2: a config with A's x keeps the scale the healthy
    runs give, one with x=2 gallops past B's bound as before, and so does every config when
    no config is named or when B's pool was the larger."""
    def oom(pool_gib):      # a forward 1.05 times the room: 24 - 15 - 2 GiB - its pool
        forward = int((7 - pool_gib) / 1.05 * GIB)
        est = Estimate(15 * GIB, int(pool_gib * GIB), 2 * GIB, forward, "big",
                       cell_forwards=(("big", forward),))
        return TrialRecord.of(optuna.trial.create_trial(
            params={"x": 2, "y": 1, "kv": 100}, values=[0.0],
            distributions={n: IntDistribution(0, 100000) for n in ("x", "y", "kv")},
            user_attrs={"memory_estimate": estimate_attr(est, False), "outcome": "oom",
                        "cells": [{"cell": {"key": "big"}, "error_class": "oom"}]}))
    knobs = lambda p: {k: v for k, v in p.items() if k != "kv"}  # noqa: E731
    healthy = _marked({"x": 1, "y": 1, "kv": 100}, 1.0)     # its pool: 4 GiB
    cal = calibrate([healthy, oom(3.95)], CAP, knobs)        # B proved k > 1.05
    assert math.isclose(cal.k("big", knobs={"x": 1, "y": 2}), 1.0, rel_tol=1e-6)
    assert math.isclose(cal.k("big", knobs={"x": 2, "y": 2}), 1.05 + MIN_STEP, rel_tol=1e-3)
    assert math.isclose(cal.k("big"), 1.05 + MIN_STEP, rel_tol=1e-3)
    larger = calibrate([healthy, oom(4.5)], CAP, knobs)      # B's pool the larger: no pair
    assert larger.k("big", knobs={"x": 1, "y": 2}) > 1.0
