"""Create a study, or reopen it after checking it was made with the same space and goals.

Why refuse a mismatch: trials sampled from two spaces or judged by two sets of objectives in one
study make its Pareto set meaningless, and the sampler would learn from both.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import optuna

from tuner import __version__
from tuner.errors import UsageError
from tuner.search.objectives import Objective, unit
from tuner.study.study_record import StudyInfo, write_study_info
from tuner.trial.context import HOST, TrialContext

DEPLOY_PORT = 8000


def create_or_load(name: str, storage: optuna.storages.BaseStorage, ctx: TrialContext,
                   objectives: list[Objective], sampler: optuna.samplers.BaseSampler,
                   gpu_desc: str, inputs: Mapping[str, Any] | None = None) -> optuna.Study:
    """The study `name`, created with this context's record if it is new; `inputs` (the
    workload file, simulator profile, memory cap as given) let `ablate` reuse them."""
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                directions=[o.direction for o in objectives], load_if_exists=True)
    stored = StudyInfo.of(study)
    fp = ctx.space.fingerprint()
    if stored.fingerprint not in (None, fp):
        raise UsageError(f"study '{name}' exists with a different search space "
                         f"({stored.space_file}); use another --study name")
    labels = [o.label for o in objectives]
    if stored.objectives and list(stored.objectives) != labels:
        raise UsageError(f"study '{name}' exists with objectives {list(stored.objectives)}; "
                         "use the same objectives or another --study name")
    _check_workload_and_sampler(name, stored, ctx.workload.name, type(sampler).__name__)
    if stored.fingerprint is None:
        study.set_metric_names([metric_name(o) for o in objectives])
        space = ctx.space
        write_study_info(study, StudyInfo(
            space=space.name, space_file=str(space.path), workload=ctx.workload.name,
            sampler=type(sampler).__name__, **(inputs or {}),
            model=ctx.model_dir, gpu=gpu_desc, simulated=ctx.simulate is not None,
            objectives=labels, slo=dict(ctx.workload.slo or {}), tuner_version=__version__,
            flag_params={p.name: p.flag for p in space.parameters if p.flag},
            env_params={p.name: p.env for p in space.parameters if p.env},
            launch_command=list(space.server.command), **_deployment(ctx), fingerprint=fp))
    return study


def _check_workload_and_sampler(name: str, stored: StudyInfo, workload: str, sampler: str) -> None:
    """Another workload measures other numbers: refused, as a different space is.  Another
    sampler only proposes differently, so it is allowed, but said: the user may have meant a new
    study (`--study` left out reuses the default name)."""
    if stored.fingerprint is None:
        return
    if stored.workload not in (None, workload):
        raise UsageError(f"study '{name}' exists with workload '{stored.workload}', not "
                         f"'{workload}'; use the same --workload or another --study name")
    if stored.sampler not in (None, sampler):
        print(f"warning: study '{name}' was made with {stored.sampler}; continuing it with "
              f"{sampler} (give another --study name for a separate study)", file=sys.stderr)


def _deployment(ctx: TrialContext) -> dict[str, Any]:
    """The real server's command and fixed flags, rendered once for the workload, so that
    best.env can say how to launch the tuned server even when the study ran on the simulator.
    Port 8000 stands in for the trials' random ports."""
    out_len = max(c.output_len for c in ctx.workload.cells)
    argv, env = ctx.space.render({}, model=ctx.model_dir, host=HOST, port=DEPLOY_PORT,
                                 max_output_len=out_len)
    head = len(ctx.space.server.command)
    return {"server_head": argv[:head], "fixed_flags": argv[head:], "fixed_env": env}


def metric_name(o: Objective) -> str:
    """The name optuna-dashboard shows for an objective: the metric and its unit."""
    return f"{o.metric} ({unit(o.metric)})" if unit(o.metric) else o.metric
