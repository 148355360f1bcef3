"""The scenarios of benchmarks/search_efficiency.py: model, simulated card, workload, SLO, grid.

Each scenario runs the InfiniLM space (the one the simulator speaks) with its bounds resolved for
the scenario's model and card.  The ground truth is near-exhaustive: for every combination of
the other knobs on BASE_GRID, the KV pool takes fixed shares of the resolved range and shares of
that combination's own memory edge (the largest pool that runs the matrix, found by bisection on
the simulator), because the best configs sit just under an edge that moves with the other knobs.

`HELD_OUT` was not run while the search was designed: it is the check on scenarios not seen.

Two scenarios were redefined once the in-process simulator failed refused requests as the HTTP
server does (before, a config whose pool was too small for the longest prompt ran "ok" on the
other cells and was rated on them).  Every feasible config of both had been one of those:
* the long-context one's longest prompt is 24k tokens (was 32k): a 32k prompt's prefill alone
  needs 18.7 GiB of activations on the simulated InfiniLM (fp32 logits for every prompt token),
  more than a 24 GiB card leaves beside Llama-3.2-1B's weights and runtime;
* the 70B / H200 one's longest prompt is 4k tokens (was 8k): an 8k prefill needs 7.2 GiB beside
  a pool that holds it (2.7 GiB), more than the ~9 GiB the weights leave; with 4k prompts about
  half of the grid runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuner.bench.records import Cell

KV_SHARES = (0.1, 0.25, 0.5, 1.0)      # of the resolved KV range, for every combination
EDGE_SHARES = (1.0, 0.97, 0.9, 0.8)     # of each combination's own largest pool that runs
BASE_GRID: dict[str, list[Any]] = {
    "block_size": [16, 256], "max_batch_size": [16, 64, 128], "enable_graph": [False, True],
    "max_num_batched_tokens": [2048, 32768], "prefill_batch_cap": [1, 8, 64],
    "decode_batch_cap": [128], "long_context_threshold": [2048, 8192],
    "long_context_max_batch": [1], "long_context_use_total_len": [False],
    "decode_first_when_running": [False, True]}


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str          # folder under models/
    gpu: str            # tuner.sim.profiles name
    cells: tuple[Cell, ...]
    slo: dict[str, float]
    note: str
    held_out: bool = False
    # BASE_GRID values this scenario widens, where a knob it holds fixed is what binds here
    # (out of the repr, so that the ground-truth keys of the others stay as they were)
    grid: tuple[tuple[str, tuple[Any, ...]], ...] = field(default=(), repr=False)

    def base_grid(self) -> dict[str, list[Any]]:
        """BASE_GRID with this scenario's own values for the knobs `grid` names."""
        return {**BASE_GRID, **{k: list(v) for k, v in self.grid}}


SCENARIOS = (
    Scenario("8b-4090-edge", "llama-3.1-8b", "rtx4090",
             (Cell(4, 4096, 1024, 8), Cell(64, 256, 256, 64), Cell(16, 32, 1024, 16),
              Cell(1, 256, 256, 4)),
             {"p99_tpot_ms": 50.0}, "the seed's card; the optimum sits at the memory edge"),
    Scenario("qwen7b-l40s-chat", "qwen2.5-7b", "l40s",
             (Cell(64, 512, 256, 128), Cell(16, 1024, 512, 32), Cell(128, 128, 128, 128)),
             {"p99_ttft_ms": 3000.0}, "short chat at high concurrency, a TTFT SLO"),
    Scenario("1b-3090-long", "llama-3.2-1b", "rtx3090",
             (Cell(4, 16384, 256, 8), Cell(1, 24576, 256, 2), Cell(8, 8192, 512, 16)),
             {"p99_tpot_ms": 30.0}, "long context: 8k-24k prompts"),
    Scenario("mistral-a100-mixed", "mistral-7b", "a100-40g",
             (Cell(32, 2048, 256, 64), Cell(8, 4096, 512, 16), Cell(64, 256, 256, 64)),
             {"p99_tpot_ms": 40.0}, "mixed prompt lengths, a TPOT SLO"),
    Scenario("70b-h200-heldout", "llama-3.1-70b", "h200",
             (Cell(16, 2048, 256, 32), Cell(4, 4096, 512, 8), Cell(32, 256, 256, 64)),
             {"p99_tpot_ms": 60.0}, "held out: 70B weights leave ~9 GiB of an H200; 2k-4k prompts",
             held_out=True),
)

# First run after round 12's search changes were committed (2026-12-02): models, cards and
# workloads the search was never designed or measured on.  Not run by default (their ground
# truths took about 3000 CPU-seconds); `--scenarios` names them.
UNSEEN = (
    Scenario("u-8b-l40s-tpot", "llama-3.1-8b", "l40s",
             (Cell(32, 512, 512, 64), Cell(8, 2048, 1024, 16), Cell(64, 128, 256, 128)),
             {"p99_tpot_ms": 35.0}, "unseen: chat under a tight TPOT SLO", held_out=True),
    Scenario("u-3b-a100-80g-rag", "llama-3.2-3b", "a100-80g",
             (Cell(8, 8192, 256, 16), Cell(32, 1024, 256, 64), Cell(2, 16384, 512, 4)),
             {"p99_ttft_ms": 8000.0}, "unseen: RAG prompts on an 80 GB card", held_out=True),
    Scenario("u-qwen7b-h100-long", "qwen2.5-7b", "h100-80g",
             (Cell(4, 12000, 256, 8), Cell(16, 3000, 300, 32)),
             {"p99_tpot_ms": 40.0}, "unseen: 3k-12k prompts", held_out=True),
)


# First run in round 20 (2026-12-04), after that round's pre-screen change was committed: neither
# the search nor the pre-screen was changed after seeing them.  Opt-in, as `UNSEEN`.  The first
# one was defined with p99 TTFT <= 2 s, which none of its 4032 grid configs and no study met (its
# 48-request chat cell queues behind 3k-token prefills); it has the seed's SLO instead.
FRESH = (
    Scenario("f-mistral-4090-chat", "mistral-7b", "rtx4090",
             (Cell(48, 384, 256, 96), Cell(8, 3072, 512, 16), Cell(1, 1024, 256, 4)),
             {"p99_tpot_ms": 50.0}, "fresh: chat beside a 3k-prompt cell on a 24 GB card",
             held_out=True),
    Scenario("f-3b-l40s-long", "llama-3.2-3b", "l40s",
             (Cell(4, 16000, 256, 8), Cell(16, 4096, 512, 32)),
             {"p99_tpot_ms": 30.0}, "fresh: 4k-16k prompts under a TPOT SLO", held_out=True),
    Scenario("f-qwen7b-a100-40g-mixed", "qwen2.5-7b", "a100-40g",
             (Cell(32, 1500, 300, 64), Cell(64, 200, 400, 128), Cell(4, 8000, 256, 8)),
             {"p99_tpot_ms": 45.0}, "fresh: mixed prompts, 200 to 8k tokens", held_out=True),
)

# First run in round 21 (2026-12-04), after that round's search changes (a90db8e) were committed:
# defined before they were run.  Opt-in, as `UNSEEN`.  The budget raise of
# `tuner.study.open_caps` was then made after seeing the Mistral / H100 one miss (one seed at
# 0.898 at 30 trials): since then that scenario is seen, the other two are not.
ROUND21 = (
    Scenario("n-8b-a100-80g-long", "llama-3.1-8b", "a100-80g",
             (Cell(2, 20000, 256, 4), Cell(8, 6000, 512, 16), Cell(32, 512, 256, 64)),
             {"p99_tpot_ms": 40.0}, "round 21: 0.5k-20k prompts on an 80 GB card",
             held_out=True),
    Scenario("n-mistral-h100-chat", "mistral-7b", "h100-80g",
             (Cell(128, 200, 200, 256), Cell(32, 1000, 300, 64)),
             {"p99_ttft_ms": 4000.0}, "round 21: busy chat, a TTFT SLO", held_out=True),
    Scenario("n-3b-4090-rag", "llama-3.2-3b", "rtx4090",
             (Cell(32, 1024, 256, 64), Cell(4, 8192, 256, 8)),
             {"p99_tpot_ms": 25.0}, "round 21: 1k-8k prompts on a 24 GB card", held_out=True),
)

# Defined in round 24 (2026-12-04) at 96fffbf, before any was run, to check the search as
# committed on what it was never run on: a decode-heavy workload on a 24 GB card whose weights
# leave ~6 GiB, two SLOs at once at high concurrency, and prompts near the model's 32k limit.
# Opt-in, as `UNSEEN`.
ROUND24 = (
    Scenario("g-qwen7b-3090-decode", "qwen2.5-7b", "rtx3090",
             (Cell(16, 128, 2048, 32), Cell(64, 64, 512, 128)),
             {"p99_tpot_ms": 60.0}, "round 24: long outputs on a 24 GB card", held_out=True),
    Scenario("g-1b-l40s-twoslo", "llama-3.2-1b", "l40s",
             (Cell(256, 512, 128, 512), Cell(64, 2048, 256, 128)),
             {"p99_ttft_ms": 8000.0, "p99_tpot_ms": 50.0},
             "round 24: 256 in flight under a TTFT and a TPOT SLO", held_out=True),
    Scenario("g-mistral-l40s-long", "mistral-7b", "l40s",
             (Cell(2, 24000, 256, 4), Cell(12, 6000, 512, 24)),
             {"p99_tpot_ms": 45.0}, "round 24: 6k-24k prompts, near the 32k limit",
             held_out=True),
)
# Defined in round 25 (2026-12-04) at 38d0589, before any was run: two model / card pairs no
# scenario had (Llama-3.1-8B on a 24 GB RTX 3090, whose weights leave ~6 GiB; Qwen2.5-7B on an
# RTX 4090), a RAG-shaped workload under a TTFT SLO.  Opt-in, as `UNSEEN`.
ROUND25 = (
    Scenario("h-8b-3090-mixed", "llama-3.1-8b", "rtx3090",
             (Cell(24, 768, 384, 48), Cell(4, 4096, 256, 8)),
             {"p99_tpot_ms": 70.0}, "round 25: chat beside 4k prompts, ~6 GiB beside the weights",
             held_out=True),
    Scenario("h-qwen7b-4090-rag", "qwen2.5-7b", "rtx4090",
             (Cell(16, 3000, 200, 32), Cell(48, 300, 300, 96)),
             {"p99_ttft_ms": 15000.0}, "round 25: 3k-token RAG prompts beside chat, a TTFT SLO",
             held_out=True),
)
# h-qwen7b-4090-rag was first defined with p99 TTFT <= 6 s: its ground truth found no config of
# the grid that met it (the best p99 TTFT of 80 sampled grid runs was 10.3 s: 16 prompts of 3k
# tokens arrive at once), so it was set to 15 s before any search ran on it.
# Defined in round 25 after that round's search changes (5b7266d), before any was run: the check
# on ground those changes were not made on (the two above were: their misses led to them).
ROUND25B = (
    Scenario("i-3b-3090-chat", "llama-3.2-3b", "rtx3090",
             (Cell(32, 512, 384, 64), Cell(8, 2048, 256, 16)),
             {"p99_tpot_ms": 40.0}, "round 25b: chat beside 2k prompts, a TPOT SLO",
             held_out=True),
    Scenario("i-mistral-a100-40g-rag", "mistral-7b", "a100-40g",
             (Cell(12, 2500, 200, 24), Cell(40, 300, 300, 80)),
             {"p99_ttft_ms": 12000.0}, "round 25b: 2.5k-token RAG prompts beside chat, a TTFT SLO",
             held_out=True),
)
# Defined in round 26 before any run, after the waiting trade (`tuner.study.edge_pushes`) was
# written on h-qwen7b-4090-rag: the check of that change on ground it was not made on.  Both
# have an SLO a request waiting for KV blocks adds to (TTFT, end-to-end).
ROUND26 = (
    Scenario("j-8b-a100-40g-rag", "llama-3.1-8b", "a100-40g",
             (Cell(24, 3500, 200, 48), Cell(32, 300, 300, 64)),
             {"p99_ttft_ms": 12000.0}, "round 26: 3.5k-token RAG prompts beside chat, a TTFT SLO",
             held_out=True),
    Scenario("j-3b-l40s-e2el", "llama-3.2-3b", "l40s",
             (Cell(48, 1500, 400, 96), Cell(8, 6000, 300, 16)),
             {"p99_e2el_ms": 30000.0}, "round 26: 1.5k and 6k prompts, an end-to-end SLO",
             held_out=True),
)
# Defined in round 29 before any run, on pairs no scenario had: Mistral-7B on a 24 GB RTX 3090
# (about 7 GiB beside the weights) under RAG prompts and a TTFT SLO, and Qwen2.5-7B on an H200,
# where memory is plentiful and the SLO (p99 TPOT) is what binds.
ROUND29 = (
    Scenario("k-mistral-3090-rag", "mistral-7b", "rtx3090",
             (Cell(8, 3000, 150, 16), Cell(40, 250, 250, 80)),
             {"p99_ttft_ms": 20000.0}, "round 29: 3k-token RAG prompts beside chat on 24 GB",
             held_out=True),
    Scenario("k-qwen7b-h200-tpot", "qwen2.5-7b", "h200",
             (Cell(64, 2048, 512, 128), Cell(16, 8192, 256, 32)),
             {"p99_tpot_ms": 30.0}, "round 29: long chat on an H200, a TPOT SLO",
             held_out=True, grid=(("long_context_max_batch", (1, 8)),)),
)
# k-qwen7b-h200-tpot's grid holds long prompts 1 and 8 per step: with BASE_GRID's 1 alone, every
# 8k prompt ran alone, and the best config a study found (8 per step) ran 2.2x the grid's best
# (round 29's first run; the SLO, the cells and the model were not changed).
# Defined in round 30 before any run: the first p99 ITL SLO (a 12k-token prefill not chunked by the
# token budget stalls every decode beside it) on a model and card never paired (Llama-3.2-1B on
# an A100 40 GB), and the first scenario with both a TTFT and a TPOT SLO on a 7B model
# (Qwen2.5-7B on an A100 80 GB, 4k prompts beside chat).
ROUND30 = (
    Scenario("l-1b-a100-40g-itl", "llama-3.2-1b", "a100-40g",
             (Cell(96, 768, 384, 192), Cell(12, 12000, 200, 24)),
             {"p99_itl_ms": 60.0}, "round 30: chat beside 12k prompts, a p99 ITL SLO",
             held_out=True),
    Scenario("l-qwen7b-a100-80g-twoslo", "qwen2.5-7b", "a100-80g",
             (Cell(64, 4096, 256, 128), Cell(128, 512, 512, 256)),
             {"p99_ttft_ms": 10000.0, "p99_tpot_ms": 50.0},
             "round 30: 4k prompts beside chat, TTFT and TPOT SLOs", held_out=True),
)
# Defined in round 31 before any run: the suite's first percentile SLO other than p99 (p90 TPOT)
# on a memory-bound pair never used (Llama-3.2-3B on an A100 40 GB: the 256-request cell keeps ~390k
# tokens in flight, the card holds ~290k beside the weights), and its first median SLO (median
# TTFT beside a p99 TPOT) on Mistral-7B / A100 80 GB, where 16k-token prompts queue behind one
# another (8 of them are ~6.7 s of prefill on that card; the median request waits for about half).
ROUND31 = (
    Scenario("m-3b-a100-40g-p90", "llama-3.2-3b", "a100-40g",
             (Cell(256, 1024, 512, 512), Cell(16, 8000, 256, 32)),
             {"p90_tpot_ms": 45.0}, "round 31: 256 in flight beside 8k prompts, a p90 TPOT SLO",
             held_out=True),
    Scenario("m-mistral-a100-80g-median", "mistral-7b", "a100-80g",
             (Cell(128, 512, 256, 256), Cell(8, 16000, 256, 16)),
             {"median_ttft_ms": 5000.0, "p99_tpot_ms": 80.0},
             "round 31: 16k prompts beside chat, a median TTFT and a p99 TPOT SLO", held_out=True),
)
# Defined in round 37 before any run, on model / card pairs no scenario had: Llama-3.1-8B on an
# H100 (6k-token documents beside 128 chat requests, p99 TPOT), Llama-3.2-3B on an H200 (32 8k-token
# RAG prompts beside 128 chat requests: the card holds ~1.1M tokens of its KV, so memory does not
# bind and the scheduler knobs decide; p99 TTFT) and Llama-3.2-1B on an RTX 4090 (16k-token
# prompts, whose fp32 logits alone take ~8 GiB, beside 64 chat requests; p99 end-to-end latency).
ROUND37 = (
    Scenario("o-8b-h100-docs", "llama-3.1-8b", "h100-80g",
             (Cell(128, 512, 384, 256), Cell(8, 6000, 256, 16)),
             {"p99_tpot_ms": 35.0}, "round 37: 6k documents beside 128 chat requests, p99 TPOT",
             held_out=True),
    Scenario("o-3b-h200-rag", "llama-3.2-3b", "h200",
             (Cell(32, 8000, 200, 64), Cell(128, 300, 300, 256)),
             {"p99_ttft_ms": 6000.0}, "round 37: 8k RAG prompts beside chat, memory not binding",
             held_out=True),
    Scenario("o-1b-4090-e2el", "llama-3.2-1b", "rtx4090",
             (Cell(64, 1024, 512, 128), Cell(4, 16000, 128, 8)),
             {"p99_e2el_ms": 30000.0}, "round 37: 16k prompts beside chat, p99 end-to-end",
             held_out=True),
)
# Defined in round 38 before any run, on model / card pairs no scenario had, and the suite's first
# open-loop cell: Llama-3.1-8B on an H200 (4k-token prompts arriving as a Poisson process, 4 per
# second with at most 64 in flight, beside 256 chat requests kept in flight; p99 TTFT), Mistral-7B
# on an H200 (12k-token prompts beside 192 chat requests, a p99 ITL SLO: an unchunked 12k prefill
# stalls every decode beside it) and Llama-3.2-1B on an H100 (decode-heavy: 384 requests of 1k
# output tokens beside 4k prompts, a p90 TPOT SLO).
ROUND38 = (
    Scenario("p-8b-h200-open", "llama-3.1-8b", "h200",
             (Cell(64, 4000, 256, 128, request_rate=4.0), Cell(256, 512, 512, 512)),
             {"p99_ttft_ms": 4000.0}, "round 38: Poisson 4k prompts beside 256 chat, p99 TTFT",
             held_out=True),
    Scenario("p-mistral-h200-itl", "mistral-7b", "h200",
             (Cell(192, 768, 384, 384), Cell(12, 12000, 200, 24)),
             {"p99_itl_ms": 50.0}, "round 38: 12k prompts beside 192 chat, a p99 ITL SLO",
             held_out=True),
    Scenario("p-1b-h100-decode", "llama-3.2-1b", "h100-80g",
             (Cell(384, 128, 1024, 768), Cell(32, 4000, 512, 64)),
             {"p90_tpot_ms": 25.0}, "round 38: 384 long decodes beside 4k prompts, p90 TPOT",
             held_out=True),
)
# Defined in round 39 before any run: the first open-loop cell on a card where memory binds
# (Qwen2.5-7B on an RTX 3090: Poisson 2k-token prompts at 1.5 per second, at most 32 in flight,
# beside 48 chat requests; p99 TTFT), and Llama-3.2-3B on an H100, a pair no scenario had
# (8k-token prompts beside 160 chat requests; p99 ITL, which a long prefill run between decode
# steps adds to).
ROUND39 = (
    Scenario("q-qwen7b-3090-open", "qwen2.5-7b", "rtx3090",
             (Cell(32, 2000, 200, 64, request_rate=1.5), Cell(48, 300, 300, 96)),
             {"p99_ttft_ms": 10000.0}, "round 39: Poisson 2k prompts beside 48 chat on 24 GB",
             held_out=True),
    Scenario("q-3b-h100-itl", "llama-3.2-3b", "h100-80g",
             (Cell(16, 8000, 128, 32), Cell(160, 256, 256, 320)),
             {"p99_itl_ms": 40.0}, "round 39: 8k prompts beside 160 chat, a p99 ITL SLO",
             held_out=True),
)
# Defined in round 40 before any run: two more open-loop cells on 24 GB cards where memory binds
# (the kind round 39's q-qwen7b-3090-open failed on: Mistral-7B on an RTX 4090 under a p99 TTFT,
# Llama-3.2-3B on an RTX 3090 with 8k-token prompts), and Llama-3.2-1B on an A100 80GB, a pair no
# scenario had (256 chat requests beside 12k-token prompts; p90 end-to-end latency).
ROUND40 = (
    Scenario("r-mistral-4090-open", "mistral-7b", "rtx4090",
             (Cell(24, 3000, 256, 48, request_rate=1.0), Cell(32, 512, 256, 64)),
             {"p99_ttft_ms": 8000.0}, "round 40: Poisson 3k prompts beside 32 chat on 24 GB",
             held_out=True),
    Scenario("r-3b-3090-open", "llama-3.2-3b", "rtx3090",
             (Cell(16, 8000, 256, 32, request_rate=0.4), Cell(64, 512, 256, 128)),
             {"p99_ttft_ms": 15000.0}, "round 40: Poisson 8k prompts beside 64 chat on 24 GB",
             held_out=True),
    Scenario("r-1b-a100-80g-e2el", "llama-3.2-1b", "a100-80g",
             (Cell(256, 512, 256, 512), Cell(8, 12000, 256, 16)),
             {"p90_e2el_ms": 20000.0}, "round 40: 12k prompts beside 256 chat, p90 end-to-end",
             held_out=True),
)
# Defined in round 41 before any run, with the trade of a miss under the edge tolerance in.
ROUND41 = (
    Scenario("s-8b-l40s-open", "llama-3.1-8b", "l40s",
             (Cell(32, 4000, 256, 64, request_rate=0.8), Cell(64, 512, 256, 128)),
             {"p99_ttft_ms": 10000.0}, "round 41: Poisson 4k prompts beside 64 chat on 48 GB",
             held_out=True),
    Scenario("s-3b-a100-40g-twoslo", "llama-3.2-3b", "a100-40g",
             (Cell(8, 6000, 256, 16), Cell(96, 512, 256, 192)),
             {"p99_ttft_ms": 6000.0, "p99_tpot_ms": 40.0},
             "round 41: 6k prompts beside 96 chat, p99 TTFT and p99 TPOT", held_out=True),
    Scenario("s-mistral-a100-80g-e2el", "mistral-7b", "a100-80g",
             (Cell(4, 20000, 512, 8), Cell(64, 1024, 256, 128)),
             {"p99_e2el_ms": 60000.0}, "round 41: 20k prompts beside 64 chat, p99 end-to-end",
             held_out=True),
)
# Defined in round 43 before any run, with the forward scale floored by its shape: an open-loop
# cell on a 24 GB card where memory binds (the kind the Qwen2.5-7B / RTX 3090 and Mistral-7B /
# RTX 4090 scenarios fail on), with Llama-3.1-8B; and Qwen2.5-7B / A100 80GB with open-loop
# 6k-token prompts beside 96 chat under p99 TTFT and p99 TPOT.  The 8B one was defined with a
# 9 s p99 TTFT, which no config of the grid or of any study met (the pool binds: the start-up
# corner at its edge, 17.3k tokens, reached 18.0 s); redefined at 20 s before a search ran on it.
ROUND43 = (
    Scenario("t-8b-4090-open", "llama-3.1-8b", "rtx4090",
             (Cell(24, 2500, 256, 48, request_rate=1.2), Cell(40, 400, 200, 80)),
             {"p99_ttft_ms": 20000.0}, "round 43: Poisson 2.5k prompts beside 40 chat on 24 GB",
             held_out=True),
    Scenario("t-qwen7b-a100-80g-twoslo", "qwen2.5-7b", "a100-80g",
             (Cell(16, 6000, 256, 32, request_rate=0.5), Cell(96, 256, 256, 192)),
             {"p99_ttft_ms": 12000.0, "p99_tpot_ms": 60.0},
             "round 43: Poisson 6k prompts beside 96 chat, p99 TTFT and p99 TPOT", held_out=True),
)
# Defined in round 46 before any search ran on them, to check the round 45 search on model /
# card / workload triples no round had tuned it on.  Each SLO was fixed from two probe runs at
# the largest pool that runs, the server's default and the start-up corner (every cap open,
# 16-token blocks): p99 TTFT 23.9 / 8.5 s (3B), p90 E2EL 63.4 / 63.6 s (Mistral), p99 TTFT 1.8
# / 8.3 s (8B, whose default caps the batch at 8 and runs at half the corner's throughput),
# each SLO under the corner's figure, so that the corner alone does not meet it.
ROUND46 = (
    Scenario("v-3b-4090-open", "llama-3.2-3b", "rtx4090",
             (Cell(16, 6000, 256, 32, request_rate=0.6), Cell(96, 400, 200, 192)),
             {"p99_ttft_ms": 8000.0}, "round 46: Poisson 6k prompts beside 96 chat on 24 GB",
             held_out=True),
    Scenario("v-mistral-3090-e2el", "mistral-7b", "rtx3090",
             (Cell(32, 1500, 512, 64), Cell(64, 300, 300, 128)),
             {"p90_e2el_ms": 60000.0}, "round 46: 1.5k prompts, long answers, p90 end-to-end",
             held_out=True),
    Scenario("v-8b-a100-40g-open", "llama-3.1-8b", "a100-40g",
             (Cell(24, 3000, 256, 48, request_rate=1.5), Cell(64, 400, 256, 128)),
             {"p99_ttft_ms": 6000.0}, "round 46: Poisson 3k prompts beside 64 chat on 40 GB",
             held_out=True),
)
ROUND47 = (
    Scenario("w-8b-3090-tpot", "llama-3.1-8b", "rtx3090",
             (Cell(24, 2000, 768, 48), Cell(48, 300, 300, 96)),
             {"p99_tpot_ms": 25.0}, "round 47: 2k prompts, 768-token answers, p99 TPOT",
             held_out=True),
    Scenario("w-3b-3090-open", "llama-3.2-3b", "rtx3090",
             (Cell(16, 5000, 256, 32, request_rate=0.8), Cell(128, 300, 256, 256)),
             {"p99_ttft_ms": 12000.0}, "round 47: Poisson 5k prompts beside 128 chat on 24 GB",
             held_out=True),
    Scenario("w-qwen7b-4090-e2el", "qwen2.5-7b", "rtx4090",
             (Cell(4, 6000, 384, 8), Cell(64, 500, 200, 128)),
             {"p99_e2el_ms": 30000.0}, "round 47: 6k prompts beside 64 chat, p99 end-to-end",
             held_out=True),
)
# Defined in round 51 before any search ran on them, as round 46's were: each SLO under what
# the start-up corner (every cap open, 16-token blocks, graphs on) gives at the largest pool
# that runs; the server's default misses it far.  8B / L40S: the corner's 32k-token budget
# holds its pool to 49k tokens, about ten 4.5k-token requests, too few for one arriving per
# second: p99 TTFT 51 s (the default 73 s).  Mistral-7B / A100 40 GB: p90 E2EL 11.9 s at the
# top of the pool's range (the default 106 s).
ROUND51 = (
    Scenario("x-8b-l40s-open", "llama-3.1-8b", "l40s",
             (Cell(48, 4000, 512, 96, request_rate=1.0), Cell(64, 500, 300, 128)),
             {"p99_ttft_ms": 20000.0}, "round 51: Poisson 4k prompts beside 64 chat on 48 GB",
             held_out=True),
    Scenario("x-mistral-a100-40g-e2el", "mistral-7b", "a100-40g",
             (Cell(16, 8000, 256, 32, request_rate=0.5), Cell(96, 600, 400, 192)),
             {"p90_e2el_ms": 11000.0}, "round 51: Poisson 8k prompts beside 96 chat, p90 E2EL",
             held_out=True),
)
# Defined in round 52 before any search ran on them, as round 51's were.  Qwen2.5-7B / L40S, three
# closed-loop cells (2k prompts, chat, 8k prompts): the corner holds a 41k-token pool beside its
# 32k-token budget, p99 TPOT 26.1 ms (the default 206 ms).  Mistral-7B / L40S, Poisson 6k prompts
# beside 96 chat: the corner's p99 TTFT is 2.04 s at a 157k-token pool (the default 56 s).
# Later in the round, after both had run: Llama-3.2-3B / L40S, 1.2k prompts with 400-token answers
# beside 6k prompts, the corner's p99 TPOT 29.4 ms at 99k tokens (the default 203 ms); Llama-3.1-8B
# / H100, Poisson 3k prompts beside 128 chat, the corner's p90 E2EL 3.83 s at 320k tokens (the
# default 36 s).
ROUND52 = (
    Scenario("y-qwen7b-l40s-tpot3", "qwen2.5-7b", "l40s",
             (Cell(32, 2000, 256, 64), Cell(64, 300, 300, 128), Cell(8, 8000, 128, 16)),
             {"p99_tpot_ms": 24.0}, "round 52: three cells (2k, chat, 8k prompts), p99 TPOT",
             held_out=True),
    Scenario("y-mistral-l40s-open", "mistral-7b", "l40s",
             (Cell(24, 6000, 256, 48, request_rate=0.5), Cell(96, 400, 250, 192)),
             {"p99_ttft_ms": 1800.0}, "round 52: Poisson 6k prompts beside 96 chat on 48 GB",
             held_out=True),
    Scenario("z-3b-l40s-tpot", "llama-3.2-3b", "l40s",
             (Cell(48, 1200, 400, 96), Cell(16, 6000, 200, 32)),
             {"p99_tpot_ms": 26.0}, "round 52: 1.2k prompts, long answers, beside 6k prompts",
             held_out=True),
    Scenario("z-8b-h100-e2el", "llama-3.1-8b", "h100-80g",
             (Cell(32, 3000, 300, 64, request_rate=2.0), Cell(128, 400, 250, 256)),
             {"p90_e2el_ms": 3400.0}, "round 52: Poisson 3k prompts beside 128 chat, p90 E2EL",
             held_out=True),
)
OPT_IN = (*UNSEEN, *FRESH, *ROUND21, *ROUND24, *ROUND25, *ROUND25B, *ROUND26,
          *ROUND29, *ROUND30, *ROUND31, *ROUND37, *ROUND38, *ROUND39,
          *ROUND40, *ROUND41, *ROUND43, *ROUND46, *ROUND47, *ROUND51, *ROUND52)  # where named


def by_name(name: str) -> Scenario:
    for s in (*SCENARIOS, *OPT_IN):
        if s.name == name:
            return s
    raise KeyError(name)
