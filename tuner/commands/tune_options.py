"""`tuner tune`'s adaptive-search options, kept out of tune.py so both can change independently.

Options: --gpu-memory (the card size the bounds and pre-screen use), --no-prescreen,
--screen-cells, --confirm, --seed-config, --warm-start-from, --no-defaults.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import optuna

from tuner.search.bounds import parse_size
from tuner.search.grid import complete_on_grid
from tuner.errors import UsageError
from tuner.server.gpu import GpuState
from tuner.sim.profiles import get_profile
from tuner.search.space import SearchSpace
from tuner.search.warmstart import clip_to_space, enqueue, load_seed_config, pareto_configs
from tuner.study.record import DEFAULT_MARK
from tuner.study.storage import find_study


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
    p.add_argument("--seed-config", action="append", metavar="FILE",
                   help="repeatable: a config to run first (YAML/JSON knob: value, or an env "
                        "file such as best.env), clipped into the space")
    p.add_argument("--warm-start-from", metavar="STUDY",
                   help="run the feasible Pareto set of this earlier study first (a study name "
                        "in the same storage or under --studies-dir, or a sqlite URL as URL#NAME)")
    p.add_argument("--no-defaults", action="store_true",
                   help="do not enqueue the server's default config as the first trial")


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


def check_adaptive_args(args: argparse.Namespace) -> None:
    if args.screen_cells < 0:
        raise UsageError("--screen-cells must be >= 0")
    if args.confirm < 0:
        raise UsageError("--confirm must be >= 0")


def default_on_grid(space: SearchSpace) -> dict[str, Any]:
    """The server default as a grid point: knobs without a default take their first grid value."""
    return complete_on_grid(space, clip_to_space(space, space.default_params()))


def warm_start(study: optuna.Study, space: SearchSpace, args: argparse.Namespace,
               storage: str, studies_dir: Path) -> int:
    """Enqueue the warm-start configs of a fresh study; returns how many were enqueued."""
    if study.get_trials(deepcopy=False):
        return 0  # resuming: whatever was enqueued the first time is already there
    # The report compares the chosen config with this one (marked as the default).
    default = (default_on_grid(space) if getattr(args, "sampler", None) == "grid"
               else clip_to_space(space, space.default_params()))
    added = 0 if args.no_defaults else enqueue(study, [default], user_attrs=DEFAULT_MARK)
    configs = [load_seed_config(space, f) for f in args.seed_config or []]
    if args.warm_start_from:
        configs += pareto_configs(_earlier(args.warm_start_from, storage, studies_dir), space)
    return added + enqueue(study, configs)


def _earlier(ref: str, storage: str, studies_dir: Path) -> optuna.Study:
    try:
        return find_study(ref, storage, studies_dir)
    except UsageError as exc:
        raise UsageError(f"--warm-start-from: {exc}") from None
