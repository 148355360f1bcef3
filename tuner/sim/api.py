"""In-process simulation: a config (argv + env, what the HTTP server would get) on workload cells.

No HTTP and no wall clock: the closed-loop (or Poisson open-loop) clients live in the same event
loop as the engine, so a 30-cell matrix takes seconds.  Cells run one after another on one engine,
as a trial drives one server; once the engine has died every later cell reports "oom" at once
(the HTTP client would see /health 503).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tuner.bench.metrics import cell_metrics
from tuner.bench.records import Cell, CellResult, RequestRecord
from tuner.search.model import load_model_info
from tuner.sim.config import parse_config
from tuner.sim.engine import Engine, SimRequest
from tuner.sim.profiles import get_profile
from tuner.sim.prompts import CHAT_TEMPLATE_TOKENS


@dataclass
class SimCellResult(CellResult):
    """One cell's outcome in simulated seconds, plus the engine's memory figures."""

    peak_bytes: int = 0
    capacity_bytes: int = 0
    idle_bytes: int = 0
    log: list[str] = field(default_factory=list)


def _record(req: SimRequest, failure: str | None) -> RequestRecord:
    rec = RequestRecord(send_time=req.arrival, token_times=req.token_times,
                        prompt_tokens=req.prompt_len, completion_tokens=req.generated)
    if req.error:
        rec.error, rec.error_class = req.error, "rejected"
    elif not req.finished:
        rec.error, rec.error_class = failure or "unfinished", "oom"
    return rec


def _run_cell(engine: Engine, cell: Cell, prompt_len: int, rng: np.random.Generator,
              log: list[str]) -> SimCellResult:
    """Drive one cell like `vllm bench serve --max-concurrency`: closed loop (a new request as a
    slot frees) or Poisson arrivals at `request_rate`, at most `concurrency` in flight; a request
    that arrives while every slot is busy is sent when one frees."""
    start = engine.clock
    limit = cell.num_prompts if cell.num_prompts is not None else math.inf
    if limit == math.inf and cell.duration_s is None:
        limit = cell.concurrency
    stop = start + cell.duration_s if cell.duration_s is not None else math.inf
    reqs: list[SimRequest] = []
    in_flight = 0
    next_arrival = slot_free = start
    while engine.failed is None:
        may_send = len(reqs) < limit and in_flight < cell.concurrency
        at = max(next_arrival, slot_free) if cell.request_rate else engine.clock
        if may_send and at <= stop:
            if at <= engine.clock:
                req = engine.submit(prompt_len, cell.output_len, at)
                reqs.append(req)
                in_flight += not req.finished
                if cell.request_rate:
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
    end = max([start] + [r.token_times[-1] for r in reqs if r.token_times])
    if engine.failed is not None:
        end = max(end, engine.clock)
    records = [_record(r, engine.failed) for r in reqs]
    return SimCellResult(
        cell=cell, records=records, duration_s=end - start,
        metrics=cell_metrics(records, end - start),
        error_class="oom" if engine.failed else None, error=engine.failed or "",
        peak_bytes=engine.peak_bytes, capacity_bytes=engine.memory.capacity_bytes,
        idle_bytes=engine.memory.idle_bytes, log=list(log),
    )


def simulate(model_dir: str, gpu: str, argv: Sequence[str], env: Mapping[str, str],
             cells: Sequence[Cell], seed: int = 0, api: str = "chat") -> list[SimCellResult]:
    """Simulate one server config on `cells`, in order, and return one result per cell.

    `argv`/`env` are exactly what `python -m tuner.sim` (or InfiniLM) would get; a leading
    program and a missing `--model` are tolerated (`model_dir` is used).  `gpu` names the
    profile (it overrides `--gpu`); `seed` seeds the jitter and open-loop arrivals (it overrides
    `--seed`).  `api="chat"` counts the chat template in every prompt, as the HTTP server does.
    Raises `tuner.sim.StartupFailure` when the server would not start (its `log_lines` are what
    the real server prints) and `UsageError` for malformed input.
    """
    args = list(argv)
    if "--model" not in args:
        args += ["--model", str(model_dir)]
    cfg = parse_config(args, env)
    log: list[str] = []
    engine = Engine(load_model_info(model_dir), get_profile(gpu, env), replace(cfg, seed=seed),
                    log.append)
    prompt_extra = CHAT_TEMPLATE_TOKENS if api == "chat" else 0
    rng = np.random.default_rng(seed)
    results = []
    for cell in cells:
        if engine.failed is not None:
            results.append(SimCellResult(
                cell=cell, records=[], duration_s=0.0, metrics=cell_metrics([], 0.0),
                error_class="oom", error=engine.failed, peak_bytes=engine.peak_bytes,
                capacity_bytes=engine.memory.capacity_bytes, idle_bytes=engine.memory.idle_bytes,
                log=list(log)))
            continue
        results.append(_run_cell(engine, cell, cell.input_len + prompt_extra, rng, log))
    return results
