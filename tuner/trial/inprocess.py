"""A trial runner that drives the simulator in-process instead of launching a server.

Why: benchmarks and tests need thousands of trials through the same objective, constraint,
pre-screen and staging code as `tuner tune`, and a server launch per trial (even a simulated
one over HTTP) costs seconds of wall time.  `InProcessRunner` has `run_trial`'s signature and
returns the same `TrialResult`, classified by the same `tuner.server.outcome.classify` from the
same log lines and stopped by the same cell loop (`tuner.trial.result.drive`), so everything
downstream cannot tell the difference.  It also reports what a real GPU run would cost:
`sim_seconds` (simulated time of the cells it ran).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.bench.capacity import CapacityResult
from tuner.bench.cell_errors import judge_cell
from tuner.bench.records import Cell
from tuner.bench.runner import CellResult
from tuner.server.outcome import Evidence, classify
from tuner.sim import SimCellResult, StartupFailure, simulate
from tuner.sim.capacity_run import sim_capacity
from tuner.trial.context import TrialContext
from tuner.trial.result import KeepGoing, TrialResult, aggregate, cell_row, drive

SimulateFn = Callable[..., list[SimCellResult]]  # tuner.sim.simulate's signature


@dataclass
class InProcessRunner:
    """`run_trial` stand-in: (ctx, params, trial_dir, cells=, keep_going=) -> TrialResult."""

    gpu: str
    seed: int = 0
    simulate_fn: SimulateFn = simulate

    def _capacity_hook(self, ctx: TrialContext, cells: list[Cell],
                       out: list[CapacityResult]) -> dict[str, Any]:
        """simulate()'s `after=`: the workload's capacity search on the engine the cells ran on
        (full matrix only: a screening stage measures no capacity)."""
        spec = ctx.workload.capacity
        if spec is None or cells != list(ctx.workload.cells):
            return {}
        cell, slo = cells[spec.cell], ctx.workload.slo
        return {"after": lambda engine: out.append(
            sim_capacity(engine, cell, spec, slo, self.seed, ctx.space.server.api))}

    def __call__(self, ctx: TrialContext, params: dict[str, Any], trial_dir: Path,
                 cells: Sequence[Cell] | None = None, keep_going: KeepGoing | None = None,
                 on_cell: Callable[[CellResult], None] | None = None) -> TrialResult:
        t0 = time.monotonic()
        cells = list(ctx.workload.cells if cells is None else cells)
        argv, env = ctx.render(params, cells=cells, simulate=self.gpu, in_process=True)
        capacity: list[CapacityResult] = []
        hook = self._capacity_hook(ctx, cells, capacity)
        try:
            sims = self.simulate_fn(ctx.model_dir, self.gpu, argv, env, cells, seed=self.seed,
                                    **hook)
        except StartupFailure as exc:
            ev = Evidence("\n".join(exc.log_lines), became_healthy=False, exit_code=3,
                          health_failed=False, cell_errors=())
            return TrialResult(classify(ev, ctx.space.failure_patterns), {}, [], argv, env,
                               time.monotonic() - t0, sim_seconds=0.0)

        def run_one(i: int, cell: Cell) -> CellResult:
            sim = sims[i]  # the HTTP client sees a dead engine as /health 503: "unhealthy"
            error_class, error = judge_cell(sim.records, "unhealthy" if sim.error_class else None,
                                            sim.error)
            return CellResult(sim.cell, sim.records, sim.duration_s, sim.metrics,
                              error_class, error, peak_bytes=int(sim.peak_bytes))

        results = drive(cells[:len(sims)], run_one, on_cell, keep_going)
        ran = sims[:len(results)]
        failed = any(r.error_class for r in results)
        log = "\n".join(ran[-1].log) if ran else ""
        ev = Evidence(log, became_healthy=True, exit_code=None,
                      health_failed=any(r.error_class == "unhealthy" for r in results),
                      cell_errors=tuple(r.error_class for r in results if r.error_class),
                      first_error=next((r.error[:200] for r in results if r.error), ""))
        metrics = aggregate(results)
        sim_seconds = float(sum(s.duration_s for s in ran))
        found = capacity[0] if capacity and not failed and len(results) == len(cells) else None
        if found is not None:  # a run stopped by screening never reaches the capacity search
            metrics["capacity_rps"] = found.capacity_rps
            sim_seconds += found.cost_s
        return TrialResult(
            classify(ev, ctx.space.failure_patterns), metrics,
            [cell_row(r) for r in results], argv, env, time.monotonic() - t0,
            sim_seconds=sim_seconds,
            peak_bytes=int(max(s.peak_bytes for s in ran)) if ran else None,
            idle_bytes=int(ran[0].idle_bytes) if ran else None,
            capacity_search=found.record() if found is not None else None)
