"""Stress-first order and the screening verdict."""

from pathlib import Path

import optuna
from optuna.distributions import IntDistribution

from tuner.bench.records import Cell
from tuner.study.record import TrialRecord
from tuner.trial.memory_estimate import Knobs, estimate
from tuner.search.model import load_model_info
from tuner.search.objectives import parse_objectives
from tuner.trial.stages import MIN_FULL_TRIALS, screen_verdict, stress_order
from tuner.study.pareto import dominates

ROOT = Path(__file__).resolve().parents[2]
M8B = load_model_info(ROOT / "models" / "llama-3.1-8b")
OBJ = parse_objectives(["max output_throughput", "min p99_tpot_ms"])


def test_largest_prefill_with_company_runs_first():
    cells = [Cell(1, 256, 256, 4), Cell(1, 4096, 256, 4), Cell(4, 4096, 1024, 8), Cell(16, 32, 256, 16)]
    order = stress_order(cells, estimate(M8B, Knobs(kv_tokens=16384, block_size=256, prefill_cap=8), cells))
    assert order[0] == Cell(4, 4096, 1024, 8)
    assert order[-1] == Cell(1, 256, 256, 4)
    assert sorted(order, key=cells.index) == cells


def _full(tput: float, tpot: float, screen_tput: float, screen_tpot: float):
    return TrialRecord.of(optuna.trial.create_trial(
        params={"x": 1}, distributions={"x": IntDistribution(0, 2)}, values=[tput, tpot],
        constraints={"feasible": 0.0},
        user_attrs={"outcome": "ok", "stage": "full",
                    "metrics": {"output_throughput": tput, "p99_tpot_ms": tpot},
                    "screen_metrics": {"output_throughput": screen_tput, "p99_tpot_ms": screen_tpot}}))


def test_everything_goes_on_until_enough_full_runs():
    history = [_full(200, 30, 100, 25)] * (MIN_FULL_TRIALS - 1)
    assert screen_verdict({"output_throughput": 1, "p99_tpot_ms": 99}, history, OBJ, {}).go_on


def test_dominated_optimistic_values_stop_and_estimate_is_no_better():
    history = [_full(200, 30, 100, 25), _full(220, 28, 100, 24), _full(180, 40, 90, 30)]
    v = screen_verdict({"output_throughput": 50, "p99_tpot_ms": 30}, history, OBJ, {})
    assert not v.go_on and "Pareto" in v.reason
    assert v.estimate["output_throughput"] <= 50 * 2.2 and v.estimate["p99_tpot_ms"] >= 30
    assert screen_verdict({"output_throughput": 150, "p99_tpot_ms": 20}, history, OBJ, {}).go_on


def test_certain_slo_miss_stops():
    history = [_full(200, 30, 100, 25), _full(220, 28, 100, 24), _full(180, 40, 90, 30)]
    v = screen_verdict({"output_throughput": 150, "p99_tpot_ms": 60}, history, OBJ, {"p99_tpot_ms": 50})
    assert not v.go_on and "SLO" in v.reason and v.estimate["p99_tpot_ms"] > 50


def test_dominates():
    assert dominates([2, 1], [1, 1], OBJ) and not dominates([1, 1], [1, 1], OBJ)
    assert not dominates([2, 3], [1, 1], OBJ)
