"""The simulated InfiniLM engine: a discrete-event scheduler over a paged KV block pool.

Scheduling facts follow InfiniTensor/InfiniLM `python/infinilm/llm/scheduler.py` and the seed's
patch to it (see ../shared/DESIGN.md):

* a waiting queue and a running queue; a step is either a prefill of waiting requests or a decode
  of running ones, and prefill has priority (upstream: "new prefill minimizes TTFT");
* admission reserves ceil((prompt + max_tokens) / block_size) blocks up front, with no swap or
  preemption, so a request never runs out of blocks mid-generation; a head request that does not
  fit logs "Insufficient KV cache blocks ..., deferring." and blocks the queue (FIFO);
* a prefill step takes at most min(max_batch_size, INFINILM_PREFILL_BATCH_CAP) requests and at most
  INFINILM_MAX_NUM_BATCHED_TOKENS prompt tokens (the first request always goes: no chunking);
  a decode step takes at most min(max_batch_size, INFINILM_DECODE_BATCH_CAP) running requests,
  round-robin (upstream pops them from a FIFO queue and puts them back at its end);
* the seed's long-context guard: a request is "long" when its prompt (or prompt + max_tokens with
  INFINILM_LONG_CONTEXT_USE_TOTAL_LEN) reaches INFINILM_LONG_CONTEXT_THRESHOLD; at most
  INFINILM_LONG_CONTEXT_MAX_BATCH long requests per prefill or decode batch; with
  INFINILM_DECODE_FIRST_WHEN_RUNNING a long prefill waits while anything is decoding.

Every forward is checked against `MemoryModel.forward_peak`; one that overflows kills the step
loop as InfiniLM's does (the engine stops, nothing more is produced).  To stay cheap, runs of
identical decode steps (the whole running set, nothing arriving or finishing) are advanced in
bulk with numpy instead of one Python iteration per token.  Prefix caching: tuner.sim.prefix_cache.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

import numpy as np

from tuner.search.model import ModelInfo
from tuner.sim.config import SimConfig
from tuner.sim.memory import MemoryModel
from tuner.sim.prefix_cache import PrefixCache
from tuner.sim.profiles import GpuProfile
from tuner.sim.requests import SimRequest
from tuner.sim.startup import StartupFailure, check_startup
from tuner.sim.timing import StepTimer

__all__ = ["Engine", "SimRequest", "StartupFailure"]


class Engine:
    """Scheduler + memory + step times.  Drive it with `submit` and `advance`."""

    def __init__(self, model: ModelInfo, gpu: GpuProfile, cfg: SimConfig,
                 log: Callable[[str], None] | None = None) -> None:
        self.model, self.gpu, self.cfg, self.knobs = model, gpu, cfg, cfg.knobs
        self.memory = MemoryModel(
            model, gpu, cfg.num_blocks, cfg.block_size, cfg.enable_graph, cfg.tp
        )
        self.timer = StepTimer(model, gpu, cfg.enable_graph, cfg.tp)
        self._log = log or (lambda line: None)
        self._rng = np.random.default_rng(cfg.seed)
        self.clock = 0.0
        self.free_blocks = cfg.num_blocks
        self.cache = PrefixCache(cfg.prefix_caching)
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.failed: str | None = None
        self.peak_bytes = self.memory.idle_bytes
        self.steps = 0
        self._next_id = 0
        check_startup(model, gpu, cfg, self.memory)

    # ----- requests -------------------------------------------------------------------------
    def blocks_needed(self, prompt_len: int, max_tokens: int) -> int:
        return math.ceil((prompt_len + max_tokens) / self.cfg.block_size)

    def submit(self, prompt_len: int, max_tokens: int, arrival: float,
               hashes: tuple[int, ...] = ()) -> SimRequest:
        """Queue a request that reached the server at simulated time `arrival`; `hashes` are the
        full-block hashes (tuner.sim.prefix_cache) of its prompt and of the answer it will get,
        empty when nothing is shared.

        A request that can never run (more blocks than the pool, or longer than the model's
        context) fails at once with a reason instead of waiting forever as upstream would.
        """
        req = SimRequest(self._next_id, arrival, prompt_len, max_tokens, hashes=hashes)
        self._next_id += 1
        need = self.blocks_needed(prompt_len, max_tokens)
        if need > self.cfg.num_blocks:
            req.error = f"request needs {need} KV blocks, the pool has {self.cfg.num_blocks}"
        elif prompt_len + max_tokens > self.model.max_position_embeddings:
            req.error = "prompt + max_tokens exceeds max_position_embeddings"
        if req.error:
            req.finished = True
        else:  # FIFO in simulated arrival order, which HTTP arrival order need not be
            bisect.insort_right(self.waiting, req, key=lambda r: r.arrival)
        return req

    def _is_long(self, req: SimRequest) -> bool:
        return self.knobs.is_long(req.prompt_len, req.max_tokens)

    # ----- scheduling -----------------------------------------------------------------------
    def _pick_prefill(self) -> list[SimRequest]:
        """Waiting requests (arrived by now) to prefill this step; reserves their blocks."""
        k = self.knobs
        long_cap = k.long_context_max_batch or math.inf
        budget = k.max_num_batched_tokens or math.inf
        batch: list[SimRequest] = []
        tokens = n_long = 0
        for req in self.waiting:
            if len(batch) >= k.prefill_limit or req.arrival > self.clock:
                break
            long = self._is_long(req)
            if long and (n_long >= long_cap or (k.decode_first_when_running and self.running)):
                continue
            hits = self.cache.hits(req.hashes, req.prompt_len, self.cfg.block_size)
            compute = req.prompt_len - hits * self.cfg.block_size
            if batch and tokens + compute > budget:
                break
            need = self.blocks_needed(req.prompt_len, req.max_tokens) - hits
            if need > self.free_blocks + self.cache.evictable(req.hashes[:hits]):
                if not req.deferred_logged:
                    self._log(f"Insufficient KV cache blocks for request {req.rid}, deferring.")
                    req.deferred_logged = True
                break
            self._allocate(req, hits, need)
            batch.append(req)
            tokens += compute
            n_long += long
        for req in batch:
            self.waiting.remove(req)
        return batch

    def _allocate(self, req: SimRequest, hits: int, need: int) -> None:
        """Reference the `hits` cached blocks, evict idle ones if the free list is short, and
        take `need` fresh blocks (private until the prefill registers their hashes)."""
        req.held = list(req.hashes[:hits])
        self.cache.acquire(req.held)
        self.free_blocks += self.cache.evict(need - self.free_blocks)
        self.free_blocks -= need
        req.blocks = need
        req.cached_tokens = hits * self.cfg.block_size
        self.cache.hit_tokens += req.cached_tokens
        self.cache.prompt_tokens += req.prompt_len

    def _pick_decode(self) -> list[SimRequest]:
        """Running requests to decode this step, round-robin, within the caps."""
        long_cap = self.knobs.long_context_max_batch or math.inf
        batch: list[SimRequest] = []
        n_long = 0
        for req in self.running:
            if len(batch) >= self.knobs.decode_limit:
                break
            long = self._is_long(req)
            if long and n_long >= long_cap:
                continue
            batch.append(req)
            n_long += long
        return batch

    # ----- stepping -------------------------------------------------------------------------
    def _jitter(self, n: int) -> np.ndarray:
        """Seeded multiplicative noise on step times (all ones without --jitter)."""
        if self.cfg.jitter <= 0:
            return np.ones(n)
        return np.clip(1.0 + self.cfg.jitter * self._rng.standard_normal(n), 0.5, 2.0)

    def _oom(self, peak: int, what: str) -> None:
        need_mib = (peak - self.memory.capacity_bytes) >> 20
        self.failed = f"cudaMalloc failed: out of memory during {what} (short by {need_mib} MiB)"
        self.peak_bytes = max(self.peak_bytes, peak)
        self._log("[rank 0] exception during forward: cudaMalloc failed: out of memory")
        self._log("RankWorker stopped during run")
        self._log(f"infinilm.llm.llm - ERROR - Error in step loop: {self.failed}")

    def _finish(self, req: SimRequest) -> None:
        req.finished = True
        if self.cache.enabled and req.error is None:
            # the answer's full blocks (the last token's KV is never computed) are published as
            # the prompt's were: a follow-up turn whose history holds this answer reuses them
            bs = self.cfg.block_size
            taken = self.cache.register(req.hashes[req.prompt_len // bs:(req.context - 1) // bs])
            req.held += taken
            req.blocks -= len(taken)
        self.free_blocks += req.blocks
        self.cache.release(req.held)
        self.running.remove(req)

    def abort(self, req: SimRequest) -> None:
        """Drop a queued or running request whose client is gone (vLLM does the same)."""
        if req.finished:
            return
        req.finished, req.error = True, "aborted"
        if req in self.running:
            self._finish(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def abort_all(self) -> None:
        """Drop every queued and running request (clients gone), keeping the cache."""
        for req in self.waiting + self.running:
            self.abort(req)

    def _prefill(self, batch: list[SimRequest]) -> list[SimRequest]:
        lens = [r.prompt_len - r.cached_tokens for r in batch]
        live = sum(r.context for r in self.running)
        peak = self.memory.forward_peak(sum(lens), live)
        if peak > self.memory.capacity_bytes:
            self._oom(peak, f"prefill of {len(batch)} requests / {sum(lens)} tokens")
            return []
        self.peak_bytes = max(self.peak_bytes, peak)
        self.clock += self.timer.prefill(lens) * float(self._jitter(1)[0])
        self.steps += 1
        done = []
        for req in batch:
            if self.cache.enabled:
                own = req.hashes[len(req.held):req.prompt_len // self.cfg.block_size]
                taken = self.cache.register(own)
                req.held += taken
                req.blocks -= len(taken)
            req.token_times.append(self.clock)
            self.running.append(req)
            if req.remaining == 0:
                done.append(req)
        for req in done:
            self._finish(req)
        return done

    def _decode(self, batch: list[SimRequest], until: float) -> list[SimRequest]:
        """Decode `batch` once, or many times in bulk when it is the whole running set."""
        b = len(batch)
        ctx0 = sum(r.context for r in batch)
        live0 = sum(r.context for r in self.running)
        steps = min(r.remaining for r in batch) if b == len(self.running) else 1
        # Memory: the first step whose growing live context would overflow the card.
        slope = self.memory.resident_bytes_per_context_token * len(self.running)
        head = self.memory.capacity_bytes - self.memory.forward_peak(b, live0)
        oom_at = 0 if head < 0 else math.floor(head / slope) + 1
        run = min(steps, oom_at)
        durations = self.timer.decode_run(b, ctx0, run) * self._jitter(run)
        ends = self.clock + np.cumsum(durations)
        starts = np.concatenate(([self.clock], ends[:-1]))
        run = min(run, int(np.searchsorted(starts, until, side="right")))
        if run == 0:  # only when the very first step overflows: `until` >= clock here
            self._oom(self.memory.forward_peak(b, live0), f"decode of {b} requests")
            return []
        times = ends[:run].tolist()
        self.peak_bytes = max(self.peak_bytes,
                              self.memory.forward_peak(b, live0 + len(self.running) * (run - 1)))
        self.clock = times[-1]
        self.steps += run
        for req in batch:
            req.token_times.extend(times)
        if b < len(self.running):
            picked = set(map(id, batch))
            self.running = [r for r in self.running if id(r) not in picked] + batch
        done = [r for r in batch if r.remaining == 0]
        for req in done:
            self._finish(req)
        if run == oom_at and not done and steps > run:
            self._oom(self.memory.forward_peak(b, live0 + len(self.running) * run),
                      f"decode of {b} requests")
        return done

    @property
    def submitted(self) -> int:
        """Requests submitted since start, rejected ones included."""
        return self._next_id

    def idle(self) -> bool:
        return not self.running and not self.waiting

    def advance(self, until: float = math.inf) -> list[SimRequest]:
        """Run steps that start no later than `until`; stop after a step that finished requests.

        Returns the requests that finished (possibly none).  The clock ends at the end of the
        last step, or at `until` when the engine had nothing to do.
        """
        while self.failed is None:
            if not self.running:
                first = min((r.arrival for r in self.waiting), default=math.inf)
                if first > until:
                    if until != math.inf:
                        self.clock = max(self.clock, until)
                    return []
                self.clock = max(self.clock, first)
            if self.clock > until:
                return []
            batch = self._pick_prefill()
            if batch:
                done = self._prefill(batch)
            elif self.running:
                # a queued arrival ends a bulk decode run: the next step may be its prefill
                # (the HTTP server queues requests before their simulated arrival comes)
                arrivals = [r.arrival for r in self.waiting if r.arrival > self.clock]
                done = self._decode(self._pick_decode(), min([until, *arrivals]))
                if not done and self.clock >= until:
                    return []
            else:  # unreachable: with nothing running, an arrived head request always fits
                return []
            if done:
                return done
        return []
