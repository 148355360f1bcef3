"""Run one server config end to end: launch, wait for health, drive the cells, classify.

This is the only place where a server process lives.  Whatever happens (an OOM, a hang, an
exception in the tuner, Ctrl-C) the server is stopped before `run_trial` returns or raises.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.bench.records import Cell
from tuner.bench.runner import CellResult, run_cells
from tuner.server.gpu import read_gpu, wait_until_free
from tuner.server.process import ServerProcess, free_port
from tuner.server.outcome import Evidence, Outcome, classify
from tuner.search.space import SearchSpace
from tuner.search.workload import Workload

HOST = "127.0.0.1"
KeepGoing = Callable[[list[CellResult]], bool]


@dataclass(frozen=True)
class TrialContext:
    """Everything about a study that does not change from trial to trial."""

    space: SearchSpace
    workload: Workload
    model_dir: str
    simulate: str | None = None          # GPU profile name when running the simulator
    time_scale: float = 1.0              # simulated seconds per wall second (simulator only)
    stall_timeout_s: float = 60.0        # no token on any stream for this long = hang (server time)
    startup_timeout_s: float | None = None
    model_name: str | None = None
    gpu_index: int | None = None         # NVML index of the real GPU to check between trials
    gpu_baseline_bytes: int = 0          # its memory use when idle
    gpu_known_pids: tuple[int, ...] = () # processes of the tuner's own on it (a memory-cap ballast)
    gpu_wait_s: float = 300.0
    extra_env: dict[str, str] = field(default_factory=dict)  # added to every server's environment


@dataclass
class TrialResult:
    outcome: Outcome
    metrics: dict[str, float]
    cells: list[dict[str, Any]]
    argv: list[str]
    env: dict[str, str]
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    constraints: dict[str, float] = field(default_factory=dict)  # extra Optuna constraints (> 0: infeasible)


def aggregate(cells: list[CellResult]) -> dict[str, float]:
    """One set of figures for the whole matrix.

    Throughputs are totals over total time (a long cell weighs more, as on a real server);
    latency percentiles are the worst cell's (an SLO must hold in every cell); means are means.
    """
    done = [c for c in cells if c.metrics]
    if not done:
        return {}
    total_time = sum(c.metrics["duration"] for c in done)
    out: dict[str, float] = {"duration": total_time}
    for key in ("total_output_tokens", "total_input_tokens", "completed", "failed"):
        out[key] = sum(c.metrics.get(key, 0) for c in done)
    out["output_throughput"] = out["total_output_tokens"] / max(total_time, 1e-9)
    out["total_token_throughput"] = (out["total_output_tokens"] + out["total_input_tokens"]) / max(total_time, 1e-9)
    out["request_throughput"] = out["completed"] / max(total_time, 1e-9)
    for key in done[0].metrics:
        if key.endswith("_ms"):
            vals = [c.metrics[key] for c in done if key in c.metrics]
            out[key] = max(vals) if not key.startswith("mean_") else sum(vals) / len(vals)
    return out


def _cell_row(res: CellResult) -> dict[str, Any]:
    c = res.cell
    return {"cell": {"concurrency": c.concurrency, "input_len": c.input_len,
                     "output_len": c.output_len, "num_prompts": c.num_prompts,
                     "duration_s": c.duration_s, "request_rate": c.request_rate, "key": c.key},
            "metrics": res.metrics, "error_class": res.error_class, "error": res.error}


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
    port = free_port(HOST)
    scale = ctx.time_scale if ctx.simulate else 1.0
    argv, env = ctx.space.render(
        params, model=ctx.model_dir, host=HOST, port=port,
        max_output_len=max(c.output_len for c in cells), simulate=ctx.simulate,
        extra_placeholders={"time_scale": f"{scale:g}"})
    env = {**ctx.extra_env, **env}
    (trial_dir / "argv.json").write_text(json.dumps({"argv": argv, "env": env}, indent=1))
    server = ServerProcess(argv, env, host=HOST, port=port,
                           health_path=ctx.space.server.health_path,
                           log_path=trial_dir / "server.log", record_path=trial_dir / "server.json")
    results: list[CellResult] = []
    extra: dict[str, Any] = {}
    healthy = False
    health_failed = False
    if ctx.gpu_index is not None:
        wait_until_free(ctx.gpu_index, ctx.gpu_baseline_bytes, ctx.gpu_wait_s,
                        known_pids=ctx.gpu_known_pids)
    with server:
        startup = ctx.startup_timeout_s or ctx.space.server.startup_timeout_s
        healthy = server.wait_healthy(startup / scale if ctx.simulate else startup)
        if healthy:
            idle = read_gpu(ctx.gpu_index) if ctx.gpu_index is not None else None
            if idle is not None:  # the runtime overhead the pre-screen calibrates on
                extra["idle_bytes"] = idle.used_bytes - ctx.gpu_baseline_bytes
            with open(trial_dir / "cells.jsonl", "w") as sink:
                for i, cell in enumerate(cells):
                    res = run_cells(
                        server.base_url, [cell],
                        model_name=ctx.model_name or ctx.space.server.model_name or ctx.model_dir,
                        api=ctx.space.server.api, request_extra=ctx.space.server.request_extra,
                        tokenizer_dir=ctx.model_dir, health_url=server.health_url,
                        seed=ctx.workload.seed + i,
                        warmup=ctx.workload.warmup if i == 0 else None,
                        stall_timeout_s=ctx.stall_timeout_s / scale)[0]
                    results.append(res)
                    sink.write(json.dumps(_cell_row(res)) + "\n")
                    sink.flush()
                    if on_cell is not None:
                        on_cell(res)
                    if res.error_class is not None:
                        break  # stress cells run first: the first failure decides the trial
                    if keep_going is not None and i + 1 < len(cells) and not keep_going(results):
                        break
            state = server.health()
            health_failed = state.alive and state.status != 200
        exit_code = server.exit_code
    if ctx.gpu_index is not None:
        wait_until_free(ctx.gpu_index, ctx.gpu_baseline_bytes, ctx.gpu_wait_s,
                        known_pids=ctx.gpu_known_pids)
    evidence = Evidence(log_text=server.log_text(), became_healthy=healthy, exit_code=exit_code,
                        health_failed=health_failed,
                        cell_errors=tuple(r.error_class for r in results if r.error_class),
                        first_error=next((r.error[:200] for r in results if r.error), ""))
    outcome = classify(evidence, ctx.space.failure_patterns)
    return TrialResult(outcome=outcome, metrics=aggregate(results),
                       cells=[_cell_row(r) for r in results], argv=argv, env=env,
                       wall_s=time.monotonic() - t0, extra=extra)
