"""`tuner inspect`: list the trials and the Pareto set, write report.html, or serve the
dashboard."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna

from tuner.commands.pick_args import SLO_HELP, add_pick_args, pick_trial
from tuner.errors import UsageError
from tuner.output import dashboard, export, report, trial_table
from tuner.output.knob_check import describe, knob_report
from tuner.output.result import result_lines
from tuner.output.select import Choice, feasible_front, study_objectives
from tuner.output.tables import trials_frame
from tuner.study import storage as studyref
from tuner.study.record import TrialRecord, records


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `tuner inspect`."""
    p = subparsers.add_parser(
        "inspect",
        help="show trials and the Pareto set; write report.html; --serve the dashboard",
        description="Show a study's trials (params, outcome, objective values, constraints) and "
                    "its "
        "feasible Pareto set, and write STUDIES_DIR/NAME/report.html.",
        epilog=SLO_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    studyref.add_study_args(p)
    add_pick_args(p)
    p.add_argument("--format", choices=("table", "json", "csv"), default="table",
                   help="stdout format; csv: one row per trial with every metric (default: table)")
    p.add_argument("--wide", action="store_true",
                   help="table: every param and constraint as a column (default: outcome, "
                        "objectives, gain over the default config, a note)")
    p.add_argument(
        "--report",
        metavar="PATH",
        help="where to write the report (default: STUDIES_DIR/NAME/report.html)",
    )
    p.add_argument(
        "--no-report",
        action="store_true",
        help="do not write report.html or store figures in the study",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="run optuna-dashboard on the study's storage until Ctrl-C (needs optuna-dashboard)",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="--serve address (default: 127.0.0.1, local only)"
    )
    p.add_argument("--port", type=int, default=8080, help="--serve port (default: 8080)")
    p.set_defaults(func=run)
    return p


def _finite(v: float) -> float | str:
    """JSON has no inf/nan; say them as strings rather than emit invalid JSON."""
    return v if math.isfinite(v) else str(v)


def trial_json(t: TrialRecord) -> dict[str, Any]:
    """What `--format json` prints for one trial.  `values` is null for a trial the server did
    not measure (failed or skipped): the worst-case values Optuna holds for the sampler are no
    measurement."""
    return {"number": t.number, "state": t.state.name, "outcome": t.outcome,
            "feasible": t.feasible, "params": dict(t.params),
            "values": [_finite(v) for v in t.values] if t.measured and t.values else None,
            "constraints": {k: _finite(v) for k, v in t.constraints.items()},
            "reason": t.reason}


def as_json(study: optuna.Study, pareto: Sequence[int], choice: Choice | None,
            report_path: str | None) -> str:
    """The whole inspection as one JSON document."""
    doc = {"study": study.study_name, "objectives": [str(o) for o in study_objectives(study)],
           "trials": [trial_json(t) for t in records(study)],
           "pareto": list(pareto), "chosen": choice.trial.number if choice else None,
           "chosen_rule": choice.rule if choice else None, "report": report_path,
           "knobs": _knobs_json(study)}
    return json.dumps(doc, indent=2, default=str, allow_nan=False)


def _knobs_json(study: optuna.Study) -> dict[str, Any] | None:
    rep = knob_report(study)
    return None if rep is None else {"trials_used": rep.trials_used, "importance": rep.importance,
                                     "no_effect": rep.no_effect, "constant": rep.constant,
                                     "barely_varied": rep.barely_varied}


def as_table(study: optuna.Study, pareto: Sequence[int], choice: Choice | None,
             wide: bool = False) -> str:
    """The trials table (compact, or every column), then the Pareto set and the pick."""
    text = trial_table.wide(study, pareto, choice) if wide else trial_table.compact(
        study, pareto, choice)
    tail = f"Pareto set (feasible): {', '.join(map(str, pareto)) or 'empty'}"
    if choice:
        tail += f"; chosen: trial {choice.trial.number} ({choice.rule})"
    return "\n".join([text, "", tail + "  [* Pareto, > chosen]"])


def _print_result(study: optuna.Study, choice: Choice | None) -> None:
    """The block `tune` ends with; a study that cannot be exported (no recorded argv) has none."""
    if choice is None:
        return
    try:
        print("\n".join(result_lines(study, choice, export.build(study, choice))))
    except UsageError:
        pass


NO_DASHBOARD_MARK = ".no-dashboard-noted"


def _note_once(mark: Path, text: str) -> None:
    """A hint that repeats on every `inspect` is noise: say it once per study folder."""
    if mark.exists():
        return
    print(text, file=sys.stderr)
    with contextlib.suppress(OSError):
        mark.touch()


def run(args: argparse.Namespace) -> int:
    """Inspect a study; UsageError for anything the user can fix."""
    ref = studyref.resolve(args)
    if args.serve:
        return dashboard.serve(ref.storage, args.host, args.port)
    study = studyref.load(ref)
    trials = records(study)
    pareto = [t.number for t in feasible_front(trials, study_objectives(study))]
    choice = pick_trial(study, args) if any(t.feasible for t in trials) else None
    report_path = None
    if not args.no_report:
        path = args.report or str(ref.folder / "report.html")
        figs = report.write_report(Path(path), study, choice)
        report_path = path
        if not report.store_in_dashboard(study, figs):
            _note_once(ref.folder / NO_DASHBOARD_MARK,
                       "optuna-dashboard not installed: figures not stored in the study "
                       "(pip install 'llm-server-tuner[dashboard]'; said once per study)")
    if args.format == "json":
        print(as_json(study, pareto, choice, report_path))
    elif args.format == "csv":
        sys.stdout.write(trials_frame(study, wide=True).to_csv())
    else:
        print(as_table(study, pareto, choice, args.wide))
        print(describe(knob_report(study)))
        _print_result(study, choice)
        if report_path:
            print(f"report: {report_path}")
    return 0
