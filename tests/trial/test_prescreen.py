"""Pre-screen: skip only the hopeless, learn the bar from OOMs, never skip below a healthy run."""

import dataclasses
from pathlib import Path

from optuna.trial import TrialState

from tuner.bench.records import Cell
from tuner.search.bounds import resolve_space
from tuner.search.model import load_model_info
from tuner.search.objectives import parse_objectives
from tuner.search.space_file import load_space
from tuner.search.workload import Workload
from tuner.study.record import TrialRecord
from tuner.trial.context import TrialContext
from tuner.trial.kv_calibration import measured, proven
from tuner.trial.memory_estimate import Estimate
from tuner.trial.pipeline import AdaptivePipeline
from tuner.trial.prescreen import calibrated_runtime, decide, estimate_attr

GIB = 2 ** 30
CAP = 24 * GIB


def _est(pool_gib: float, runtime_gib: float = 2.0, forward_gib: float = 1.0) -> Estimate:
    return Estimate(weights=15 * GIB, pool=int(pool_gib * GIB), runtime=int(runtime_gib * GIB),
                    forward=int(forward_gib * GIB), peak_cell="c")


def _formed(pool: float, forward: float, form: str, runtime: float = 2.0) -> Estimate:
    """One cell "c" whose worst case has `form`; sizes in GiB."""
    return Estimate(weights=15 * GIB, pool=int(pool * GIB), runtime=int(runtime * GIB),
                    forward=int(forward * GIB), peak_cell="c",
                    cell_forwards=(("c", int(forward * GIB)),), cell_forms=(("c", form),))


def _trial(est: Estimate, outcome: str, idle: int | None = None, graph: bool = False):
    return TrialRecord(number=0, state=TrialState.COMPLETE, values=(0.0,), constraints={},
                       params={"x": 1}, outcome=outcome, memory=estimate_attr(est, graph),
                       idle_bytes=idle)


def test_without_evidence_only_far_over_the_card_is_skipped():
    assert not decide(_est(5.5), CAP, []).skip           # 23.5 GiB: may fit
    assert not decide(_est(8.0), CAP, []).skip           # 26 GiB: within the prior margin
    assert decide(_est(12.0), CAP, []).skip              # 30 GiB: hopeless


def test_an_oom_lowers_the_bar_to_its_need_plus_a_margin_for_the_same_mechanism():
    history = [_trial(_est(6.0), "oom")]
    assert decide(_est(7.0), CAP, history).skip
    assert not decide(_est(6.5), CAP, history).skip          # within 3% of the card
    assert not decide(_est(5.0), CAP, history).skip
    other = Estimate(15 * GIB, 7 * GIB, 2 * GIB, GIB, peak_cell="another cell")
    assert not decide(other, CAP, history).skip              # another failure mechanism
    # a smaller forward with a larger pool: the OOM's error in the forward does not carry over
    assert not decide(_est(7.5, forward_gib=0.5), CAP, history).skip
    assert decide(_est(7.5, forward_gib=1.5), CAP, history).skip


def test_an_oom_bars_no_config_whose_own_knobs_ran_healthy_above_its_need():
    """Llama-3.1-8B / L40S open loop (x-8b-l40s-open, seed 5, 30 trials): a bisection between
    its own knobs' healthy run and their OOM was skipped by another config's OOM, whose need was
    under the healthy run's; launched, it runs healthy.  Own knobs healthy only under the OOM's
    need leave the bar where it was."""
    oom = _trial(_est(6.0), "oom")                       # another config: 24 GiB
    above = _trial(_est(6.6), "ok")                      # these knobs at 24.6 GiB
    below = _trial(_est(5.5), "ok")                      # these knobs at 23.5 GiB
    assert decide(_est(7.0), CAP, [oom, above]).skip
    assert not decide(_est(7.0), CAP, [oom, above], siblings=[above]).skip
    assert decide(_est(7.0), CAP, [oom, below], siblings=[below]).skip


def test_an_oom_in_another_cell_than_its_estimated_peak_sets_no_bar_for_that_peak():
    """Llama-3.2-3B / RTX 4090 (v-3b-4090-open, seed 8): two configs whose estimated peak is
    the 6k-prompt cell ran out of memory in the chat cell after the 6k cell held; a config
    with a smaller token budget (a smaller chat-cell forward, the same 6k-cell estimate) was
    skipped as over their need, and it runs healthy.  An OOM charges its need to the cell it
    happened in; one with no cell keys stored, to its estimated peak."""
    def died_in(cells):
        return dataclasses.replace(_trial(_est(6.0), "oom"), cells=[
            {"cell": {"key": k}, "error_class": e} for k, e in cells])
    assert not decide(_est(7.0), CAP, [died_in([("c", None), ("chat", "unhealthy")])]).skip
    assert decide(_est(7.0), CAP, [died_in([("chat", None), ("c", "oom")])]).skip
    assert decide(_est(7.0), CAP, [_trial(_est(6.0), "oom")]).skip      # no cell keys


def test_an_oom_bars_only_configs_with_its_own_cuda_graph_setting():
    history = [_trial(_est(6.0), "oom", graph=False)]
    assert decide(_est(7.0), CAP, history, graph=False).skip
    assert not decide(_est(7.0), CAP, history, graph=True).skip


def test_the_margin_rule_reads_the_calibrated_need_where_it_is_lower():
    hopeless = _est(12.0)                                    # 30 GiB on the estimate alone
    assert decide(hopeless, CAP, [], calibrated=hopeless.need).skip
    assert not decide(hopeless, CAP, [], calibrated=22 * GIB).skip   # measured forwards fit
    assert decide(hopeless, CAP, [], calibrated=40 * GIB).skip       # never above the estimate


def test_never_skip_at_or_below_a_healthy_need():
    history = [_trial(_est(6.0), "oom"), _trial(_est(7.0), "ok")]   # inconsistent evidence
    assert not decide(_est(7.0), CAP, history).skip
    assert not decide(_est(6.9), CAP, history).skip
    assert decide(_est(7.8), CAP, history).skip


def test_runtime_calibrated_from_idle_memory_per_graph_setting():
    est = _est(4.0)
    idle = 15 * GIB + 4 * GIB + int(3.5 * GIB)             # measured runtime: 3.5 GiB
    history = [_trial(est, "ok", idle=idle)]
    assert calibrated_runtime(history, False) == int(3.5 * GIB)
    assert calibrated_runtime(history, True) == int(4.0 * GIB)   # + the graph-pool prior
    assert calibrated_runtime([], False) == 2 * GIB


def test_a_server_that_allocates_its_pool_on_first_use_never_gets_a_negative_runtime():
    """transformers serve idled at the same memory whatever its pool: idle - weights - pool
    went negative and shrank with the pool; the overhead is then idle - weights."""
    idle = 15 * GIB + int(0.5 * GIB)
    history = [_trial(_est(pool), "ok", idle=idle) for pool in (2.0, 4.0)]
    assert calibrated_runtime(history, False) == int(0.5 * GIB)
    assert calibrated_runtime([_trial(_est(1.0), "ok", idle=14 * GIB)], False) == 0


def test_memory_constraint_is_graded_and_agrees_with_the_outcome():
    from tuner.trial.prescreen import memory_constraint
    assert memory_constraint(30 * GIB, CAP, "oom") == 0.25
    assert memory_constraint(20 * GIB, CAP, "oom") > 0            # the estimate was low: still > 0
    assert memory_constraint(20 * GIB, CAP, "ok") == -1 / 6
    assert memory_constraint(30 * GIB, CAP, "ok") < 0             # the estimate was high: still < 0
    assert memory_constraint(30 * GIB, CAP, "skipped") > 0


def test_a_config_the_servers_footprint_check_refuses_is_skipped_once_the_runtime_is_measured():
    import dataclasses
    from tuner.trial.kv_calibration import calibrate
    refused = dataclasses.replace(_est(4.0), checked=int(8.8 * GIB))   # 15 + 0.5 + 8.8 > 24
    passes = dataclasses.replace(_est(4.0), checked=int(8.0 * GIB))
    assert not decide(refused, CAP, []).skip                 # the runtime is still the prior
    idle = 15 * GIB + GIB // 2                               # a pool allocated on first use
    history = [_trial(_est(2.0), "ok", idle=idle)]
    assert decide(refused, CAP, history).skip
    assert "footprint check" in decide(refused, CAP, history).reason
    assert not decide(passes, CAP, history).skip
    # the refusal teaches nothing about the forward: no OOM bar, no forward scale from it
    history.append(_trial(refused, "oom", idle=idle))
    assert not decide(_est(4.5), CAP, history).skip
    assert calibrate(history, CAP) == calibrate(history[:1], CAP)
    oom = _trial(_est(4.0), "oom", idle=idle)                # an OOM the check does not explain
    assert calibrate([*history, oom], CAP) != calibrate(history, CAP)


def test_an_oom_proves_a_forward_scale_for_its_form_of_forward():
    """The OOM (pool 2, forward 6 GiB: 25 GiB of 24) proves its form's forward at least 5/6 of
    the estimate; a config with a smaller forward of that form but a larger pool cannot fit at
    that scale, which the need-plus-margin rule (a forward no smaller) does not see."""
    def est(pool: float, forward: float, form: str = "prefill of 2") -> Estimate:
        return _formed(pool, forward, form)
    oom = TrialRecord(number=0, state=TrialState.COMPLETE, values=(0.0,), constraints={},
                      params={"x": 1}, outcome="oom", memory=estimate_attr(est(2, 6), False),
                      cells=[{"cell": {"key": "c"}, "error_class": "oom"}])
    scales = proven([oom], CAP)
    assert abs(scales[("c", False, "prefill of 2")] - 5 / 6) < 1e-9
    assert decide(est(5, 3), CAP, [oom], proven=scales).skip       # 15 + 5 + 2 + 2.5 > 24
    assert not decide(est(4, 3), CAP, [oom], proven=scales).skip   # 23.5 GiB fits
    assert not decide(est(5, 3, "decode"), CAP, [oom], proven=scales).skip
    assert not decide(est(5, 3), CAP, [oom], graph=True, proven=scales).skip
    assert not decide(est(5, 3), CAP, [oom]).skip                  # the margin rule alone
    finished = TrialRecord(number=1, state=TrialState.COMPLETE, values=(0.0,), constraints={},
                           params={"x": 1}, outcome="oom", memory=estimate_attr(est(2, 6), False),
                           cells=[{"cell": {"key": "c"}, "error_class": ""}])
    assert proven([finished], CAP) == {}    # every cell held: the OOM came after them


def test_no_proven_scale_no_skip_by_that_rule():
    """Weights + pool + prior runtime just over the card, nothing proven: the rule has no
    evidence and stays silent (the prior margin decides)."""
    est = Estimate(weights=15 * GIB, pool=int(7.5 * GIB), runtime=2 * GIB, forward=GIB,
                   peak_cell="c", cell_forwards=(("c", GIB),), cell_forms=(("c", "decode"),))
    assert not decide(est, CAP, [], proven={}).skip       # 25.5 GiB: within the prior margin


def test_a_forward_measured_on_a_healthy_run_bars_a_config_of_its_form_that_cannot_fit():
    """A healthy run (pool 2, runtime 2.5 measured, forward estimated 4 GiB, measured 4.4 by
    its memory mark) measures its form's scale at 1.1; a config of that form with a larger
    pool and a smaller forward cannot fit at that scale, though its estimate is within the
    card, and no OOM has happened.  Another form or no mark: silent."""
    def est(pool: float, forward: float, form: str = "prefill of 1 beside 2 decodes") -> Estimate:
        return _formed(pool, forward, form, runtime=2.5)
    idle = int(19.5 * GIB)                           # weights + pool + 2.5 GiB of runtime
    run = TrialRecord(number=0, state=TrialState.COMPLETE, values=(1.0,), constraints={},
                      params={"x": 1}, outcome="ok", memory=estimate_attr(est(2, 4), False),
                      idle_bytes=idle,
                      cells=[{"cell": {"key": "c"}, "error_class": None,
                              "peak_bytes": idle + int(4.4 * GIB)}])
    scales = measured([run])
    assert abs(scales[("c", False, "prefill of 1 beside 2 decodes")] - 1.1) < 1e-6
    # 15 + 3 + 2.5 + 1.1 x 3.3 = 24.13 GiB > 24; the estimate says 23.8
    assert decide(est(3, 3.3), CAP, [run], measured=scales).skip
    assert "measured" in decide(est(3, 3.3), CAP, [run], measured=scales).reason
    assert not decide(est(3, 3.0), CAP, [run], measured=scales).skip      # 23.8 GiB fits
    assert not decide(est(3, 3.3, "prefill of 1 beside 3 decodes"), CAP, [run],
                      measured=scales).skip
    # a graph config needs a graph run of its form; the eager run's smaller scale then wins
    assert not decide(est(3, 3.3), CAP, [run], graph=True, measured=scales).skip
    far = TrialRecord(number=1, state=TrialState.COMPLETE, values=(1.0,), constraints={},
                      params={"x": 2}, outcome="ok", memory=estimate_attr(est(2, 4), True),
                      idle_bytes=idle, cells=[{"cell": {"key": "c"}, "error_class": None,
                                               "peak_bytes": idle + int(4.8 * GIB)}])
    both = measured([run, far])
    assert both[("c", True, "prefill of 1 beside 2 decodes")] == scales[
        ("c", False, "prefill of 1 beside 2 decodes")]
    assert measured([far])[("c", True, "prefill of 1 beside 2 decodes")] > 1.15
    assert not decide(est(3, 3.3), CAP, [run]).skip                       # without the marks
    unmarked = TrialRecord(number=0, state=TrialState.COMPLETE, values=(1.0,), constraints={},
                           params={"x": 1}, outcome="ok", memory=run.memory, idle_bytes=idle,
                           cells=[{"cell": {"key": "c"}, "error_class": None}])
    assert measured([unmarked]) == {}


def test_the_pipeline_hands_the_runs_of_a_configs_own_knobs_at_other_pools_as_siblings():
    root = Path(__file__).resolve().parents[2]
    model = load_model_info(root / "models" / "llama-3.1-8b")
    cells = (Cell(16, 256, 64, 16),)
    space = resolve_space(load_space(root / "search_spaces" / "infinilm.yaml"), model, CAP, cells)
    ctx = TrialContext(space=space, workload=Workload("t", 0, None, cells, (), {}),
                       model_dir=str(root / "models" / "llama-3.1-8b"), simulate="rtx4090")
    pipe = AdaptivePipeline(ctx, parse_objectives(["max output_throughput"]), model, CAP)
    knobs = {"block_size": 256, "enable_graph": True}

    def run(**params):
        return dataclasses.replace(_trial(_est(6.0), "ok"), params=params)
    same = run(**knobs, kv_cache_tokens=8192, kv_share=0.5)
    other = run(block_size=128, enable_graph=True, kv_cache_tokens=16384)
    assert pipe._siblings([same, other], {**knobs, "kv_cache_tokens": 16384}) == [same]
