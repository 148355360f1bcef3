"""`tuner tune`: run (or resume) a study, then write best.env and report.html.

`--trials N` is the number of measured trials (configs run on the server; pre-screen skips do
not count) the study should hold, not a number to add: the
same command run again after a crash or Ctrl-C continues where the study stopped (`--resume`
says so explicitly and refuses to start a new study).  Every input is checked before the study
is touched, so a mistake leaves nothing behind.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from tuner.commands.optuna_log import quiet_interrupts
from tuner.commands.tune_messages import plan_text, print_bounds, print_summary, progress_text
from tuner.commands.tune_options import (
    add_adaptive_args,
    add_run_args,
    capacity_bytes,
    check_adaptive_args,
    default_on_grid,
    pick_runs,
    warm_start,
)
from tuner.errors import UsageError
from tuner.output import envfile, export
from tuner.output.report import store_in_dashboard, write_report
from tuner.output.result import result_lines
from tuner.output.select import choose
from tuner.paths import shipped, space_file
from tuner.search.bounds import resolve_space, resolved_bounds
from tuner.search.model import ModelInfo, load_model_info
from tuner.search.objectives import DEFAULT_OBJECTIVES, Objective, check_metric, parse_objectives
from tuner.search.space import SearchSpace
from tuner.search.space_file import load_space
from tuner.search.workload import load_workload
from tuner.server import preflight
from tuner.server.gpu import GpuState, read_gpu, visible_gpu_index
from tuner.server.memcap import CapSetup, memory_cap
from tuner.sim.nvml import SIM_NVML_ENV
from tuner.study.budget import Convergence, finished, run_to_budget
from tuner.study.create import create_or_load
from tuner.study.objective import TrialObjective
from tuner.study.proposals import guided
from tuner.study.record import TrialRecord
from tuner.study.sampler import SAMPLERS, enqueue_grid, make_sampler, run_seed, startup_trials
from tuner.study.storage import STORAGE_HELP, open_storage, sqlite_path, storage_url
from tuner.study.study_record import set_bounds
from tuner.study.workers import parse_gpus, run_workers
from tuner.trial.confirm_pick import confirm_pick
from tuner.trial.context import TrialContext
from tuner.trial.pipeline import AdaptivePipeline

DEFAULT_TIME_SCALE = 25.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="run or resume a tuning study",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model",
        required=True,
        help="model dir with config.json (weights not needed with --simulate)",
    )
    p.add_argument("--space", default="search_spaces/infinilm.yaml",
                   help="search-space YAML, or a shipped space's name from `tuner targets` "
                        "(default: %(default)s)")
    p.add_argument(
        "--workload", default="studies/quick.yaml", help="workload YAML (default: %(default)s)"
    )
    p.add_argument(
        "--simulate",
        metavar="GPU",
        help="run the built-in simulated server with this GPU profile, e.g. rtx4090",
    )
    p.add_argument("--time-scale", type=float, default=DEFAULT_TIME_SCALE,
                   help="simulated seconds per wall second with --simulate (default: %(default)s)")
    p.add_argument("--trials", type=int, default=20,
                   help="configs measured on the server that the study should hold; pre-screen "
                        "skips and repeats of a measured config do not count (see --max-skips) "
                        "(default: %(default)s)")
    p.add_argument("--study", help="study name (default: <space>-<model>-<gpu>)")
    p.add_argument(
        "--studies-dir", default="studies", help="where study folders live (default: %(default)s)"
    )
    p.add_argument("--storage", metavar="URL", help=STORAGE_HELP)
    p.add_argument("--sampler", default="auto", choices=SAMPLERS, help="(default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="sampler seed; a resumed run moves on from it by the trials done "
                        "(default: %(default)s; workers on several hosts: one seed each)")
    p.add_argument(
        "--objective",
        action="append",
        metavar="'max|min METRIC'",
        help="repeatable; default: the workload's, else " + "; ".join(DEFAULT_OBJECTIVES),
    )
    add_run_args(p)
    add_adaptive_args(p)


def _default_study_name(space: str, model: str, simulate: str | None) -> str:
    return f"{space}-{Path(model).name}-{simulate + '-sim' if simulate else 'gpu'}"


def run(args: argparse.Namespace) -> int:
    # Ctrl-C is how a study is stopped and resumed later: take SIGINT back when the process was
    # started from a script's background job, which inherits it ignored
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) == signal.SIG_IGN):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.ExitStack() as stack:  # holds the memory-cap ballast while trials run
        return _run(args, stack)


@dataclass(frozen=True)
class _Setup:
    """What a run of `tune` resolved from its arguments before touching the study."""

    ctx: TrialContext
    model: ModelInfo
    objectives: list[Objective]
    capacity: int | None
    gpu_desc: str


def _setup(args: argparse.Namespace, stack: contextlib.ExitStack) -> _Setup:
    """Check every input and resolve the space; nothing is written yet."""
    if args.trials < 1:
        raise UsageError("--trials must be at least 1")
    if args.time_scale <= 0:
        raise UsageError("--time-scale must be positive")
    preflight.check_model(args.model, simulate=args.simulate is not None)
    check_adaptive_args(args)
    space = load_space(space_file(args.space))
    workload = load_workload(shipped(args.workload))
    model = load_model_info(args.model)
    objectives = parse_objectives(args.objective or workload.objectives or list(DEFAULT_OBJECTIVES))
    for metric in (workload.slo or {}):
        check_metric(metric, f"{args.workload}: slo")
    if workload.capacity is None and any(o.metric == "capacity_rps" for o in objectives):
        raise UsageError(f"{args.workload}: objective capacity_rps needs a capacity: section")
    simulated_card = bool(os.environ.get(SIM_NVML_ENV))  # a simulated NVML stands for the GPU
    gpu_index = args.gpu_index if args.gpu_index is not None else \
        (None if args.simulate and not simulated_card else visible_gpu_index())
    gpu_state = read_gpu(gpu_index) if gpu_index is not None else None
    capacity = capacity_bytes(args, gpu_state)
    space = resolve_space(space, model, capacity, workload.cells)
    base = TrialContext(space=space, workload=workload, model_dir=args.model,
                        simulate=args.simulate, time_scale=args.time_scale)
    preflight.check_launch(base)
    if args.gpus:  # each worker applies the cap to its own GPU
        cap = CapSetup(env={}, idle=gpu_state)
    else:
        cap = stack.enter_context(memory_cap(space, args.gpu_memory_cap, gpu_state,
                                             simulate=args.simulate is not None))
    if cap.held_bytes:
        print(f"--gpu-memory-cap {args.gpu_memory_cap}: a ballast process holds "
              f"{cap.held_bytes / 2**30:.1f} GiB of the GPU while trials run; servers find "
              f"{cap.free_bytes / 2**30:.1f} GiB free")
    ctx = dataclasses.replace(base, stall_timeout_s=args.stall_timeout,
                              startup_timeout_s=args.startup_timeout, gpu_wait_s=args.gpu_wait,
                              **cap.trial_fields())
    return _Setup(ctx, model, objectives, capacity, _gpu_desc(args, gpu_state))


def _gpu_desc(args: argparse.Namespace, gpu_state: GpuState | None) -> str:
    if args.simulate:
        return f"{args.simulate} (simulated)"
    desc = gpu_state.describe if gpu_state else "unknown GPU (NVML unavailable)"
    return desc + (f", capped at {args.gpu_memory_cap}" if args.gpu_memory_cap else "")


def _open_study(args: argparse.Namespace, setup: _Setup, name: str, url: str) -> optuna.Study:
    db = sqlite_path(url)
    if args.resume and db is not None and not db.is_file():
        raise UsageError(f"--resume: no study '{name}' ({db} not found)")
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    storage = open_storage(url)
    if args.resume and name not in {s.study_name for s in storage.get_all_studies()}:
        raise UsageError(f"--resume: no study '{name}' in {url}")
    sampler = make_sampler(args.sampler, run_seed(storage, name, args.seed, args.gpu_index),
                           args.trials)
    inputs = {"workload_file": str(shipped(args.workload).resolve()), "simulate": args.simulate,
              "gpu_memory_cap": args.gpu_memory_cap}
    study = create_or_load(name, storage, setup.ctx, setup.objectives, sampler, setup.gpu_desc,
                           inputs)
    set_bounds(study, resolved_bounds(setup.ctx.space))
    return study


def _run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress bar reports trials
    quiet_interrupts()
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="optuna")
    gpus = parse_gpus(args.gpus) if args.gpus else None
    setup = _setup(args, stack)
    name = args.study or _default_study_name(setup.ctx.space.name, args.model, args.simulate)
    studies_dir = Path(args.studies_dir)
    url = storage_url(studies_dir, name, args.storage)
    study = _open_study(args, setup, name, url)
    if gpus:
        code = run_workers([*_argv_without_gpus(args.cli_argv), "--confirm-pick", "0"], gpus)
        if pick_runs(args):
            print("--gpus: the pick was not confirmed; to confirm it on one GPU, run the same "
                  "command without --gpus (the study's budget is spent, so only the pick runs)")
        return code
    pipeline = AdaptivePipeline(setup.ctx, setup.objectives, setup.model, setup.capacity,
                                prescreen=not args.no_prescreen, screen_cells=args.screen_cells,
                                confirm=args.confirm,
                                kv_share=not args.kv_absolute and args.sampler != "grid")
    study.sampler = guided(study.sampler, pipeline.kv_edge, startup_trials(args.trials),
                           args.seed, limits=setup.ctx.space.limits(),
                           budgets=setup.ctx.space.budgets(), trials=args.trials)
    print_bounds(setup.ctx.space, pipeline)
    queued = warm_start(study, setup.ctx.space, args, url, studies_dir, pipeline)
    if queued:
        print(f"study {name}: {queued} warm-start config(s) queued first")
    target = _grid_target(study, setup.ctx.space, args) if args.sampler == "grid" else args.trials
    done = finished(study)
    print(plan_text(name, done, target, url))
    _optimize(study, setup, pipeline, args, studies_dir / name / "trials", target)
    confirm_pick(study, pipeline, pick_runs(args), studies_dir / name / "trials", args.pick)
    print_summary(study)
    if not args.no_export:
        _export(study, studies_dir / name, args.pick)
    return 0


def _grid_target(study: optuna.Study, space: SearchSpace, args: argparse.Namespace) -> int:
    """Queue the grid's first --trials points; a budget past the grid is capped to its size."""
    default = None if args.no_defaults else default_on_grid(space)
    size = enqueue_grid(study, space, args.seed, args.trials, default)
    if args.trials > size:
        print(f"--sampler grid: the grid has {size} points; running {size}, not {args.trials}")
    return min(args.trials, size)


def _optimize(study: optuna.Study, setup: _Setup, pipeline: AdaptivePipeline,
              args: argparse.Namespace, trials_dir: Path, target: int) -> None:
    objective = TrialObjective(ctx=setup.ctx, objectives=setup.objectives, trials_dir=trials_dir,
                               max_trials=target, pipeline=pipeline)
    bar = tqdm(total=target, initial=finished(study), unit="trial", dynamic_ncols=True)
    metric = setup.objectives[0].metric

    def on_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if trial.state == TrialState.COMPLETE and TrialRecord.of(trial).budgeted:
            bar.update(1)
        bar.set_postfix_str(progress_text(study, trial, metric))

    stop = Convergence(args.patience) if args.patience else None
    # Optuna's warnings (a trial interrupted or failed) on lines of their own above the bar, not
    # after its text: a log that drops the bar's lines (the H200 records' run.sh) lost them
    try:
        with logging_redirect_tqdm([logging.getLogger("optuna")]):
            run_to_budget(study, objective, target, trials_dir, callbacks=[on_trial],
                          max_skips=args.max_skips or 2 * target, convergence=stop)
    finally:
        bar.close()
    if stop is not None and stop.fired:
        print(stop.fired)


def _export(study: optuna.Study, folder: Path, pick: str) -> None:
    """best.env of the `pick` of the feasible Pareto set, and report.html (also in the
    dashboard)."""
    try:
        choice = choose(study, pick)
    except UsageError as exc:
        choice = None
        print(f"no best.env written: {exc}", file=sys.stderr)
    if choice is not None:
        cfg = export.build(study, choice)
        envfile.write_atomic(folder / "best.env", export.render(cfg, "env"))
        print("\n".join(result_lines(study, choice, cfg)))
        print(f"wrote {folder / 'best.env'} (trial {choice.trial.number})")
    figs = write_report(folder / "report.html", study, choice)
    store_in_dashboard(study, figs)
    print(f"wrote {folder / 'report.html'}")


def _argv_without_gpus(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--gpus":
            skip = True
            continue
        if a.startswith("--gpus="):
            continue
        out.append(a)
    return out
