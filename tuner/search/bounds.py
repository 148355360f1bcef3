"""Bounds that adapt to the model and the GPU: `high: auto` for the KV-pool knob, and a top
clipped to the model's context length where the server refuses more (`within_context`).

Why: a fixed num-blocks range is wrong on every card but one.  On a 24 GB card an 8B model
leaves ~5 GiB for the KV pool; on a 141 GB card it leaves ~120 GiB.  The same space file must
make sense on both, so the pool's upper bound is what memory holds beside the weights and the
runtime prior (an optimistic figure: the pre-screen and the sampler's constraint model trim the
rest; a bound that cuts off feasible configs could never be undone by learning).  The lower
bound of a token-sized pool is raised to the workload's largest request: a pool that cannot hold
one request serves nothing.  The request as the server counts it: with room for a chat template
(`TEMPLATE_TOKENS`), and in whole blocks of the largest block size, since the server turns the
tokens into whole blocks (rounding down).  Without that, the smallest pool of the 32k-prompt
benchmark scenario refused its longest request (32768 + 256 tokens asked, 36 more for
Llama-3.1's template, one block short) and served only the shorter ones.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from tuner.bench.records import Cell
from tuner.errors import UsageError
from tuner.search.model import ModelInfo
from tuner.search.space import Param, SearchSpace
from tuner.trial.memory_estimate import runtime_prior

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}
TEMPLATE_TOKENS = 64    # a chat template's tokens around the prompt (Llama-3.1's: 36)


def parse_size(text: str) -> int:
    """'24GiB', '24G', '80GB', '24576MiB' -> bytes.  GB means GiB here: cards are sold in
    binary gigabytes (a '24 GB' 4090 has 24564 MiB), so '24GB' must not mean 22.4 GiB."""
    m = _SIZE_RE.match(text)
    if not m or (not m.group(2) and not m.group(4)):
        raise UsageError(f"not a memory size: {text!r} (write a size like 24GiB, 80G or 24576MiB)")
    return int(float(m.group(1)) * 1024 ** _UNITS[m.group(2).lower()])


def kv_room_bytes(model: ModelInfo, capacity: int, cuda_graph_possible: bool = False) -> int:
    """What the KV pool may take at most: capacity - weights - runtime prior (no graphs: the
    optimistic case, so that no feasible pool lies above the bound)."""
    return capacity - model.weight_bytes - runtime_prior(cuda_graph_possible)


def _largest_request(cells: Sequence[Cell]) -> int:
    return max((c.input_len + c.output_len for c in cells), default=0)


def smallest_pool(cells: Sequence[Cell]) -> int:
    """Tokens that hold the workload's largest request with its chat template; 0 without
    cells."""
    largest = _largest_request(cells)
    return largest + TEMPLATE_TOKENS if largest else 0


def _smallest_pool(cells: Sequence[Cell], space: SearchSpace) -> int:
    """`smallest_pool` in whole blocks of any of the space's block sizes."""
    block = max(int(b) for b in _block_sizes(space))
    return -(-smallest_pool(cells) // block) * block


def _resolve(p: Param, space: SearchSpace, model: ModelInfo, capacity: int,
             cells: tuple[Cell, ...] | list[Cell]) -> Param:
    room = kv_room_bytes(model, capacity)
    if p.role == "kv_tokens":
        high = room // model.kv_bytes_per_token
        low = max(int(p.low or 0), _smallest_pool(cells, space))
    elif p.role == "kv_blocks":
        sizes = [int(c) for c in _block_sizes(space)]
        high = room // (model.kv_bytes_per_token * min(sizes))
        low = int(p.low or 0)
    else:
        raise UsageError(f"{space.path}: parameters.{p.name}: 'high: auto' needs role "
                         "kv_tokens or kv_blocks (the bound comes from GPU memory)")
    if p.step and p.step > 1:
        high = low + (high - low) // int(p.step) * int(p.step)
    if high < low:
        raise UsageError(
            f"{space.path}: parameters.{p.name}: the GPU ({capacity / 2**30:.1f} GiB) leaves room "
            f"for {max(high, 0)} after the weights ({model.weight_bytes / 2**30:.1f} GiB), below "
            f"the lower bound {low} (the workload's largest request needs "
            f"{_largest_request(cells)} tokens and a chat template); use a larger GPU or a "
            "smaller model")
    return dataclasses.replace(p, low=low, high=int(high))


def _block_sizes(space: SearchSpace) -> list[int]:
    for p in space.parameters:
        if p.role == "block_size":
            return list(p.choices) if p.type == "categorical" else [int(p.low or 1)]
    return [1]


def _within_context(p: Param, space: SearchSpace, model: ModelInfo) -> Param:
    """`within_context: true`: the top clipped to the model's context length.  InfiniLM asserts
    1024 <= INFINILM_MAX_NUM_BATCHED_TOKENS <= max_position_embeddings at start-up, so on a
    model with an 8k context every budget over 8k is a failed launch."""
    limit = model.max_position_embeddings
    if p.low is not None and p.low > limit:
        raise UsageError(f"{space.path}: parameters.{p.name}: the lower bound {p.low:g} is over "
                         f"the model's context length ({limit}), which the server refuses")
    if p.high is None or p.high <= limit:
        return p
    return dataclasses.replace(p, high=limit)


def resolve_space(space: SearchSpace, model: ModelInfo, capacity: int | None,
                  cells: tuple[Cell, ...] | list[Cell]) -> SearchSpace:
    """The space with every `high: auto` bound computed and every `within_context` top
    clipped to the model; unchanged when there is neither."""
    if not any(p.high_auto or p.within_context for p in space.parameters):
        return space
    params = tuple(_within_context(p, space, model) if p.within_context else p
                   for p in space.parameters)
    if any(p.high_auto for p in params):
        if capacity is None:
            raise UsageError(f"{space.path}: 'high: auto' needs the GPU's memory: run on a "
                             "GPU that NVML sees, use --simulate GPU, or give --gpu-memory "
                             "(e.g. 24GiB)")
        params = tuple(_resolve(p, space, model, capacity, cells) if p.high_auto else p
                       for p in params)
    return dataclasses.replace(space, parameters=params)


def resolved_bounds(space: SearchSpace) -> dict[str, list[float]]:
    """{name: [low, high]} of the auto-bounded knobs, stored with the study for the record."""
    return {p.name: list(p.bounds) for p in space.parameters if p.high_auto}
