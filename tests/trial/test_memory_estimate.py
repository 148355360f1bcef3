"""Memory estimate and adaptive bounds: arithmetic from config.json, bounds that follow the card."""

import dataclasses
from pathlib import Path

import pytest

from tuner.bench.records import Cell
from tuner.search.bounds import TEMPLATE_TOKENS, parse_size, resolve_space
from tuner.errors import UsageError
from tuner.trial.memory_estimate import (
    Knobs,
    act_bytes_per_token,
    cell_forward,
    checked_bytes,
    estimate,
    knobs_from_params,
)
from tuner.search.model import load_model_info
from tuner.search.space_file import load_space
from tuner.sim import simulate

ROOT = Path(__file__).resolve().parents[2]
M8B = load_model_info(ROOT / "models" / "llama-3.1-8b")
SPACE = load_space(ROOT / "search_spaces" / "infinilm.yaml")
CELLS = (Cell(4, 4096, 1024, 8), Cell(64, 256, 256, 64))
GIB = 2 ** 30


def test_kv_and_weights_arithmetic_for_llama_8b():
    assert M8B.kv_bytes_per_token == 128 * 1024
    assert 14.5 * GIB < M8B.weight_bytes < 15.5 * GIB
    # fp32 logits dominate: 128256 x 4 bytes = 0.49 MiB of ~0.6 MiB per token
    assert 0.55 * 2 ** 20 < act_bytes_per_token(M8B) < 0.7 * 2 ** 20


def test_tokens_knob_rounds_down_to_whole_blocks():
    k = knobs_from_params(SPACE, {"kv_cache_tokens": 16500, "block_size": 256})
    assert k.kv_tokens == 16384 and k.block_size == 256


def test_need_grows_with_pool_and_guard_shrinks_long_prefill():
    small = estimate(M8B, Knobs(kv_tokens=8192, block_size=256), CELLS)
    big = estimate(M8B, Knobs(kv_tokens=32768, block_size=256), CELLS)
    assert big.need > small.need and big.pool == 32768 * 128 * 1024
    free = Knobs(kv_tokens=16384, block_size=256, prefill_cap=8)
    guarded = Knobs(kv_tokens=16384, block_size=256, prefill_cap=8, long_threshold=4096,
                    long_max_batch=1, decode_first=True)
    assert cell_forward(M8B, guarded, CELLS[0])[0] < cell_forward(M8B, free, CELLS[0])[0]


@pytest.mark.parametrize("budget, footprint", [(16223, 10939916498), (54447, 36322154642),
                                               (32645, 20832124450)])
def test_a_checked_budget_costs_its_whole_forward(budget, footprint):
    """transformers serve refused these budgets on the H200 (benchmarks/results/
    h200-transformers-8b-r9) with the footprint given, whatever the batch held: the estimate
    of the full budget is within 10% of it, where the workload's own batches are far below."""
    space = load_space(ROOT / "search_spaces" / "transformers.yaml")
    cells = (Cell(32, 2048, 32, 32), Cell(16, 512, 64, 16), Cell(1, 128, 32, 2))
    params = {"cb_num_blocks": 187, "cb_block_size": 64, "cb_max_batch_tokens": budget,
              "max_requests_per_batch": 64}
    checked = knobs_from_params(space, params)
    assert checked.budget_checked and checked.token_budget == budget
    forward = max(cell_forward(M8B, checked, c)[0] for c in cells)
    assert abs(forward / footprint - 1) < 0.1
    capped_only = dataclasses.replace(checked, budget_checked=False)
    assert max(cell_forward(M8B, capped_only, c)[0] for c in cells) < 0.7 * footprint
    assert not knobs_from_params(SPACE, {"max_num_batched_tokens": budget}).budget_checked


def test_decode_first_runs_one_long_prefill_batch_as_the_simulator_does():
    """With decode-first a long prefill waits while anything decodes, so the requests of one
    prefill batch are all that run: the estimate (its worst case, so never below) stays within
    25% of the simulated server's transient peak, where counting every admitted request as
    running put it at 14x."""
    model_dir = ROOT / "models" / "mistral-7b"
    model = load_model_info(model_dir)
    cell = Cell(32, 2048, 256, 64)
    params = {"kv_cache_tokens": 81920, "block_size": 256, "max_batch_size": 36,
              "prefill_batch_cap": 13, "decode_batch_cap": 23, "max_num_batched_tokens": 16384,
              "long_context_threshold": 2048, "long_context_max_batch": 4,
              "decode_first_when_running": True}
    knobs = knobs_from_params(SPACE, params)
    forward, form = cell_forward(model, knobs, cell)
    assert form == "prefill of 4"
    argv, env = SPACE.render(params, model=str(model_dir), host="127.0.0.1", port=0,
                             max_output_len=cell.output_len, simulate="a100-80g",
                             extra_placeholders={"time_scale": "1"})
    sim = simulate(str(model_dir), "a100-80g", argv, env, [cell])[0]
    assert sim.error_class is None
    assert 0.8 * forward <= sim.peak_bytes - sim.idle_bytes <= 1.25 * forward


def test_pool_too_small_for_one_request_means_no_forward():
    assert cell_forward(M8B, Knobs(kv_tokens=1024, block_size=256), CELLS[0])[0] == 0


def test_auto_bound_follows_the_card():
    small = resolve_space(SPACE, M8B, parse_size("24GiB"), CELLS).param("kv_cache_tokens")
    large = resolve_space(SPACE, M8B, parse_size("141GiB"), CELLS).param("kv_cache_tokens")
    assert 40_000 < small.high < 70_000            # ~6-7 GiB of room beside 15 GiB of weights
    assert large.high > 15 * small.high
    # the workload's largest request with a chat template, in whole blocks of any size
    assert small.low % 256 == 0 and small.low - 256 < 4096 + 1024 + TEMPLATE_TOKENS <= small.low


def test_the_smallest_pool_serves_the_longest_request_at_every_block_size():
    """On the simulator, which counts Llama-3.1's chat template (36 tokens) in the prompt: at
    the range's lower bound the longest cell runs, at one block less it is refused."""
    from tuner.search.workload import Workload
    from tuner.trial.context import TrialContext
    from tuner.trial.inprocess import InProcessRunner
    cells = (Cell(1, 4096, 1024, 1),)
    space = resolve_space(SPACE, M8B, parse_size("24GiB"), cells)
    low = int(space.param("kv_cache_tokens").low)
    ctx = TrialContext(space=space, workload=Workload("w", 0, None, cells,
                                                      ("max output_throughput",), {}),
                       model_dir=str(ROOT / "models" / "llama-3.1-8b"), simulate="rtx4090")
    run = InProcessRunner("rtx4090")
    for block in (16, 256):
        served = run(ctx, {"kv_cache_tokens": low, "block_size": block}, Path("/nonexistent"))
        assert served.outcome.kind == "ok", (block, served.outcome)
    short = run(ctx, {"kv_cache_tokens": 4096 + 1024, "block_size": 256}, Path("/nonexistent"))
    assert short.outcome.kind == "rejected"


def test_auto_bound_needs_memory_and_room():
    with pytest.raises(UsageError, match="gpu-memory"):
        resolve_space(SPACE, M8B, None, CELLS)
    m70 = load_model_info(ROOT / "models" / "llama-3.1-70b")
    with pytest.raises(UsageError, match="leaves room"):
        resolve_space(SPACE, m70, parse_size("24GiB"), CELLS)


@pytest.mark.parametrize("text, gib", [("24GiB", 24), ("24G", 24), ("80GB", 80), ("0.5g", 0.5),
                                       ("24576MiB", 24)])
def test_parse_size(text, gib):
    assert parse_size(text) == int(gib * GIB)


def test_parse_size_rejects_bare_numbers():
    with pytest.raises(UsageError):
        parse_size("24")


@pytest.mark.parametrize("blocks, size, budget, share, footprint", [
    (146, 256, 837, 0.58, 5399512610), (245, 128, 1833, 0.51, 5187831250),
    (187, 64, 16223, 0.75, 10939916498), (262, 32, 54447, 0.69, 36322154642),
    (67, 128, 32645, 0.9, 20832124450), (95, 256, 5096, 0.66, 6144034816)])
def test_a_cache_memory_share_asks_for_the_servers_own_footprint_over_the_share(
        blocks, size, budget, share, footprint):
    """transformers serve printed these footprints when it refused them on the H200
    (benchmarks/results/h200-transformers-8b-seedwl-r14, -r9 and -r9/budgetcheck: every
    refusal those studies saw): the check's arithmetic is the server's, to 0.01%, and the need is at least weights + runtime + footprint / share."""
    space = load_space(ROOT / "search_spaces" / "transformers.yaml")
    params = {"cb_num_blocks": blocks, "cb_block_size": size, "cb_max_batch_tokens": budget,
              "cb_max_memory_percent": share, "max_requests_per_batch": 64}
    knobs = knobs_from_params(space, params)
    assert knobs.memory_share == share
    assert abs(checked_bytes(M8B, knobs) * share / footprint - 1) < 1e-4
    est = estimate(M8B, knobs, (Cell(4, 4096, 32, 8),), runtime=GIB // 2)
    assert est.check_need == M8B.weight_bytes + GIB // 2 + checked_bytes(M8B, knobs)
    assert est.need >= est.check_need and est.need >= est.static + est.runtime + est.forward
    unset = {k: v for k, v in params.items() if k != "cb_max_batch_tokens"}
    assert checked_bytes(M8B, knobs_from_params(space, unset)) == 0   # the server sizes it
    assert checked_bytes(M8B, knobs_from_params(SPACE, {"kv_cache_tokens": 16384})) == 0
