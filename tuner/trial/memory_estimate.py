"""Estimate a config's peak GPU memory for a workload, from the model's shapes and public facts.

Why: an OOM found late costs a server start plus every cell run before it.  A config whose
memory need is hopeless can be told to the sampler as infeasible without a launch
(`tuner.trial.prescreen`).  This estimate never calls the simulator's memory model: on a real
GPU there
is none.  It is deliberately simple and errs low; `tuner.trial.prescreen` calibrates it online from
the study's own OOMs and healthy runs (and from the measured idle memory when one is known).

    need = weights + KV pool + runtime overhead + largest forward of the workload
    forward = activations per token x tokens in the forward
            + LIVE_CONTEXT_COPY x KV bytes of the sequences live during that forward

* weights: parameter count x dtype bytes (`ModelInfo.weight_bytes`).
* KV pool: tokens x 2 x layers x kv_heads x head_dim x dtype bytes.
* runtime overhead: CUDA context (~0.5 GiB), cuBLAS / attention workspaces and allocator slack.
  Real servers idle 2-4 GiB above weights + pool; the prior takes the low end (2 GiB, plus
  0.5 GiB for a CUDA-graph pool) so that an uncalibrated estimate skips too little, not too much;
  the first trial, which must run, is sized with the high end (`RUNTIME_HIGH_BYTES`).
* activations per token: full-vocabulary fp32 logits (`vocab x 4` bytes: servers compute logits
  for every prefill token), the gated MLP's three intermediate-sized tensors and a handful of
  hidden-sized ones (q, attention output, norms, residual).
* a checked token budget (role `checked_token_budget`): a server that checks the footprint of a
  full budget's forward against free memory before it runs a batch refuses any batch once that
  footprint does not fit, however few tokens the workload sends.  transformers serve 5.17 does
  (`Memory footprint ... is more than available memory`): on the H200 record
  benchmarks/results/h200-transformers-8b-r9 its three OOMs were budgets of 16223, 54447 and
  32645 tokens whose footprints it put at 10.9, 36.3 and 20.8 GB, within 4% of budget x the
  activations per token below, while the workload's own batches needed under 5 GiB.  So the
  forward is at least the whole budget's.
* a cache memory share (role `cache_memory_share`): a server that sizes or checks its cache
  against a share of the memory free once it is loaded refuses, at its first request, a pool and
  budget whose footprint exceeds that share, however much of the card is left.  transformers
  serve 5.17 does (`cb_max_memory_percent`; continuous_batching/cache.py, `_check_footprint`:
  footprint = pool + budget x (hidden + fp32 logits) + budget x (pool tokens + budget) for the
  attention mask, against share x (total - used)).  On the H200 record
  benchmarks/results/h200-transformers-8b-seedwl-r14 both OOMs were that refusal, at shares
  0.58 and 0.51 with pools of 4.9 and 4.1 GB where a 4.3 GB pool ran at 0.89: the server
  printed footprints of 5399512610 and 5187831250 bytes, the formula gives both to 0.01%.  So
  the need is at least weights + runtime + footprint / share (`Estimate.checked`); the check
  needs no calibration (it is the server's own arithmetic), only the runtime (idle - weights).
* live context: paged-attention kernels that gather each live sequence's K/V into contiguous
  buffers leave up to one copy of the live context in the caching allocator.  One copy is the
  upper bound we assume; calibration absorbs the difference.

The knobs are read by *role* (`role:` in the search-space YAML), so the estimate works for any
server whose space declares them; a role the space lacks means "no limit" (largest forward).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from tuner.bench.records import Cell
from tuner.search.model import ModelInfo
from tuner.search.space import SearchSpace, blocks_to_tokens, tokens_to_blocks

GIB = 1 << 30
RUNTIME_PRIOR_BYTES = 2 * GIB
RUNTIME_HIGH_BYTES = 4 * GIB    # the high end of what servers idle above weights + pool
GRAPH_POOL_PRIOR_BYTES = GIB // 2
LIVE_CONTEXT_COPY = 1.0
MLP_TENSORS = 3
HIDDEN_TENSORS = 6
LOGIT_BYTES = 4

ROLES = ("kv_tokens", "kv_blocks", "block_size", "max_batch", "prefill_batch_cap",
         "decode_batch_cap", "prefill_token_budget", "cuda_graph", "long_threshold",
         "long_max_batch", "long_use_total_len", "decode_first", "checked_token_budget",
         "cache_memory_share")


@dataclass(frozen=True)
class Knobs:
    """The memory-relevant settings of one config, whatever the server calls them."""

    kv_tokens: int | None            # None: the space does not size the KV pool
    block_size: int = 1
    max_batch: int | None = None
    prefill_cap: int | None = None
    decode_cap: int | None = None
    token_budget: int | None = None
    budget_checked: bool = False     # the server checks a full budget's forward (module doc)
    cuda_graph: bool = False
    long_threshold: int | None = None
    long_max_batch: int | None = None
    long_use_total_len: bool = False
    decode_first: bool = False
    memory_share: float | None = None  # the share of free memory the cache may hold (module doc)

    def calls_long(self, cell: Cell) -> bool:
        """Whether the long-context guard holds `cell`'s requests: its prompt (prompt + output
        where `long_use_total_len`) at or above the threshold.  One rule for the memory model,
        the step shape and the guard's open cap, which must agree on what a step holds."""
        length = cell.input_len + (cell.output_len if self.long_use_total_len else 0)
        return self.long_threshold is not None and length >= self.long_threshold

    @property
    def prefill_limit(self) -> float:
        return min(self.max_batch or math.inf, self.prefill_cap or math.inf)

    @property
    def decode_limit(self) -> float:
        return min(self.max_batch or math.inf, self.decode_cap or math.inf)


def knobs_from_params(space: SearchSpace, params: dict[str, Any]) -> Knobs:
    """Read the knobs by role: the sampled value, else the parameter's default (the server's)."""
    by_role: dict[str, Any] = {}
    for p in space.parameters:
        if p.role:
            value = params.get(p.name, p.default)
            by_role[p.role] = value
    block = by_role.get("block_size") or 1
    tokens = by_role.get("kv_tokens")
    if tokens is None and by_role.get("kv_blocks") is not None:
        tokens = blocks_to_tokens(by_role["kv_blocks"], block)
    elif tokens is not None:  # what --num-blocks really holds
        tokens = blocks_to_tokens(tokens_to_blocks(tokens, block), block)
    return Knobs(
        kv_tokens=None if tokens is None else int(tokens),
        block_size=int(block),
        max_batch=by_role.get("max_batch"),
        prefill_cap=by_role.get("prefill_batch_cap"),
        decode_cap=by_role.get("decode_batch_cap"),
        token_budget=by_role.get("prefill_token_budget") or by_role.get("checked_token_budget"),
        budget_checked=by_role.get("checked_token_budget") is not None,
        cuda_graph=bool(by_role.get("cuda_graph")),
        long_threshold=by_role.get("long_threshold"),
        long_max_batch=by_role.get("long_max_batch"),
        long_use_total_len=bool(by_role.get("long_use_total_len")),
        decode_first=bool(by_role.get("decode_first")),
        memory_share=by_role.get("cache_memory_share"),
    )


@dataclass(frozen=True)
class Estimate:
    """The parts of a config's memory need; `runtime` is the prior until calibrated."""

    weights: int
    pool: int
    runtime: int
    forward: int
    peak_cell: str          # key of the cell whose forward is the largest
    cell_forwards: tuple[tuple[str, int], ...] = ()   # (cell key, forward bytes) per cell
    cell_forms: tuple[tuple[str, str], ...] = ()      # (cell key, form of that forward)
    checked: int = 0        # what the server's footprint check needs free when loaded (doc)
    cell_least: tuple[tuple[str, int], ...] = ()      # (cell key, least_forward) per cell

    @property
    def static(self) -> int:
        return self.weights + self.pool

    @property
    def need(self) -> int:
        return max(self.static + self.runtime + self.forward, self.check_need)

    @property
    def check_need(self) -> int:
        """The card the server's footprint check asks for (0: no check)."""
        return self.weights + self.runtime + self.checked if self.checked else 0

    def with_runtime(self, runtime: int) -> Estimate:
        return dataclasses.replace(self, runtime=runtime)


def act_bytes_per_token(model: ModelInfo) -> int:
    """Transient bytes one token adds to a forward (fp32 logits dominate for big vocabularies)."""
    return (
        model.vocab * LOGIT_BYTES
        + (MLP_TENSORS * model.intermediate + HIDDEN_TENSORS * model.hidden) * model.dtype_bytes
    )


def runtime_prior(cuda_graph: bool) -> int:
    return RUNTIME_PRIOR_BYTES + (GRAPH_POOL_PRIOR_BYTES if cuda_graph else 0)


def checked_bytes(model: ModelInfo, k: Knobs) -> int:
    """Free bytes the footprint check of a cache memory share wants once the server is loaded
    (module doc): its footprint over the share; 0 where the config sets no share, pool or budget
    (the server then sizes the unset one to fit)."""
    if not k.memory_share or k.kv_tokens is None or not k.token_budget:
        return 0
    budget, tokens = int(k.token_budget), int(k.kv_tokens)
    footprint = (tokens * model.kv_bytes_per_token
                 + budget * (model.hidden * model.dtype_bytes + model.vocab * LOGIT_BYTES)
                 + budget * (tokens + budget) * model.dtype_bytes)
    return math.ceil(footprint / float(k.memory_share))


def cell_forward(model: ModelInfo, k: Knobs, cell: Cell) -> tuple[int, str]:
    """Largest transient need of one cell, and its form: a prefill batch beside live decodes
    ("prefill of N", "... beside M decodes"), a full decode ("decode") or a checked budget.

    Follows the admission rules servers of this kind share: a request reserves blocks for its
    prompt + max_tokens, a prefill step takes at most `prefill_limit` requests and `token_budget`
    prompt tokens (the first always goes), the long-context guard limits long prefills and, with
    decode-first, defers them while anything decodes, so that one prefill batch of long requests
    is all that ever runs (counting every admitted request as running put the forward of
    Mistral-7B's 2k-prompt cell at up to 14x what the simulated server reached).  Live sequences
    are counted at their longest (prompt + output), which is where the largest forward happens.
    The form names which of these worst cases the figure is: configs whose worst case has one
    form are misjudged alike, configs of different forms are not (`tuner.trial.prescreen`).
    The live decodes are counted in the form because they are the estimate's upper bound (a
    context copy each at its longest): on the simulated Llama-3.1-8B / RTX 4090 a single 4k
    prefill beside 2 decodes reached 0.86-0.89 of its estimate, beside 1 or 3 0.97-1.07
    (benchmarks/results/search_efficiency.md, round 20).
    """
    prompt, total = max(cell.input_len, 1), cell.input_len + cell.output_len
    if k.kv_tokens is not None:
        per_req_blocks = math.ceil(total / k.block_size)
        admitted = k.kv_tokens // k.block_size // max(per_req_blocks, 1)
        if admitted == 0:
            return 0, "none"  # every request is rejected: no forward runs
    else:
        admitted = cell.concurrency
    running = min(cell.concurrency, admitted)
    per_tok = act_bytes_per_token(model)
    kv_tok = model.kv_bytes_per_token * LIVE_CONTEXT_COPY
    long = k.calls_long(cell)
    n_pre = min(running, k.prefill_limit)
    if long and k.long_max_batch:
        n_pre = min(n_pre, k.long_max_batch)
    if k.token_budget:
        n_pre = min(n_pre, max(1, k.token_budget // prompt))
    n_pre = int(n_pre)
    if long and k.decode_first:     # a long prefill waits while anything decodes: the
        live, running = 0, n_pre     # requests of one prefill batch are all that ever run
    else:
        live = running - n_pre
    prefill = per_tok * n_pre * prompt + kv_tok * live * total
    form = f"prefill of {n_pre}" + (f" beside {live} decode{'s' * (live > 1)}" if live else "")
    if k.budget_checked and k.token_budget and per_tok * int(k.token_budget) > prefill:
        prefill, form = per_tok * int(k.token_budget), "checked budget"
    n_dec = int(min(running, k.decode_limit))
    decode = per_tok * n_dec + kv_tok * running * total
    return (int(prefill), form) if prefill >= decode else (int(decode), "decode")


def least_forward(model: ModelInfo, k: Knobs, cell: Cell) -> int:
    """The forward a cell cannot avoid, whatever its arrivals: one prompt's prefill alone, or
    one step's token budget of it where that is smaller (servers that chunk a prefill, as
    vLLM and SGLang do, never run more in one step; InfiniLM runs the first prompt whole); 0
    where the pool admits no request.  Where `cell_forward`'s worst case is an upper bound
    that arrivals may never reach (two 4k prompts prefilled together ran one at a time, at
    0.54 of their estimate, on the simulated Llama-3.1-8B / RTX 4090), this is the part every
    run of the cell does reach."""
    if cell_forward(model, k, cell)[1] == "none":
        return 0
    prompt = max(cell.input_len, 1)
    return act_bytes_per_token(model) * min(prompt, int(k.token_budget or prompt))


def estimate(model: ModelInfo, k: Knobs, cells: list[Cell] | tuple[Cell, ...],
             runtime: int | None = None) -> Estimate:
    """The config's need on this workload; `runtime` overrides the prior overhead."""
    pool = (k.kv_tokens or 0) * model.kv_bytes_per_token
    each = [(c.key, *cell_forward(model, k, c)) for c in cells]
    forward, peak_cell = max(((f, key) for key, f, _ in each), default=(0, ""))
    return Estimate(weights=model.weight_bytes, pool=pool,
                    runtime=runtime_prior(k.cuda_graph) if runtime is None else runtime,
                    forward=forward, peak_cell=peak_cell,
                    cell_forwards=tuple((key, f) for key, f, _ in each),
                    cell_forms=tuple((key, form) for key, _, form in each),
                    checked=checked_bytes(model, k),
                    cell_least=tuple((c.key, least_forward(model, k, c)) for c in cells))
