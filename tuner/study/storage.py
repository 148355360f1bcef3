"""Find and open a study from the common CLI args (--study, --storage, --studies-dir).

Shared by `export` and `inspect`: both default to the study folder touched last, because right
after a `tuner run` that is the one the user means.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import optuna

from tuner.errors import UsageError


@dataclass(frozen=True)
class StudyRef:
    """A study's name, its storage URL and its folder (where best.env and report.html go)."""

    name: str
    storage: str
    folder: Path


def add_study_args(parser: argparse.ArgumentParser) -> None:
    """--study, --storage, --studies-dir."""
    parser.add_argument("--study", metavar="NAME",
                        help="study name (default: the folder under --studies-dir whose study.db "
                             "was modified last)")
    parser.add_argument("--storage", metavar="URL",
                        help="Optuna storage URL (default: sqlite:///STUDIES_DIR/NAME/study.db)")
    parser.add_argument("--studies-dir", metavar="DIR", type=Path, default=Path("studies"),
                        help="folder holding one folder per study (default: ./studies)")


def latest_study(studies_dir: Path) -> str:
    """Name of the most recently modified study folder that has a study.db."""
    dbs = sorted(studies_dir.glob("*/study.db"), key=lambda p: p.stat().st_mtime)
    if not dbs:
        raise UsageError(f"no study found: no {studies_dir}/<name>/study.db (give --study or --storage)")
    return dbs[-1].parent.name


def resolve(args: argparse.Namespace) -> StudyRef:
    """The StudyRef the args name, without opening anything."""
    studies_dir: Path = args.studies_dir
    name = args.study
    if name is None:
        if args.storage:
            names = optuna.get_all_study_names(storage=args.storage)
            if len(names) != 1:
                raise UsageError(f"--storage holds {len(names)} studies; name one with --study")
            name = names[0]
        else:
            name = latest_study(studies_dir)
    folder = studies_dir / name
    if args.storage:
        return StudyRef(name, args.storage, folder)
    db = folder / "study.db"
    if not db.is_file():
        raise UsageError(f"study {name!r}: {db} not found")
    return StudyRef(name, f"sqlite:///{db}", folder)


def load(ref: StudyRef) -> optuna.Study:
    """Open the study; a missing name is a UsageError listing the ones that exist."""
    try:
        return optuna.load_study(study_name=ref.name, storage=ref.storage)
    except KeyError:
        names = optuna.get_all_study_names(storage=ref.storage)
        raise UsageError(f"no study {ref.name!r} in {ref.storage} (found: {', '.join(names) or 'none'})") from None
