"""`tuner export`: write the chosen feasible config as best.env (or print it as json / yaml)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import optuna

from tuner.output import envfile, export

from tuner.study import storage as studyref
from tuner.errors import UsageError
from tuner.output.select import PICKS, Choice, choose, is_feasible, pareto_front, study_objectives
from tuner.output.slo import parse_slo

SLO_HELP = """\
--slo syntax: comma-separated terms [cell:c<C>_i<I>_o<O>:]METRIC OP NUMBER [UNIT]
  METRIC  a recorded metric (p99_ttft_ms, p99_tpot_ms, output_throughput, mean_ttft_ms, ...)
          or its short form ttft_p99 / tpot_p99 / itl_p99 / e2el_mean ...
  OP      <=  <  >=  >          UNIT  ms | s (latency), tok/s | req/s (throughput)
  without cell: the trial's aggregate (worst cell for p99_*); with cell: that cell only.
  e.g. --slo "ttft_p99<=2000ms,tpot_p99<=50ms,cell:c64_i256_o256:tpot_p99<=40ms"

picks (all from the feasible Pareto set, optionally narrowed by --slo):
  knee            closest to the ideal point with every objective scaled to [0, 1]
  max-throughput  highest output_throughput   min-ttft / min-tpot  lowest p99_ttft_ms / p99_tpot_ms
  slo             best first objective among trials meeting --slo
  values within 1% count as tied; ties go to more memory headroom, then less spread over repeats.

best.env rule (identical for docker --env-file, systemd EnvironmentFile= and bash `set -a; . best.env`):
  only `# comment` and KEY=VALUE lines; VALUE uses only [A-Za-z0-9_./:,=+@%-] -- no quotes,
  spaces, $, backticks, backslashes or newlines (such a value is refused, naming its key).
  Tuned server flags go in TUNER_SERVER_ARGS as comma-separated argv tokens, e.g.
  TUNER_SERVER_ARGS=--num-blocks,64,--block-size,256 ; expand with IFS=, read -ra ARGS <<<"$TUNER_SERVER_ARGS".
"""


def add_pick_args(parser: argparse.ArgumentParser) -> None:
    """--pick, --slo and --trial (shared with inspect, which marks the chosen config)."""
    parser.add_argument("--pick", choices=PICKS, default="knee",
                        help="how to choose from the feasible Pareto set (default: knee)")
    parser.add_argument("--slo", metavar="SPEC", help="only trials meeting these limits (syntax below)")
    parser.add_argument("--trial", type=int, metavar="N", help="use trial N instead of picking")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `tuner export`."""
    p = subparsers.add_parser(
        "export", help="write the best feasible config as best.env / json / yaml",
        description="Write the Pareto-best feasible config of a study, with provenance.",
        epilog=SLO_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    studyref.add_study_args(p)
    add_pick_args(p)
    p.add_argument("--format", choices=export.FORMATS, default="env", help="output format (default: env)")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="where to write; '-' for stdout (default: STUDIES_DIR/NAME/best.env for env, "
                        "stdout for json/yaml)")
    p.add_argument("--check", metavar="ENVFILE", type=Path,
                   help="only validate an existing env file against the best.env rule and print it")
    p.set_defaults(func=run)
    return p


def pick_trial(study: optuna.Study, args: argparse.Namespace) -> Choice:
    """The Choice the args ask for: --trial N (must be feasible) or --pick/--slo."""
    slo = parse_slo(args.slo) if args.slo else ()
    if args.trial is None:
        return choose(study, args.pick, slo)
    trials = study.get_trials(deepcopy=False)
    match = [t for t in trials if t.number == args.trial]
    if not match:
        raise UsageError(f"no trial {args.trial} in study {study.study_name!r}")
    if not is_feasible(match[0]):
        raise UsageError(f"trial {args.trial} is not feasible (outcome "
                         f"{match[0].user_attrs.get('outcome', match[0].state.name.lower())})")
    front = pareto_front([t for t in trials if is_feasible(t)], study_objectives(study))
    return Choice(match[0], front, f"--trial {args.trial}")


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
