"""`tuner tune`'s adaptive-search options, kept out of tune.py so both can change independently.

Options: --gpu-memory (the card size the bounds and pre-screen use), --no-prescreen,
--screen-cells, --confirm, --pick, --confirm-pick, --seed-config, --warm-start-from, --no-defaults,
--kv-absolute, --max-skips, --patience.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from tuner.errors import UsageError
from tuner.output.select import PICKS
from tuner.search.bounds import parse_size
from tuner.search.grid import complete_on_grid
from tuner.search.space import SearchSpace
from tuner.search.warmstart import clip_to_space, enqueue, load_seed_config, pareto_configs
from tuner.server.gpu import GpuState
from tuner.sim.profiles import get_profile
from tuner.study.record import DEFAULT_MARK, GIVEN, KV_SHARE, kv_mark
from tuner.study.storage import find_study
from tuner.trial.runnable_default import runnable

if TYPE_CHECKING:
    from tuner.trial.pipeline import AdaptivePipeline


def add_run_args(p: argparse.ArgumentParser) -> None:
    """How each trial's server is run and judged: timeouts, GPUs, memory cap."""
    p.add_argument("--stall-timeout", type=float, default=60.0,
                   help="seconds without any token that count as a hang (default: %(default)s)")
    p.add_argument("--startup-timeout", type=float,
                   help="seconds the server may take to answer /health (default: the space's)")
    p.add_argument("--resume", action="store_true",
                   help="continue an existing study (an error if there is none); the same command "
                        "without --resume also continues it")
    p.add_argument("--no-export", action="store_true", help="skip writing best.env and report.html")
    p.add_argument(
        "--gpus",
        help="comma-separated GPU indices: one worker per GPU on this host, sharing the study",
    )
    p.add_argument("--gpu-index", type=int, help=argparse.SUPPRESS)  # set by --gpus for each worker
    p.add_argument("--gpu-memory-cap", metavar="SIZE",
                   help="tune for a smaller card: cap the server process's GPU memory, e.g. 24GiB "
                        "(servers started through tuner's launchers, e.g. the transformers space)")
    p.add_argument(
        "--gpu-wait",
        type=float,
        default=300.0,
        help="seconds to wait for the GPU to be free before a trial (default: %(default)s)",
    )


def add_adaptive_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu-memory", metavar="SIZE",
                   help="GPU memory for bounds and pre-screen, e.g. 24GiB (default: NVML, or the "
                        "--simulate profile)")
    p.add_argument("--no-prescreen", action="store_true",
                   help="launch every config, even those the memory estimate calls hopeless")
    p.add_argument("--screen-cells", type=int, default=3, metavar="N",
                   help="cells every config runs before the full matrix is spent only on "
                        "configs that could enter the Pareto front; 0: always the full matrix "
                        "(default: %(default)s)")
    p.add_argument("--confirm", type=int, default=0, metavar="N",
                   help="re-run each config that enters the Pareto front N more times; its "
                        "metrics become the medians (default: %(default)s)")
    p.add_argument("--pick", choices=[k for k in PICKS if k != "slo"], default="knee",
                   help="the rule that chooses the config best.env is written from, and that "
                        "--confirm-pick confirms (the workload's SLOs always apply; `tuner "
                        "export` can choose again; default: %(default)s)")
    p.add_argument("--confirm-pick", type=int, metavar="N",
                   help="once the budget is spent, re-run the pick N more times before it is "
                        "exported: it stands on the medians of its runs and must meet the SLOs "
                        "in every run, else the next pick is confirmed (up to 3 configs; not "
                        "counted in --trials; default: 2 on a real server, 0 with --simulate)")
    p.add_argument("--seed-config", action="append", metavar="FILE",
                   help="repeatable: a config to run first (YAML/JSON knob: value, or an env "
                        "file such as best.env), clipped into the space")
    p.add_argument("--warm-start-from", metavar="STUDY",
                   help="run the feasible Pareto set of this earlier study first (a study name "
                        "in the same storage or under --studies-dir, or a sqlite URL as URL#NAME)")
    p.add_argument("--no-defaults", action="store_true",
                   help="do not enqueue the server's default config as the first trial (it is "
                        "enqueued with its KV pool lowered until the memory estimate says it fits)")
    p.add_argument("--kv-absolute", action="store_true",
                   help="let the sampler draw the KV pool as an absolute size instead of a share "
                        "of the memory headroom the other knobs leave")
    p.add_argument("--max-skips", type=int, metavar="N",
                   help="stop after N configs that were not measured (pre-screen skips, repeats "
                        "of a measured config); default: twice --trials")
    p.add_argument("--patience", type=int, metavar="K",
                   help="stop early when the chosen config has not changed in K measured trials")


def capacity_bytes(args: argparse.Namespace, gpu_state: GpuState | None) -> int | None:
    """--gpu-memory, else --gpu-memory-cap, else the simulated profile's memory, else the real
    card's (NVML)."""
    if getattr(args, "gpu_memory", None):  # `tuner ablate` has no --gpu-memory
        return parse_size(args.gpu_memory)
    if getattr(args, "gpu_memory_cap", None):
        return parse_size(args.gpu_memory_cap)
    if args.simulate:
        return get_profile(args.simulate).memory_bytes
    return gpu_state.total_bytes if gpu_state is not None else None


def pick_runs(args: argparse.Namespace) -> int:
    """--confirm-pick, else 2 on a real server (the pick then stands on 3 runs, as the H200
    records' side by sides do), else 0: the simulator without --jitter repeats itself."""
    if args.confirm_pick is not None:
        return int(args.confirm_pick)
    return 0 if args.simulate else 2


def check_adaptive_args(args: argparse.Namespace) -> None:
    if args.screen_cells < 0:
        raise UsageError("--screen-cells must be >= 0")
    for flag in ("confirm", "confirm_pick"):
        if (getattr(args, flag, None) or 0) < 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 0")
    for flag in ("max_skips", "patience"):
        if getattr(args, flag, None) is not None and getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1")


def default_on_grid(space: SearchSpace) -> dict[str, Any]:
    """The server default as a grid point: knobs without a default take their first grid value."""
    return complete_on_grid(space, clip_to_space(space, space.default_params()))


def warm_start(study: optuna.Study, space: SearchSpace, args: argparse.Namespace,
               storage: str, studies_dir: Path, pipeline: AdaptivePipeline | None = None) -> int:
    """Enqueue the warm-start configs of a fresh study; returns how many were enqueued.

    With a pipeline that knows the card, the server's default is made runnable first (its KV
    pool lowered until it fits: `tuner.trial.runnable_default.runnable`); with the KV share on, each
    config travels as its share plus the KV value to run (`record.kv_mark`)."""
    if study.get_trials(deepcopy=False):
        return 0  # resuming: whatever was enqueued the first time is already there
    # The report compares the chosen config with this one (marked as the default).
    if getattr(args, "sampler", None) == "grid":
        default = default_on_grid(space)
    else:
        default = clip_to_space(space, space.default_params())
        if pipeline is not None and pipeline.capacity is not None:
            default = runnable(space, pipeline.model, pipeline.capacity,
                               pipeline.ctx.workload.cells, default)
    added = 0 if args.no_defaults else _enqueue(study, [default], pipeline,
                                                {**DEFAULT_MARK, GIVEN: sorted(default)})
    configs = [load_seed_config(space, f) for f in args.seed_config or []]
    if args.warm_start_from:
        configs += pareto_configs(_earlier(args.warm_start_from, storage, studies_dir), space)
    return added + _enqueue(study, configs, pipeline, {})


def _enqueue(study: optuna.Study, configs: list[dict[str, Any]],
             pipeline: AdaptivePipeline | None, attrs: dict[str, Any]) -> int:
    """`enqueue`, with the KV knob of each config turned into its share when the share is on."""
    edge = pipeline.kv_edge if pipeline is not None else None
    if edge is None:
        return enqueue(study, configs, user_attrs=attrs or None)
    name, added = edge.param.name, 0
    for params in configs:
        if name not in params:
            added += enqueue(study, [params], user_attrs=attrs or None)
            continue
        rest = {k: v for k, v in params.items() if k != name}
        share = edge.share_of(rest, int(params[name]), [])
        added += enqueue(study, [{**rest, KV_SHARE: share}],
                         user_attrs={**attrs, **kv_mark(int(params[name]))})
    return added


def _earlier(ref: str, storage: str, studies_dir: Path) -> optuna.Study:
    try:
        return find_study(ref, storage, studies_dir)
    except UsageError as exc:
        raise UsageError(f"--warm-start-from: {exc}") from None
