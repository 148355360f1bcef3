"""The `--scenarios` option the search benchmarks share: which scenarios of
search_scenarios.py to run, checked before any work starts (an unknown name is a usage error,
exit 2)."""

from __future__ import annotations

import argparse

from search_scenarios import OPT_IN, SCENARIOS


def add_scenarios_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS),
                    help="comma-separated names (default: the suite's five); also: "
                    + ", ".join(s.name for s in OPT_IN))


def scenario_names(ap: argparse.ArgumentParser, value: str) -> list[str]:
    """The names in `value`, or `ap.error` naming the unknown ones and the known ones."""
    known = [s.name for s in (*SCENARIOS, *OPT_IN)]
    names = value.split(",")
    if unknown := [n for n in names if n not in known]:
        ap.error(f"unknown scenario {', '.join(unknown)} (known: {', '.join(known)})")
    return names
