"""The descent on the least miss, while no run has met the SLOs."""

from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from tuner.bench.records import Cell
from tuner.search.bounds import resolve_space
from tuner.search.model import load_model_info
from tuner.search.space_file import load_space
from tuner.study.miss_descent import (
    budget_tops,
    deferring,
    descent_moves,
    held_pool,
    packings,
    whole_budgets,
)
from tuner.study.record import KV_SHARE, TrialRecord
from tuner.trial.kv_share import KvEdge

SPACE = {"cap": IntDistribution(1, 128, log=True), "y": FloatDistribution(0.0, 1.0),
         "first": CategoricalDistribution([False, True])}
STEPS = ("cap", "first")   # what a step holds; y is not among them


def _run(number: int, params: dict, ttft: float, tpot: float,
         outcome: str = "slo", space: dict | None = None, value: float = 100.0) -> TrialRecord:
    """A healthy run; `ttft` and `tpot` are its values over their limits (1.0: at the limit)."""
    t = optuna.trial.create_trial(
        params=params, distributions={k: (space or SPACE)[k] for k in params}, values=[value],
        user_attrs={"outcome": outcome},
        constraints={"slo:median_ttft_ms": ttft - 1.0, "slo:p99_tpot_ms": tpot - 1.0})
    t.number = number
    return TrialRecord.of(t)


def test_the_choice_the_miss_goes_with_is_flipped_first_from_the_run_that_missed_least():
    """Decode-first on: TTFT fivefold over its limit; off: TPOT over its limit.  The run that
    missed least (2: TTFT 4x, the others 5x and 16x) has it on, and having it on ranks with a
    larger TTFT in every run, so the first move turns it off; cap ranks less closely."""
    runs = [_run(0, {"cap": 64, "y": 0.5, "first": False}, ttft=0.2, tpot=16.0),
            _run(1, {"cap": 128, "y": 0.1, "first": True}, ttft=5.0, tpot=0.5),
            _run(2, {"cap": 11, "y": 0.9, "first": True}, ttft=4.0, tpot=0.9)]
    moves = descent_moves(runs, SPACE, STEPS)
    assert moves[0] == {"cap": 11, "y": 0.9, "first": False}
    assert all(sum(m[k] != runs[2].params[k] for k in SPACE) == 1 for m in moves)


def test_a_number_moves_halfway_to_the_end_that_goes_with_a_smaller_miss():
    """The larger the cap, the larger the TTFT miss: the cap of the run that missed least (16)
    falls halfway to the bottom of its log range (4), and then, last, halfway to the top (45).
    y ranks with the miss as closely and is not moved: it is not among the knobs of what a step
    holds."""
    runs = [_run(i, {"cap": cap, "y": y, "first": False}, ttft=t, tpot=0.5)
            for i, (cap, y, t) in enumerate([(16, 0.4, 1.1), (64, 0.6, 1.5), (128, 0.9, 3.0)])]
    moves = descent_moves(runs, SPACE, STEPS)
    assert moves == [{"cap": 4, "y": 0.4, "first": False}, {"cap": 45, "y": 0.4, "first": False},
                     {"cap": 16, "y": 0.4, "first": True}]   # a choice's other way, last
    assert descent_moves(runs, SPACE, STEPS + ("y",))[1] == {"cap": 16, "y": 0.2, "first": False}


def test_a_number_whose_correlated_way_is_spent_moves_the_other_way():
    """Over these runs a larger cap goes with a smaller miss (the runs with small caps missed
    more for other reasons), and the run that missed least (by 1%) already has the cap at the
    top of its range: its correlated way is spent, so the cap moves halfway down (11), the
    move that met the SLO where a study lacked it (see module doc).  Decode-first off goes with
    a larger miss: no flip."""
    runs = [_run(0, {"cap": 128, "y": 0.5, "first": True}, ttft=1.01, tpot=0.5),
            _run(1, {"cap": 4, "y": 0.2, "first": False}, ttft=3.0, tpot=0.5),
            _run(2, {"cap": 16, "y": 0.8, "first": True}, ttft=2.0, tpot=0.5)]
    assert descent_moves(runs, SPACE, STEPS) == [{"cap": 11, "y": 0.5, "first": True},
                                                 {"cap": 128, "y": 0.5, "first": False}]


def test_a_number_the_runs_do_not_rank_moves_either_way():
    """Every run had cap 16, so its position ranks with nothing: both ways are offered, after
    the choice the miss goes with (decode-first on missed more)."""
    runs = [_run(0, {"cap": 16, "y": 0.5, "first": False}, ttft=1.1, tpot=0.5),
            _run(1, {"cap": 16, "y": 0.2, "first": True}, ttft=3.0, tpot=0.5),
            _run(2, {"cap": 16, "y": 0.8, "first": True}, ttft=2.0, tpot=0.5)]
    assert [{k: m[k] for k in ("cap", "first")} for m in descent_moves(runs, SPACE, STEPS)] == [
        {"cap": 45, "first": False}, {"cap": 4, "first": False}, {"cap": 16, "first": True}]


def test_nothing_to_descend_from_with_too_few_runs_or_no_miss_that_varies():
    runs = [_run(i, {"cap": 2 ** i, "y": 0.5, "first": False}, ttft=2.0, tpot=0.5)
            for i in range(3)]
    assert descent_moves(runs[:2], SPACE, STEPS) == []      # two runs rank nothing
    # every run missed alike, and cap was moved alone from run 0: the choice, either way
    assert descent_moves(runs, SPACE, STEPS) == [{"cap": 1, "y": 0.5, "first": True}]
    oom = _run(3, {"cap": 1, "y": 0.5, "first": True}, ttft=0.0, tpot=0.0, outcome="oom")
    assert descent_moves([*runs[:2], oom], SPACE, STEPS) == []   # only healthy runs count


def test_a_knob_is_moved_once_from_a_run_and_never_by_a_sliver():
    """Run 3 changed cap alone from run 0, the run that missed least, and missed as much: cap
    is measured there, the next move is the other knob.  A cap at 2 of [1, 128] would fall
    halfway to 1, a sliver of its range: not a move."""
    runs = [_run(0, {"cap": 64, "y": 0.5, "first": False}, ttft=1.1, tpot=0.5),
            _run(1, {"cap": 128, "y": 0.5, "first": True}, ttft=3.0, tpot=0.5),
            _run(2, {"cap": 100, "y": 0.5, "first": True}, ttft=2.0, tpot=0.5)]
    assert [m["cap"] for m in descent_moves(runs, SPACE, STEPS)][:1] == [8]
    again = [*runs, _run(3, {"cap": 8, "y": 0.5, "first": False}, ttft=1.1, tpot=0.5)]
    # first: False goes with the smaller miss: its other way only
    assert descent_moves(again, SPACE, STEPS) == [{"cap": 64, "y": 0.5, "first": True}]
    low = [_run(i, {"cap": cap, "y": 0.5, "first": False}, ttft=t, tpot=0.5)
           for i, (cap, t) in enumerate([(2, 1.1), (64, 1.5), (128, 3.0)])]
    assert descent_moves(low, SPACE, STEPS) == [{"cap": 2, "y": 0.5, "first": True}]


def test_decode_first_defers_only_where_the_guard_calls_a_cells_prompts_long():
    space = load_space(Path(__file__).resolve().parents[2] / "search_spaces" / "infinilm.yaml")
    cells = [Cell(32, 8000, 200, 64), Cell(128, 300, 300, 256)]
    on = {"decode_first_when_running": True, "long_context_threshold": 4096}
    assert deferring(space, cells, on) == ["decode_first_when_running"]
    assert deferring(space, cells, {**on, "long_context_threshold": 8192}) == []
    assert deferring(space, cells, {**on, "long_context_threshold": 8192,
                                    "long_context_use_total_len": True}) != []
    assert deferring(space, cells, {**on, "decode_first_when_running": False}) == []


def _infinilm_edge(model_name: str, cells: tuple[Cell, ...], gib: int) -> KvEdge:
    """The memory edge of the shipped InfiniLM space for a shipped model on a `gib` GiB card."""
    root = Path(__file__).resolve().parents[2]
    model = load_model_info(root / "models" / model_name)
    cap = gib * 2 ** 30
    space = resolve_space(load_space(root / "search_spaces" / "infinilm.yaml"), model, cap, cells)
    return KvEdge(space, model, cap, cells)


def test_a_move_that_holds_less_keeps_its_runs_pool_where_its_share_gains_a_sliver():
    """From the run that missed least, at its edge (KV share 1): fewer long prompts per step
    hold less in the 8k cell and the same elsewhere, so the model draws the move a larger edge;
    where that is within `EDGE_TOL` of the run's pool, the move runs at that pool, where the run
    fit.  A larger gain keeps the share, and so does a move that holds more (a larger token
    budget)."""
    edge = _infinilm_edge("mistral-7b", (Cell(8, 8000, 256, 16), Cell(64, 512, 256, 128)), 80)
    knobs = {"block_size": 16, "max_batch_size": 128, "enable_graph": False,
             "disable_prefix_caching": False, "max_num_batched_tokens": 16384,
             "prefill_batch_cap": 64, "decode_batch_cap": 128, "long_context_threshold": 4096,
             "long_context_max_batch": 8, "long_context_use_total_len": False,
             "decode_first_when_running": False, KV_SHARE: 1.0}
    dists = {k: CategoricalDistribution([v]) for k, v in knobs.items()}
    dists["kv_cache_tokens"] = IntDistribution(4096, 10 ** 7)
    search = {k: d for k, d in dists.items() if k != "kv_cache_tokens"}
    fewer = {**knobs, "long_context_max_batch": 1}
    drawn = edge.value({k: v for k, v in fewer.items() if k != KV_SHARE}, 1.0, [])

    def runs(pool: int) -> list[TrialRecord]:
        out = []
        for number, (tokens, ttft) in enumerate([(pool, 1.1), (pool // 2, 3.0),
                                                 (pool // 4, 5.0)]):
            t = optuna.trial.create_trial(
                params={**knobs, "kv_cache_tokens": tokens}, distributions=dists,
                values=[100.0], user_attrs={"outcome": "slo"},
                constraints={"slo:median_ttft_ms": ttft - 1.0})
            t.number = number
            out.append(TrialRecord.of(t))
        return out
    near = drawn * 99 // 100 // 16 * 16        # 1% under the move's edge, in whole blocks
    assert held_pool(fewer, runs(near), search, edge) == near
    assert held_pool(fewer, runs(drawn * 9 // 10), search, edge) is None   # 11% to gain
    assert held_pool({**knobs, "max_num_batched_tokens": 32768}, runs(near), search,
                     edge) is None
    assert held_pool(fewer, runs(near), search, None) is None
    assert held_pool(fewer, runs(near)[:2], search, edge) is None   # too few runs to descend from


GRAPHS = {**SPACE, "graphs": CategoricalDistribution([False, True])}


def _graph_run(number: int, cap: int, graphs: bool, ttft: float, tpot: float) -> TrialRecord:
    params = {"cap": cap, "y": number / 10, "first": False, "graphs": graphs}
    return _run(number, params, ttft, tpot, space=GRAPHS)


def test_a_per_token_miss_turns_the_faster_decode_step_on_before_any_number_moves_its_other_way():
    """Every run missed p99 TPOT; graphs on went with the larger misses (they came with small
    caps), so the correlation alone never turns them on.  A per-token miss is made of decode
    steps, and graphs make a step faster: turned on, they rank after the correlated cap move
    and ahead of the cap's other way (see module doc)."""
    runs = [_graph_run(0, 16, False, ttft=0.5, tpot=1.02),
            _graph_run(1, 4, True, ttft=0.5, tpot=3.0),
            _graph_run(2, 64, False, ttft=0.5, tpot=1.5)]
    moves = descent_moves(runs, GRAPHS, STEPS, fast=("graphs",))
    base = {"cap": 16, "y": 0.0, "first": False, "graphs": False}
    assert moves == [{**base, "cap": 45}, {**base, "graphs": True}, {**base, "cap": 4},
                     {**base, "first": True}]
    assert descent_moves(runs, GRAPHS, STEPS) == [{**base, "cap": 45}, {**base, "cap": 4},
                                                  {**base, "first": True}]


def test_a_waiting_time_miss_turns_the_faster_decode_step_on_in_the_same_rank():
    """The run that missed least missed the TTFT SLO most: a request waiting for KV blocks
    waits for running ones to decode, so graphs go on there too, after the correlated cap move
    and ahead of the cap's other way (see module doc)."""
    runs = [_graph_run(0, 16, False, ttft=1.02, tpot=0.5),
            _graph_run(1, 4, True, ttft=3.0, tpot=0.5),
            _graph_run(2, 64, False, ttft=1.5, tpot=0.5)]
    base = {"cap": 16, "y": 0.0, "first": False, "graphs": False}
    assert descent_moves(runs, GRAPHS, STEPS, fast=("graphs",)) == \
        [{**base, "cap": 45}, {**base, "graphs": True}, {**base, "cap": 4},
         {**base, "first": True}]


BLOCKS = {**GRAPHS, "block": CategoricalDistribution([16, 64, 256])}


def _block_run(number: int, cap: int, graphs: bool, block: int, ttft: float,
               tpot: float) -> TrialRecord:
    """A healthy run of the BLOCKS space; `ttft` and `tpot` over their limits."""
    params = {"cap": cap, "y": number / 10, "first": False, "graphs": graphs, "block": block}
    return _run(number, params, ttft, tpot, space=BLOCKS)


def test_a_waiting_time_miss_moves_to_the_smallest_block_after_the_other_ways():
    """The run that missed least missed the TTFT SLO most at block 256: a request waiting for
    KV blocks waits for a pool the rounding up to whole blocks wastes, so the smallest block is
    proposed though no run ranks it (none had it): after graphs on and after the cap's other
    way, which a long-context cap's other way cured on the Mistral median-TTFT scenario (see
    module doc)."""
    runs = [_block_run(0, 16, False, 256, ttft=1.02, tpot=0.5),
            _block_run(1, 4, True, 64, ttft=3.0, tpot=0.5),
            _block_run(2, 64, False, 256, ttft=1.5, tpot=0.5)]
    base = {"cap": 16, "y": 0.0, "first": False, "graphs": False, "block": 256}
    assert descent_moves(runs, BLOCKS, STEPS, fast=("graphs",), packs={"block": 16}) == \
        [{**base, "cap": 45}, {**base, "graphs": True}, {**base, "cap": 4},
         {**base, "first": True}, {**base, "block": 16}]
    assert descent_moves(runs, BLOCKS, STEPS, fast=("graphs",)) == \
        [{**base, "cap": 45}, {**base, "graphs": True}, {**base, "cap": 4},
         {**base, "first": True}]


def test_a_per_token_miss_keeps_its_block():
    """The same runs missing p99 TPOT instead: a pool that wastes less holds more requests,
    whose decode steps are slower, so the smallest block is not proposed; graphs still go on
    (see module doc)."""
    runs = [_block_run(0, 16, False, 256, ttft=0.5, tpot=1.02),
            _block_run(1, 4, True, 64, ttft=0.5, tpot=3.0),
            _block_run(2, 64, False, 256, ttft=0.5, tpot=1.5)]
    base = {"cap": 16, "y": 0.0, "first": False, "graphs": False, "block": 256}
    assert descent_moves(runs, BLOCKS, STEPS, fast=("graphs",), packs={"block": 16}) == \
        [{**base, "cap": 45}, {**base, "graphs": True}, {**base, "cap": 4},
         {**base, "first": True}]


def test_the_packing_knobs_of_the_shipped_spaces_go_to_their_smallest_block():
    """Each shipped space's block-size choice, at the block that wastes least of a pool."""
    root = Path(__file__).resolve().parents[2] / "search_spaces"
    assert packings(load_space(root / "infinilm.yaml")) == {"block_size": 16}
    assert packings(load_space(root / "transformers.yaml")) == {"cb_block_size": 32}


def test_smaller_blocks_that_went_with_smaller_misses_rank_by_their_correlation():
    """Where the runs in 16-token blocks missed the TTFT SLO less than those in 256-token ones,
    the block move ranks by that correlation: after the cap's correlated move down, ahead of
    its other way (see module doc)."""
    runs = [_block_run(0, 16, True, 256, ttft=1.01, tpot=0.5),
            _block_run(1, 4, True, 16, ttft=1.02, tpot=0.5),
            _block_run(2, 64, True, 256, ttft=1.5, tpot=0.5),
            _block_run(3, 8, True, 16, ttft=1.03, tpot=0.5),
            _block_run(4, 32, True, 256, ttft=2.0, tpot=0.5)]
    base = {"cap": 16, "y": 0.0, "first": False, "graphs": True, "block": 256}
    assert descent_moves(runs, BLOCKS, STEPS, fast=("graphs",), packs={"block": 16}) == \
        [{**base, "cap": 4}, {**base, "block": 16}, {**base, "cap": 45},
         {**base, "first": True}]


BUDGETS = {**SPACE, "budget": IntDistribution(1024, 32768, log=True)}


def _budget_run(number: int, cap: int, budget: int, ttft: float, tpot: float,
                value: float = 100.0) -> TrialRecord:
    """A healthy run of the BUDGETS space; `ttft` and `tpot` over their limits."""
    return _run(number, {"cap": cap, "y": number / 10, "first": False, "budget": budget}, ttft,
                tpot, space=BUDGETS, value=value)


def test_a_per_token_miss_opens_a_whole_prompt_budget_before_any_number_moves_its_other_way():
    """Every run missed p99 TPOT, the larger budgets with the larger misses (they came with
    large caps).  Where a step prefills whole prompts or decodes, a budget at its top stalls
    the decodes fewest times: it ranks like the faster step, after the correlated cap move and
    ahead of every number's other way (see module doc; the budget's way down, to 1448, is too
    small a move); a waiting-time miss does not get it, nor a space without such a budget."""
    runs = [_budget_run(0, 16, 2048, ttft=0.5, tpot=1.02),
            _budget_run(1, 64, 8192, ttft=0.5, tpot=3.0),
            _budget_run(2, 32, 4096, ttft=0.5, tpot=1.5)]
    base = {"cap": 16, "y": 0.0, "first": False, "budget": 2048}
    steps = (*STEPS, "budget")
    moves = descent_moves(runs, BUDGETS, steps, tops=lambda p: ["budget"])
    assert moves == [{**base, "cap": 4}, {**base, "budget": 32768}, {**base, "budget": 8192},
                     {**base, "cap": 45}, {**base, "first": True}]
    assert descent_moves(runs, BUDGETS, steps) == [m for i, m in enumerate(moves) if i != 1]
    alone = _run(3, {**base, "budget": 8192}, ttft=0.5, tpot=1.04, space=BUDGETS)
    assert {**base, "budget": 32768} in descent_moves([*runs, alone], BUDGETS, steps,
                                                      tops=lambda p: ["budget"])   # not its top
    waiting = [_budget_run(r.number, r.params["cap"], r.params["budget"], ttft=1.0 + (
        r.constraints["slo:p99_tpot_ms"]), tpot=0.5) for r in runs]
    assert {**base, "budget": 32768} not in descent_moves(waiting, BUDGETS, steps,
                                                         tops=lambda p: ["budget"])


def test_only_a_server_whose_steps_prefill_whole_prompts_has_such_budgets():
    root = Path(__file__).resolve().parents[2] / "search_spaces"
    assert whole_budgets(load_space(root / "infinilm.yaml")) == ["max_num_batched_tokens"]
    for name in ("vllm", "sglang", "transformers"):
        assert whole_budgets(load_space(root / f"{name}.yaml")) == []


def test_a_budget_top_is_offered_where_it_starts_more_prompts_until_the_study_refutes_it():
    """On InfiniLM (whole prompts): a 4k budget starts one 3k prompt a step and its top ten,
    so the top is offered; where the long-context guard holds the 3k prompts one a step
    (threshold 2048, one long request a step), the top starts no more and is not.  Once a run
    at the top missed p99 TPOT no less than the same knobs at 4k, nothing is offered."""
    edge = _infinilm_edge("llama-3.2-3b", (Cell(16, 3000, 256, 32), Cell(8, 300, 256, 16)),
                          48)   # 4k holds eight chats
    knobs = {"block_size": 16, "max_batch_size": 128, "enable_graph": True,
             "disable_prefix_caching": False, "max_num_batched_tokens": 4096,
             "prefill_batch_cap": 64, "decode_batch_cap": 128, "long_context_threshold": 4096,
             "long_context_max_batch": 1, "long_context_use_total_len": False,
             "decode_first_when_running": False}
    dists = {p.name: p.distribution() for p in edge.space.parameters
             if p.name != "kv_cache_tokens"}
    assert budget_tops([], dists, edge)(knobs) == ["max_num_batched_tokens"]
    assert budget_tops([], dists, edge)({**knobs, "long_context_threshold": 2048}) == []
    assert budget_tops([], dists, None)(knobs) == []

    def run(number: int, budget: int, tpot: float) -> TrialRecord:
        t = optuna.trial.create_trial(
            params={**knobs, "max_num_batched_tokens": budget, "kv_cache_tokens": 50000},
            distributions={**dists, "kv_cache_tokens": IntDistribution(4096, 10 ** 7)},
            values=[100.0], user_attrs={"outcome": "slo"},
            constraints={"slo:p99_tpot_ms": tpot - 1.0})
        t.number = number
        return TrialRecord.of(t)
    top = int(dists["max_num_batched_tokens"].high)
    helped = [run(0, 4096, 1.3), run(1, top, 1.1)]
    assert budget_tops(helped, dists, edge)(knobs) == ["max_num_batched_tokens"]
    failed = [run(0, 4096, 1.3), run(1, top, 1.3)]
    assert budget_tops(failed, dists, edge)(knobs) == []
