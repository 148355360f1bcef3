"""--pick, --slo and --trial: how `export`, `inspect` and `ablate` name the config they mean."""

from __future__ import annotations

import argparse

import optuna

from tuner.output.select import PICKS, Choice, choose, choose_trial
from tuner.search.slo import parse_slo

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

best.env rule (identical for docker --env-file, systemd EnvironmentFile= and
bash `set -a; . best.env`):
  only `# comment` and KEY=VALUE lines; VALUE uses only [A-Za-z0-9_./:,=+@%-] -- no quotes,
  spaces, $, backticks, backslashes or newlines (such a value is refused, naming its key).
  Tuned server flags go in TUNER_SERVER_ARGS as comma-separated argv tokens, e.g.
  TUNER_SERVER_ARGS=--num-blocks,64,--block-size,256 ;
  expand with IFS=, read -ra ARGS <<<"$TUNER_SERVER_ARGS".
"""


def add_pick_args(parser: argparse.ArgumentParser) -> None:
    """--pick, --slo and --trial (shared with inspect, which marks the chosen config)."""
    parser.add_argument("--pick", choices=PICKS, default="knee",
                        help="how to choose from the feasible Pareto set (default: knee)")
    parser.add_argument(
        "--slo", metavar="SPEC", help="only trials meeting these limits (syntax below)"
    )
    parser.add_argument("--trial", type=int, metavar="N", help="use trial N instead of picking")


def pick_trial(study: optuna.Study, args: argparse.Namespace) -> Choice:
    """The Choice the args ask for: --trial N (must be feasible) or --pick/--slo."""
    if args.trial is not None:
        return choose_trial(study, args.trial)
    return choose(study, args.pick, parse_slo(args.slo) if args.slo else ())
