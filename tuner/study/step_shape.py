"""What one step can hold, per cell of the matrix, under a config: two configs of one shape
differ only in caps and budgets that bind in no cell.

Why: a cap on the requests of a step above what the step can hold anyway does nothing.  A
decode cap of 17 or 47 beside a batch cap of 14 decodes 14 requests; a prefill budget of 6403
or 2561 tokens beside a prefill cap of 10 and 128-token prompts prefills 1280.  On the
Qwen2.5-7B / RTX 3090 scenario of benchmarks/search_efficiency.py (p99 TPOT <= 60 ms, round
33) the descent on the least miss (`tuner.study.miss_descent`) spent three of one 10-trial
study's ten runs on such moves, each measuring exactly the run it moved from, and the study
ended with nothing feasible where round 31's had found 729 tok/s.

The shape follows the admission rules `tuner.trial.memory_estimate.cell_forward` reads the
knobs by (roles, not names): a step prefills at most the requests a cell keeps in flight, the
batch and prefill caps, and, for requests the long-context guard calls long, its cap; it
decodes at most those in flight, the batch and decode caps and the guard's; its prompt tokens
are those requests' prompts, and where a token budget holds fewer, the budget and the prompts
it starts (as many as it holds, one more where the server chunks a prompt).  It errs towards
"different": the decode-first choice is part of the shape wherever it is set, the step's
decodes count against a token budget (as vLLM's do), a budget the server checks at start-up
(its forward is reserved, `checked_token_budget`) is always part of it, and so are the
budget and the guard for a cell drawn from a dataset or a trace, whose prompt lengths vary.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from tuner.bench.records import Cell
from tuner.search.space import BUDGET_ROLES, LIMIT_ROLES, SearchSpace
from tuner.study.record import config_key
from tuner.trial.memory_estimate import Knobs, knobs_from_params

SHAPE_ROLES = (*LIMIT_ROLES, *BUDGET_ROLES, "long_use_total_len",
               "decode_first")   # the knobs a shape reads


def held(cell: Cell) -> int:
    """The requests `cell` keeps in flight at once."""
    return min(cell.concurrency, cell.num_prompts or cell.concurrency)


def step_shape(space: SearchSpace, params: Mapping[str, Any],
               cells: Sequence[Cell]) -> Hashable:
    """The requests and prompt tokens one step of each of `cells` can hold under `params`,
    and the choices that decide which go first (see module doc)."""
    k = knobs_from_params(space, dict(params))
    return k.decode_first, tuple(_cell_shape(k, c) for c in cells)


def behaviour_key(space: SearchSpace, params: Mapping[str, Any], cells: Sequence[Cell],
                  kv_name: str) -> str:
    """One key for configs that differ only in their KV pool and in knobs of one shape: the
    knobs a shape does not read, and the shape."""
    reads = {p.name for p in space.parameters if p.role in SHAPE_ROLES} | {kv_name}
    rest = {k: v for k, v in params.items() if k not in reads}
    return config_key({**rest, " shape": repr(step_shape(space, params, cells))})


def _cell_shape(k: Knobs, cell: Cell) -> tuple[Any, ...]:
    n = held(cell)
    traced = cell.source is not None
    long = k.calls_long(cell)
    guard = (k.long_max_batch or math.inf) if long or traced else math.inf
    prefill = min(n, k.prefill_limit, guard)
    decode = min(n, k.decode_limit, guard)
    tokens: float = prefill * cell.input_len + n
    if k.token_budget is not None and (k.budget_checked or traced):
        tokens = k.token_budget
    elif k.token_budget is not None and tokens > k.token_budget:
        tokens = k.token_budget   # the prompts that start in one step, chunked or whole
        prefill = min(prefill, -(-int(k.token_budget) // max(cell.input_len, 1)))
    threshold = (k.long_threshold, k.long_use_total_len) if traced else long
    return prefill, decode, tokens, threshold
