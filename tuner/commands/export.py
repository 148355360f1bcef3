"""`tuner export`: write the chosen feasible config as best.env (or print it as json / yaml)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuner.commands.pick_args import SLO_HELP, add_pick_args, pick_trial
from tuner.errors import UsageError
from tuner.output import envfile, export
from tuner.study import storage as studyref


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `tuner export`."""
    p = subparsers.add_parser(
        "export", help="write the best feasible config as best.env / json / yaml",
        description="Write the Pareto-best feasible config of a study, with provenance.",
        epilog=SLO_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    studyref.add_study_args(p)
    add_pick_args(p)
    p.add_argument(
        "--format", choices=export.FORMATS, default="env", help="output format (default: env)"
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="where to write; '-' for stdout (default: STUDIES_DIR/NAME/best.env for env, "
        "stdout for json/yaml)",
    )
    p.add_argument("--check", metavar="ENVFILE", type=Path,
                   help="only validate an existing env file against the best.env rule and print it")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Export (or --check); raises UsageError for anything the user can fix."""
    if args.check:
        try:
            text = args.check.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {args.check}: {exc}") from None
        for key, value in envfile.parse(text).items():
            print(f"{key}={value}")
        return 0
    ref = studyref.resolve(args)
    study = studyref.load(ref)
    choice = pick_trial(study, args)
    cfg = export.build(study, choice)
    text = export.render(cfg, args.format)
    out = args.output or (str(ref.folder / "best.env") if args.format == "env" else "-")
    if out == "-":
        sys.stdout.write(text)
    else:
        envfile.write_atomic(Path(out), text)
        vals = ", ".join(f"{k}={v:.4g}" for k, v in cfg.provenance["values"].items())
        print(f"wrote {out}: trial {choice.trial.number} ({choice.rule}; {vals})", file=sys.stderr)
    return 0
