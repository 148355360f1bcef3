"""In-process simulation: a config (argv + env, what the HTTP server would get) on workload cells.

No HTTP and no wall clock: the closed-loop (or Poisson open-loop) clients live in the same event
loop as the engine, so a 30-cell matrix takes seconds.  Cells run one after another on one engine,
as a trial drives one server; once the engine has died every later cell reports "oom" at once
(the HTTP client would see /health 503).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tuner.bench.metrics import cell_metrics
from tuner.bench.prompts import PromptMaker
from tuner.bench.records import Cell, CellResult, RequestRecord
from tuner.bench.sources import RequestSpec
from tuner.search.model import load_model_info
from tuner.sim.config import parse_config
from tuner.sim.engine import Engine, SimRequest
from tuner.sim.prefix_cache import segment_block_hashes
from tuner.sim.profiles import get_profile
from tuner.sim.prompts import CHAT_TEMPLATE_TOKENS
from tuner.sim.turns import ChatFeed, Watch, drive_turns


@dataclass
class SimCellResult(CellResult):
    """One cell's outcome in simulated seconds, plus the engine's memory figures."""

    peak_bytes: int = 0
    capacity_bytes: int = 0
    idle_bytes: int = 0
    log: list[str] = field(default_factory=list)


def to_record(req: SimRequest, failure: str | None,
              turn_of: tuple[int, int] | None = None) -> RequestRecord:
    """The request as a client would have recorded it, in simulated seconds."""
    rec = RequestRecord(send_time=req.arrival, token_times=req.token_times,
                        prompt_tokens=req.prompt_len, completion_tokens=req.generated,
                        turn_of=turn_of)
    if req.error:
        rec.error, rec.error_class = req.error, "rejected"
    elif not req.finished:
        rec.error, rec.error_class = failure or "unfinished", "oom"
    return rec


class RequestFeed:
    """The i-th request of a cell: its lengths, block hashes and (traces) arrival offset; a
    multi-turn cell's turns come from `chats` instead (tuner.sim.turns)."""

    def __init__(self, cell: Cell, seed: int, template: int, block_size: int,
                 caching: bool) -> None:
        self.template = template
        self.specs = cell.source.requests(seed, PromptMaker(None)) if cell.source else None
        self.default = RequestSpec(cell.input_len, cell.output_len)
        self.trace = self.specs is not None and self.specs[0].arrival_s is not None
        self.block_size = block_size if caching else 0
        self._hashes: dict[int, tuple[int, ...]] = {}
        self.chats = ChatFeed(self.specs, cell, template, self.block_size) \
            if self.specs and self.specs[0].turn_of is not None else None

    def spec(self, i: int) -> RequestSpec:
        return self.specs[i % len(self.specs)] if self.specs else self.default

    def arrival(self, i: int) -> float:
        """Offset of request i from the cell's start; a trace replayed past its end repeats."""
        specs = self.specs or [self.default]
        span = (specs[-1].arrival_s or 0.0) + 1e-3
        return (i // len(specs)) * span + (specs[i % len(specs)].arrival_s or 0.0)

    def hashes(self, i: int) -> tuple[int, ...]:
        spec = self.spec(i)
        if not self.block_size or not spec.segments:
            return ()
        key = i % len(self.specs) if self.specs else 0
        if key not in self._hashes:
            segs = (("<template>", self.template), *spec.segments)
            self._hashes[key] = tuple(segment_block_hashes(segs, self.block_size))
        return self._hashes[key]




def run_cell(engine: Engine, cell: Cell, feed: RequestFeed, rng: np.random.Generator,
             log: list[str], watch: Watch | None = None) -> SimCellResult:
    """Drive one cell like `vllm bench serve --max-concurrency`: closed loop (a new request as a
    slot frees), Poisson arrivals at `request_rate`, or a trace's own arrival times; at most
    `concurrency` in flight, and a request that arrives while every slot is busy is sent when
    one frees.  `watch` may end the cell early: what is still queued or running is aborted."""
    start = engine.clock
    if feed.chats is not None:
        sent, cut = drive_turns(engine, cell, feed.chats, rng, watch)
        return _result(engine, cell, sent, start, log, cut, feed.chats.turn_of)
    limit = cell.num_prompts if cell.num_prompts is not None else math.inf
    if limit == math.inf and cell.duration_s is None:
        limit = cell.concurrency
    stop = start + cell.duration_s if cell.duration_s is not None else math.inf
    paced = bool(cell.request_rate) or feed.trace
    reqs: list[SimRequest] = []
    in_flight = 0
    next_arrival = slot_free = start + (feed.arrival(0) if feed.trace else 0.0)
    cut = False
    while engine.failed is None:
        may_send = len(reqs) < limit and in_flight < cell.concurrency
        at = max(next_arrival, slot_free) if paced else engine.clock
        if may_send and at <= stop:
            if at <= engine.clock:
                i = len(reqs)
                spec = feed.spec(i)
                req = engine.submit(spec.input_len + feed.template, spec.output_len, at,
                                    feed.hashes(i))
                reqs.append(req)
                in_flight += not req.finished
                if feed.trace:
                    next_arrival = start + feed.arrival(i + 1)
                elif cell.request_rate:
                    next_arrival += rng.exponential(1.0 / cell.request_rate)
                continue
            until = at
        elif in_flight == 0:
            break
        else:
            until = math.inf
        full = in_flight == cell.concurrency
        done = engine.advance(until)
        in_flight -= len(done)
        if done and full:
            slot_free = engine.clock
        if watch is not None and watch(reqs, engine.clock):
            cut = True
            break
    return _result(engine, cell, reqs, start, log, cut, {})


def _result(engine: Engine, cell: Cell, reqs: list[SimRequest], start: float, log: list[str],
            cut: bool, turn_of: Mapping[int, tuple[int, int]]) -> SimCellResult:
    end = max([start] + [r.token_times[-1] for r in reqs if r.token_times])
    if engine.failed is not None or cut:
        end = max(end, engine.clock)
    records = [to_record(r, engine.failed, turn_of.get(r.rid)) for r in reqs]
    if cut:
        engine.abort_all()
        records = [r for r in records if r.error_class != "oom"]  # unfinished: cut, not failed
    return SimCellResult(
        cell=cell, records=records, duration_s=end - start,
        metrics=cell_metrics(records, end - start),
        error_class="oom" if engine.failed else None, error=engine.failed or "",
        peak_bytes=engine.peak_bytes, capacity_bytes=engine.memory.capacity_bytes,
        idle_bytes=engine.memory.idle_bytes, log=list(log),
    )


def open_engine(model_dir: str, gpu: str, argv: Sequence[str], env: Mapping[str, str],
                seed: int = 0, log: list[str] | None = None) -> Engine:
    """The engine `python -m tuner.sim` would run for `argv`/`env` (see `simulate`)."""
    args = list(argv)
    if "--model" not in args:
        args += ["--model", str(model_dir)]
    cfg = parse_config(args, env)
    sink = log if log is not None else []
    return Engine(load_model_info(model_dir), get_profile(gpu, env), replace(cfg, seed=seed),
                  sink.append)


def simulate(model_dir: str, gpu: str, argv: Sequence[str], env: Mapping[str, str],
             cells: Sequence[Cell], seed: int = 0, api: str = "chat",
             after: Callable[[Engine], None] | None = None) -> list[SimCellResult]:
    """Simulate one server config on `cells`, in order, and return one result per cell.

    `argv`/`env` are exactly what `python -m tuner.sim` (or InfiniLM) would get; a leading
    program and a missing `--model` are tolerated (`model_dir` is used).  `gpu` names the
    profile (it overrides `--gpu`); `seed` seeds the jitter and open-loop arrivals (it overrides
    `--seed`).  `api="chat"` counts the chat template in every prompt, as the HTTP server does.
    `after(engine)` runs once the cells are done on a live engine (the capacity search does).
    Raises `tuner.sim.StartupFailure` when the server would not start (its `log_lines` are what
    the real server prints) and `UsageError` for malformed input.
    """
    log: list[str] = []
    engine = open_engine(model_dir, gpu, argv, env, seed, log)
    prompt_extra = CHAT_TEMPLATE_TOKENS if api == "chat" else 0
    rng = np.random.default_rng(seed)
    results = []
    for index, cell in enumerate(cells):
        if engine.failed is not None:
            results.append(SimCellResult(
                cell=cell, records=[], duration_s=0.0, metrics=cell_metrics([], 0.0),
                error_class="oom", error=engine.failed, peak_bytes=engine.peak_bytes,
                capacity_bytes=engine.memory.capacity_bytes, idle_bytes=engine.memory.idle_bytes,
                log=list(log)))
            continue
        feed = RequestFeed(cell, seed + index, prompt_extra, engine.cfg.block_size,
                           engine.cache.enabled)
        results.append(run_cell(engine, cell, feed, rng, log))
    if after is not None and engine.failed is None:
        after(engine)
    return results
