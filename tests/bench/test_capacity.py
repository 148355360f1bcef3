"""Capacity search: the bracket logic, the early SLO verdict, and runs on the simulator."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tuner.bench.capacity import (
    CapacitySpec,
    LoadStep,
    SloWatch,
    find_capacity,
    is_saturated,
    parse_capacity,
)
from tuner.bench.records import Cell
from tuner.bench.sources import SharedPrefixSource
from tuner.errors import UsageError
from tuner.paths import REPO_ROOT
from tuner.search.space_file import load_space
from tuner.search.workload import parse_workload
from tuner.sim.api import open_engine
from tuner.sim.capacity_run import sim_capacity
from tuner.trial.context import TrialContext
from tuner.trial.inprocess import InProcessRunner

MODEL = str(REPO_ROOT / "models" / "llama-3.1-8b")


def fake(true_capacity: float):
    rates: list[float] = []

    def measure(rate: float) -> LoadStep:
        rates.append(rate)
        return LoadStep(rate, {}, rate <= true_capacity, False, False, 1.0, 10)

    return measure, rates


@pytest.mark.parametrize("truth", [0.3, 1.0, 3.7, 20.0])
def test_search_brackets_the_capacity_in_few_steps(truth):
    spec = CapacitySpec(min_rate=0.25, max_rate=32.0, resolution=0.05)
    measure, rates = fake(truth)
    res = find_capacity(measure, spec)
    assert res.capacity_rps <= truth < res.capacity_rps * 1.05 + 1e-9
    assert len(rates) <= 12 < len(spec.sweep_rates())  # the sweep needs ~100 steps


def test_search_edges():
    spec = CapacitySpec(min_rate=1.0, max_rate=8.0)
    assert find_capacity(fake(0.5)[0], spec).capacity_rps == 0.0
    res = find_capacity(fake(100.0)[0], spec)
    assert res.capacity_rps == 8.0 and res.at_bound


@pytest.mark.parametrize("n", [10, 57, 200, 1000])
def test_slo_watch_gives_up_only_when_p99_is_lost(n):
    """After `allowed + 1` violations, numpy's p99 exceeds the limit whatever the rest are."""
    watch = SloWatch(n, {"p99_ttft_ms": ("ttft", 99.0, 100.0)})
    allowed = watch.allowed[("ttft", 99.0)]
    for _ in range(allowed):
        watch.done({"ttft": 100.0001})
    assert not watch.lost()
    values = [100.0001] * allowed + [0.0] * (n - allowed)
    assert np.percentile(values, 99) <= 100.0  # the SLO is still attainable: no verdict yet
    assert watch.lost([150.0])  # one waiting past the limit is a violation already
    worst_case = [500.0] * (allowed + 1) + [0.0] * (n - allowed - 1)
    assert np.percentile(worst_case, 99) > 100.0


def test_saturation_is_a_ttft_trend():
    send = [i * 0.1 for i in range(40)]
    assert not is_saturated(send, [s + 0.05 for s in send])
    assert is_saturated(send, [s + 0.05 + 0.1 * i for i, s in enumerate(send)])


def test_capacity_section_is_checked():
    with pytest.raises(UsageError, match="capacity.rate: unknown key"):
        parse_capacity({"rate": 1}, "w.yaml", 1)
    with pytest.raises(UsageError, match="capacity.cell"):
        parse_capacity({"cell": 3}, "w.yaml", 1)
    with pytest.raises(UsageError, match="min_rate < max_rate"):
        parse_capacity({"min_rate": 4, "max_rate": 2}, "w.yaml", 1)


SHARED = SharedPrefixSource(groups=2, prefix_len=512, suffix_len=32, turns=2, output_len=32,
                            conversations=4)
ARGS = ["--num-blocks", "128", "--block-size", "64", "--max-batch-size", "16"]
SPEC = CapacitySpec(min_rate=0.5, max_rate=64, resolution=0.2, step_requests=48)
SLO = {"p99_ttft_ms": 500.0, "p99_tpot_ms": 60.0}


def test_sim_capacity_cuts_overloaded_steps_short():
    cell = Cell(64, 0, 32, 16, source=SHARED)
    res = sim_capacity(open_engine(MODEL, "rtx4090", ARGS, {}), cell, SPEC, SLO)
    assert 0.5 <= res.capacity_rps < 64
    failed = [s for s in res.steps if not s.passed]
    # overloaded steps are cut short; one just past the edge may fail on its final p99 only
    assert failed and all(s.cut_short for s in failed if s.rate > 1.5 * res.capacity_rps)
    assert all(s.sent < SPEC.step_requests for s in failed if s.rate > 2 * res.capacity_rps)
    passed = [s for s in res.steps if s.passed]
    assert all(s.metrics["p99_ttft_ms"] <= 500 and s.metrics["completed"] == 48 for s in passed)
    off = sim_capacity(open_engine(MODEL, "rtx4090", ARGS + ["--disable-prefix-caching"], {}),
                       cell, SPEC, SLO)
    assert off.capacity_rps < res.capacity_rps


def test_trial_reports_capacity_rps(tmp_path):
    w = parse_workload({"cells": [{"source": {"shared_prefix": {
        "groups": 2, "prefix_len": 512, "suffix_len": 32, "turns": 2, "output_len": 32,
        "conversations": 4}}, "concurrency": 64, "request_rate": 1}],
        "slo": SLO, "capacity": {"min_rate": 0.5, "max_rate": 64, "resolution": 0.2,
                                 "step_requests": 48}}, str(tmp_path / "w.yaml"))
    space = load_space(REPO_ROOT / "search_spaces" / "infinilm.yaml")
    ctx = TrialContext(space=space, workload=w, model_dir=MODEL, simulate="rtx4090")
    params = {"kv_cache_tokens": 8192, "block_size": 64, "max_batch_size": 16}
    res = InProcessRunner("rtx4090")(ctx, params, Path(tmp_path))
    assert res.outcome.kind == "ok"
    cap = res.capacity_search
    assert cap is not None
    assert res.metrics["capacity_rps"] == cap["capacity_rps"] > 0 and cap["steps"]
    assert math.isclose(res.sim_seconds or 0.0,
                        res.metrics["duration"] + cap["cost_s"], rel_tol=1e-3)


def test_a_queue_older_than_the_step_is_saturation_even_without_a_ttft_slo():
    watch = SloWatch(100, {"p99_tpot_ms": ("tpot", 99.0, 50.0)}, max_wait_ms=10_000)
    assert not watch.lost([9_000.0]) and not watch.saturated
    assert watch.lost([9_000.0, 10_500.0]) and watch.saturated
