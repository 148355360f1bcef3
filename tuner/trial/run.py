"""Run one server config end to end: launch, wait for health, drive the cells, classify.

This is the only place where a server process lives.  Whatever happens (an OOM, a hang, an
exception in the tuner, Ctrl-C) the server is stopped before `run_trial` returns or raises.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.bench.capacity_http import http_capacity
from tuner.bench.records import Cell
from tuner.bench.runner import CellResult, run_cells
from tuner.server.gpu import foreign_pids, read_gpu, wait_until_free
from tuner.server.memwatch import MemoryWatch, watching
from tuner.server.outcome import Evidence, classify
from tuner.server.process import ServerProcess
from tuner.server.start import start_server
from tuner.trial.context import TrialContext
from tuner.trial.result import KeepGoing, TrialResult, aggregate, cell_row, drive


def _capacity(ctx: TrialContext, server: ServerProcess, cells: list[Cell]) -> dict[str, Any] | None:
    """The workload's capacity search, on the server the cells just ran on (full matrix only)."""
    spec = ctx.workload.capacity
    if spec is None or cells != list(ctx.workload.cells):
        return None
    result = http_capacity(
        server.base_url, cells[spec.cell], spec, ctx.workload.slo, seed=ctx.workload.seed,
        model_name=ctx.model_name or ctx.space.server.model_name or ctx.model_dir,
        api=ctx.space.server.api, request_extra=ctx.space.server.request_extra,
        tokenizer_dir=ctx.model_dir, health_url=server.health_url,
        stall_timeout_s=ctx.stall_timeout_s / ctx.scale)
    return result.record()


def run_trial(ctx: TrialContext, params: dict[str, Any], trial_dir: Path,
              cells: list[Cell] | None = None,
              on_cell: Callable[[CellResult], None] | None = None,
              keep_going: KeepGoing | None = None) -> TrialResult:
    """Launch the server with `params`, drive `cells` (default: the workload's), classify.

    `keep_going(results so far)` is asked after each healthy cell; False ends the run there
    (staged screening: the server is already up, so the rest of the matrix costs no new launch).
    """
    t0 = time.monotonic()
    trial_dir.mkdir(parents=True, exist_ok=True)
    cells = list(ctx.workload.cells if cells is None else cells)
    results: list[CellResult] = []
    idle_bytes = None
    capacity = None
    health_failed, flaps = False, 0
    _wait_for_gpu(ctx)
    started = start_server(ctx, params, trial_dir, cells)
    server = started.server
    try:
        if started.healthy:
            idle = read_gpu(ctx.gpu_index) if ctx.gpu_index is not None else None
            if idle is not None:  # the runtime overhead the pre-screen calibrates on
                idle_bytes = idle.used_bytes - ctx.gpu_baseline_bytes
            with watching(ctx.gpu_index, ctx.gpu_baseline_bytes) as watch:
                results = _drive_server(ctx, server, cells, trial_dir / "cells.jsonl",
                                        on_cell, keep_going, watch)
            if len(results) == len(cells) and not any(r.error_class for r in results):
                capacity = _capacity(ctx, server, cells)
            health_failed, flaps = server.settled_health()
        exit_code = server.exit_code
    finally:
        server.stop()
    foreign = foreign_pids(ctx.gpu_index, ctx.gpu_known_pids) if ctx.gpu_index is not None else ()
    if not foreign:
        _wait_for_gpu(ctx)
    evidence = Evidence(log_text=server.log_text(), became_healthy=started.healthy,
                        exit_code=exit_code, health_failed=health_failed,
                        cell_errors=tuple(r.error_class for r in results if r.error_class),
                        first_error=next((r.error[:200] for r in results if r.error), ""),
                        health_flaps=flaps + sum(r.health_flaps for r in results),
                        foreign_pids=foreign)
    metrics = aggregate(results)
    if capacity is not None:
        metrics["capacity_rps"] = capacity["capacity_rps"]
    return TrialResult(outcome=classify(evidence, ctx.space.failure_patterns),
                       metrics=metrics, cells=[cell_row(r) for r in results],
                       argv=started.argv, env=started.env, wall_s=time.monotonic() - t0,
                       idle_bytes=idle_bytes, ports_taken=started.ports_taken or None,
                       peak_bytes=max((r.peak_bytes for r in results if r.peak_bytes is not None),
                                      default=None),
                       capacity_search=capacity)


def _wait_for_gpu(ctx: TrialContext) -> None:
    if ctx.gpu_index is not None:
        wait_until_free(ctx.gpu_index, ctx.gpu_baseline_bytes, ctx.gpu_wait_s,
                        known_pids=ctx.gpu_known_pids)


def _drive_server(ctx: TrialContext, server: ServerProcess, cells: list[Cell], sink_path: Path,
                  on_cell: Callable[[CellResult], None] | None,
                  keep_going: KeepGoing | None,
                  watch: MemoryWatch | None = None) -> list[CellResult]:
    """The cells against the running server, each row also appended to cells.jsonl at once,
    with the memory high-water mark at the cell's end where `watch` reads one."""
    model_name = ctx.model_name or ctx.space.server.model_name or ctx.model_dir

    def run_one(i: int, cell: Cell) -> CellResult:
        res = run_cells(
            server.base_url, [cell], model_name=model_name, api=ctx.space.server.api,
            request_extra=ctx.space.server.request_extra, tokenizer_dir=ctx.model_dir,
            health_url=server.health_url, seed=ctx.workload.seed + i,
            warmup=ctx.workload.warmup if i == 0 else None,
            stall_timeout_s=ctx.stall_timeout_s / ctx.scale)[0]
        if watch is not None:
            res.peak_bytes = watch.mark()
        return res

    with open(sink_path, "w") as sink:
        def record(res: CellResult) -> None:
            sink.write(json.dumps(cell_row(res)) + "\n")
            sink.flush()
            if on_cell is not None:
                on_cell(res)

        return drive(cells, run_one, record, keep_going)
