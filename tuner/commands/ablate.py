"""`tuner ablate`: vary one knob at a time around a study's chosen config; report dead knobs.

Needs the same --model / --space / --workload (and --simulate) as the study was run with; the
base config is the study's pick (`--pick`, default knee) or `--trial N`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tuner.commands.pick_args import add_pick_args, pick_trial
from tuner.commands.tune_options import capacity_bytes
from tuner.errors import UsageError
from tuner.output.ablation import ablate
from tuner.output.select import study_objectives
from tuner.paths import shipped, space_file
from tuner.search.bounds import resolve_space
from tuner.search.model import load_model_info
from tuner.search.space import SearchSpace
from tuner.search.space_file import load_space
from tuner.search.workload import load_workload
from tuner.server.gpu import read_gpu, visible_gpu_index
from tuner.server.memcap import memory_cap
from tuner.study import storage as studyref
from tuner.study.study_record import StudyInfo, set_ablation
from tuner.trial.context import TrialContext


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ablate",
        help="vary one knob at a time around the chosen config; find dead knobs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    studyref.add_study_args(p)
    add_pick_args(p)
    p.add_argument("--model", help="model dir (default: the study's)")
    p.add_argument("--space", help="search space (default: the study's)")
    p.add_argument("--workload", help="workload YAML (default: the study's)")
    p.add_argument("--simulate", metavar="GPU", help="simulator profile (default: the study's)")
    p.add_argument(
        "--time-scale", type=float, default=25.0, help="with --simulate (default: %(default)s)"
    )
    p.add_argument("--gpu-memory-cap", metavar="SIZE", help="(default: the study's)")
    p.add_argument("--knobs", help="comma-separated knob names (default: every knob)")
    p.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="runs of the base config for the noise (default: %(default)s)",
    )
    p.add_argument("--per-knob", type=int, default=2, choices=(1, 2),
                   help="values tried per knob: 1 = the low end of its range (or another choice), "
                        "2 = both ends (default: %(default)s)")
    p.add_argument("--floor", type=float, default=0.02,
                   help="smallest relative change that counts as an effect (default: %(default)s)")
    p.add_argument("-o", "--output", help="write the report as JSON here")


def from_study(args: argparse.Namespace, info: StudyInfo) -> None:
    """Fill what was not given from what `tune` stored, so the user repeats nothing."""
    stored = {"model": info.model, "space": info.space_file, "workload": info.workload_file,
              "simulate": info.simulate, "gpu_memory_cap": info.gpu_memory_cap}
    for key, value in stored.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("model", "space", "workload"):
        if getattr(args, key) is None:
            raise UsageError(f"the study does not record --{key} (made by an older tuner); "
                             f"give --{key}")


def _knobs(option: str | None, space: SearchSpace) -> list[str]:
    """The knobs `--knobs` names (all of the space's without it), each checked to exist."""
    known = [p.name for p in space.parameters]
    names = [k.strip() for k in option.split(",")] if option else known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--knobs: unknown knob(s) {', '.join(unknown)} in {space.path}")
    return names


def run(args: argparse.Namespace) -> int:
    if args.repeats < 2:
        raise UsageError("--repeats must be at least 2 (the noise needs two runs)")
    ref = studyref.resolve(args)
    study = studyref.load(ref)
    from_study(args, StudyInfo.of(study))
    base_trial = pick_trial(study, args).trial
    base = dict(base_trial.params)
    space = load_space(space_file(args.space))
    workload = load_workload(shipped(args.workload))
    model = load_model_info(args.model)
    gpu = read_gpu(visible_gpu_index()) if not args.simulate else None
    space = resolve_space(space, model, capacity_bytes(args, gpu), workload.cells)
    names = _knobs(args.knobs, space)
    metrics = [o.metric for o in study_objectives(study)]
    with memory_cap(space, args.gpu_memory_cap, gpu, simulate=args.simulate is not None) as cap:
        ctx = TrialContext(space=space, workload=workload, model_dir=args.model,
                           simulate=args.simulate, time_scale=args.time_scale, **cap.trial_fields())
        report = ablate(
            ctx,
            base,
            [space.param(n) for n in names],
            metrics,
            ref.folder / "ablation",
            repeats=args.repeats,
            floor=args.floor,
            per_knob=args.per_knob,
            log=lambda line: print(line, file=sys.stderr),
        )
    print(f"noise over {args.repeats} base runs: " + ", ".join(
        f"{m} {report.noise[m]:.1%} (band {report.band[m]:.1%})" for m in metrics))
    verdicts = {n: report.verdict(n) for n in names}
    print(f"{'knob':28s} verdict")
    for n, verdict in verdicts.items():
        print(f"{n:28s} {verdict}")
    # kept with the study, so that `tuner export` can say which exported knobs did nothing
    set_ablation(study, {"base_trial": base_trial.number, "verdicts": verdicts,
                         "band": report.band})
    if args.output:
        doc = {"study": study.study_name, "base_trial": base_trial.number, "base": base,
               "metrics": metrics, "noise": report.noise, "band": report.band,
               "base_runs": report.base_runs, "variants": [vars(v) for v in report.variants],
               "verdicts": verdicts}
        Path(args.output).write_text(json.dumps(doc, indent=1, default=str))
    return 0
