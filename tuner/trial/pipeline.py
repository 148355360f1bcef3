"""One adaptive trial: pre-screen, stress-first staged run, confirmation of Pareto entrants.

Why a module of its own: `TrialObjective` (tuner/study/objective.py) owns the Optuna side (budget,
duplicates, `record`); this owns what happens to one config between "the sampler proposed it"
and "here is its TrialResult", so either side can change without the other.

The runner is pluggable (`Runner`): `tuner.trial.run.run_trial` launches a real or simulated server;
`tuner.trial.inprocess.InProcessRunner` drives the simulator in-process (benchmarks, tests).
Both take
the cells in the order given and honour `keep_going`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.bench.records import Cell
from tuner.bench.runner import CellResult
from tuner.search.model import ModelInfo
from tuner.search.objectives import Objective
from tuner.server.outcome import Outcome
from tuner.study.objective import suggest
from tuner.study.pareto import on_front
from tuner.study.record import Stage, TrialRecord, records
from tuner.trial.context import TrialContext
from tuner.trial.kv_calibration import measured, proven
from tuner.trial.kv_share import KV_ROLES, KvEdge, kv_param, others_key
from tuner.trial.memory_estimate import Estimate, Knobs, estimate, knobs_from_params
from tuner.trial.prescreen import calibrated_runtime, decide, estimate_attr, memory_constraint
from tuner.trial.result import KeepGoing, TrialResult, median_metrics, more_runs
from tuner.trial.run import run_trial
from tuner.trial.stages import Verdict, metrics_of_rows, screen_verdict, stress_order

Runner = Callable[..., TrialResult]  # (ctx, params, trial_dir, cells=..., keep_going=...)


@dataclass
class AdaptivePipeline:
    """Settings of the adaptive loop; `run` turns one config into one TrialResult."""

    ctx: TrialContext
    objectives: list[Objective]
    model: ModelInfo
    capacity: int | None              # GPU bytes; None disables the pre-screen
    runner: Runner = run_trial
    prescreen: bool = True
    screen_cells: int = 3             # 0: every config runs the full matrix
    confirm: int = 0                  # extra runs of each config that enters the Pareto front
    kv_share: bool = False            # sample the KV knob as a share of the headroom (kv_share)
    log: Callable[[str], None] = field(default=lambda line: None)

    @cached_property
    def kv_edge(self) -> KvEdge | None:
        """The share-to-KV renderer, when it is on and the space and card allow it: one for
        the pipeline's life, shared with the proposals, whose pinned pools (flips at the
        incumbent's pool) it renders.  A new one per call lost them: a pool above
        the edge came back as share 1, the edge."""
        if not self.kv_share or self.capacity is None or kv_param(self.ctx.space) is None:
            return None
        return KvEdge(self.ctx.space, self.model, self.capacity, tuple(self.ctx.workload.cells))

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """The trial's config: every knob from the sampler, the KV knob through the share."""
        edge = self.kv_edge
        if edge is None:
            return suggest(trial, self.ctx)
        params = suggest(trial, self.ctx, exclude=(edge.param.name,))
        return edge.suggest(trial, params, records(trial.study, (TrialState.COMPLETE,)))

    def run(self, study: optuna.Study, params: dict[str, Any], trial_dir: Path) -> TrialResult:
        trials = records(study, (TrialState.COMPLETE,))
        knobs, est = self._estimate(trials, params)
        return self._noted(self._run(trials, params, trial_dir, est, knobs), est, knobs)

    def rerun(self, study: optuna.Study, params: dict[str, Any], trial_dir: Path) -> TrialResult:
        """One more full-matrix run of a config the study measured: no pre-screen (it ran), no
        screening cells (its figures are what is being checked)."""
        knobs, est = self._estimate(records(study, (TrialState.COMPLETE,)), params)
        cells = stress_order(self.ctx.workload.cells, est)
        result = self.runner(self.ctx, params, trial_dir, cells=cells)
        result.cell_order = [c.key for c in cells]
        return self._noted(result, est, knobs)

    def _estimate(self, trials: list[TrialRecord],
                  params: dict[str, Any]) -> tuple[Knobs, Estimate]:
        knobs = knobs_from_params(self.ctx.space, params)
        return knobs, estimate(self.model, knobs, list(self.ctx.workload.cells),
                               runtime=calibrated_runtime(trials, knobs.cuda_graph))

    def _noted(self, result: TrialResult, est: Estimate, knobs: Knobs) -> TrialResult:
        """The result with the memory estimate it ran under (the pre-screen learns from it)."""
        result.memory = estimate_attr(est, knobs.cuda_graph)
        result.predicted_peak_bytes = est.need
        if self.capacity is not None:
            result.capacity_bytes = self.capacity
            result.constraints["memory"] = memory_constraint(est.need, self.capacity,
                                                             result.outcome.kind)
        return result

    def _run(self, trials: list[TrialRecord], params: dict[str, Any], trial_dir: Path,
             est: Estimate, knobs: Knobs) -> TrialResult:
        if self.prescreen and self.capacity is not None and knobs.kv_tokens is not None:
            # Without a KV role the estimate knows neither the pool nor the largest forward, so
            # it has no business skipping anything (seen on the H200: every config skipped).
            edge = self.kv_edge
            # what the proposals' model, reading the nearest runs' scales, says fits is not
            # overruled by evidence carried from farther configs
            calibrated, near = edge.screen_evidence(params, trials, est) \
                if edge is not None else (None, frozenset[str]())
            verdict = decide(est, self.capacity, trials, calibrated, knobs.cuda_graph,
                             proven(trials, self.capacity), measured(trials), near,
                             self._siblings(trials, params))
            if verdict.skip:
                return self._skipped(params, verdict.reason)
        cells = stress_order(self.ctx.workload.cells, est)
        screen: dict[str, Any] = {}
        result = self.runner(self.ctx, params, trial_dir, cells=cells,
                             keep_going=self._screener(trials, len(cells), screen))
        result.cell_order = [c.key for c in cells]
        if "verdict" in screen and not screen["verdict"].go_on:
            return self._screened_out(result, screen["verdict"], screen["metrics"])
        if self.screen_cells and len(result.cells) >= self.screen_cells:
            result.screen_metrics = metrics_of_rows(result.cells[:self.screen_cells])
        if result.outcome.feasible and len(result.cells) == len(cells) and self.confirm > 0:
            values = [o.value(result.metrics) for o in self.objectives]
            if on_front(values, trials, self.objectives):
                result = self._confirm(result, params, trial_dir, cells)
        return result

    def _siblings(self, trials: Sequence[TrialRecord],
                  params: dict[str, Any]) -> list[TrialRecord]:
        """The runs of `params`' knobs at other pools (the KV knob and its share aside)."""
        kv = next((p.name for p in self.ctx.space.parameters if p.role in KV_ROLES), None)
        mine = others_key(params, kv)
        return [t for t in trials if others_key(t.params, kv) == mine]

    def _screener(self, trials: Sequence[TrialRecord], n_cells: int,
                  out: dict[str, Any]) -> KeepGoing | None:
        """The keep_going callback: after the screening cells, decide whether to go on."""
        k = self.screen_cells
        if k <= 0 or 2 * k > n_cells:  # saving under half the matrix is not worth
            return None                # dropping the best config on an estimate

        def keep_going(results: list[CellResult]) -> bool:
            if len(results) != k:
                return True
            metrics = metrics_of_rows([{"metrics": r.metrics} for r in results])
            verdict = screen_verdict(metrics, trials, self.objectives, self.ctx.workload.slo or {})
            out.update(verdict=verdict, metrics=metrics)
            return verdict.go_on

        return keep_going

    def _screened_out(self, result: TrialResult, verdict: Verdict,
                      measured: dict[str, float]) -> TrialResult:
        self.log(f"screened out: {verdict.reason}")
        return replace(result, metrics=verdict.estimate, stage=Stage.SCREEN,
                       screen_metrics=measured, estimated=True,
                       outcome=Outcome(result.outcome.kind, f"screened out: {verdict.reason} "
                                       "(metrics are full-matrix estimates)"))

    def _skipped(self, params: dict[str, Any], reason: str) -> TrialResult:
        self.log(f"skipped: {reason}")
        argv, env = self.ctx.render(params, in_process=True)
        return TrialResult(outcome=Outcome("skipped", f"pre-screen: {reason}"), metrics={},
                           cells=[], argv=argv, env=env, wall_s=0.0, stage=Stage.PRESCREEN)

    def _confirm(self, first: TrialResult, params: dict[str, Any], trial_dir: Path,
                 cells: list[Cell]) -> TrialResult:
        """Re-run a Pareto entrant `confirm` times; the trial's metrics become the medians.
        A repeat that fails makes the whole trial fail with that repeat's outcome
        (`more_runs`)."""
        done, failed = more_runs(
            self.confirm, lambda i: self.runner(self.ctx, params, trial_dir / f"repeat-{i}",
                                                cells=cells), lambda i: f"repeat {i}")
        repeats = [first.metrics, *(r.metrics for r in done)]
        if failed is not None:
            return replace(failed, cell_order=first.cell_order,
                           screen_metrics=first.screen_metrics, repeats=repeats)
        return replace(first, metrics=median_metrics(repeats), repeats=repeats,
                       first_run_metrics=first.metrics)
