"""`tuner targets`: the servers the tuner ships a search space for, and each one's knobs.

A user picking `--space` needs to see, without reading YAML, which servers are covered, how each
knob reaches the server (a flag or an environment variable), its range and the server's default.
Every shipped file is loaded with the same validation `tuner tune` uses, so a broken file shows
here as the same one-line error.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tuner.errors import UsageError
from tuner.paths import shipped
from tuner.search.bounds import parse_size, resolve_space
from tuner.search.model import load_model_info
from tuner.search.space import Param, SearchSpace
from tuner.search.space_file import load_space
from tuner.sim.profiles import get_profile

DEFAULT_DIR = "search_spaces"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `tuner targets`."""
    p = subparsers.add_parser(
        "targets", help="list the shipped search spaces (servers) and their knobs",
        description="List the search spaces in DIR: the server command, health path and, per knob, "
                    "its type, range or choices, the flag or environment variable that carries "
                    "it, and the server's default ('-': left to the server).")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="only these spaces (a space name, or a path to a YAML file)")
    p.add_argument(
        "--dir",
        default=DEFAULT_DIR,
        help="folder of search-space YAML files (default: %(default)s)",
    )
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="stdout format (default: table)")
    p.add_argument("--model", help="model dir with config.json: resolve 'high: auto' bounds for it")
    p.add_argument("--gpu-memory", metavar="SIZE",
                   help="card size for 'high: auto' with --model, e.g. 24GiB")
    p.add_argument("--simulate", metavar="GPU", help="or: a simulated GPU profile's memory")
    return p


def resolve_all(spaces: list[SearchSpace], args: argparse.Namespace) -> list[SearchSpace]:
    """The spaces with `high: auto` resolved for --model on the card of --gpu-memory/--simulate
    (what `tuner tune` would search before the workload raises a token pool's lower bound)."""
    if not args.model:
        if args.gpu_memory or args.simulate:
            raise UsageError("--gpu-memory/--simulate resolve 'high: auto' only with --model")
        return spaces
    capacity = (parse_size(args.gpu_memory) if args.gpu_memory
                else get_profile(args.simulate).memory_bytes if args.simulate else None)
    if capacity is None:
        raise UsageError(
            "--model resolves 'high: auto' for a card: give --gpu-memory or --simulate"
        )
    model = load_model_info(args.model)
    return [resolve_space(s, model, capacity, ()) for s in spaces]


def load_spaces(folder: Path, names: list[str]) -> list[SearchSpace]:
    """The spaces of `folder` (sorted by name), or only those `names` picks."""
    if not folder.is_dir():
        raise UsageError(f"search-space folder not found: {folder}")
    spaces = [load_space(f) for f in sorted(folder.glob("*.yaml"))]
    if not names:
        return sorted(spaces, key=lambda s: s.name)
    by_name = {s.name: s for s in spaces}
    picked = []
    for name in names:
        if name in by_name:
            picked.append(by_name[name])
        elif Path(name).is_file():
            picked.append(load_space(name))
        else:
            raise UsageError(f"no search space named '{name}' in {folder} "
                             f"(shipped: {', '.join(sorted(by_name)) or 'none'})")
    return picked


def knob_row(p: Param) -> dict[str, Any]:
    """One knob as plain data: what `--format json` prints and the table shows."""
    rng = p.describe() + (f" step {p.step:g}" if p.step else "") + (
        " (auto)" if p.high_auto and p.high is not None else "")
    row: dict[str, Any] = {"name": p.name, "type": p.type, "range": rng,
                           "via": "flag" if p.flag else "env", "target": p.flag or p.env,
                           "default": p.default, "help": p.help}
    if p.type in ("int", "float"):
        row.update(low=p.low, high=p.high, step=p.step, log=p.log)
    elif p.type == "categorical":
        row["choices"] = list(p.choices)
    elif p.env:
        row.update(true_value=p.true_value, false_value=p.false_value)
    return row


def space_record(space: SearchSpace) -> dict[str, Any]:
    """A whole space as plain data."""
    return {"name": space.name, "file": str(space.path), "description": space.description,
            "command": list(space.server.command), "fixed_flags": list(space.fixed_flags),
            "fixed_env": dict(space.fixed_env), "health_path": space.server.health_path,
            "simulator": space.server.simulator is not None,
            "knobs": [knob_row(p) for p in space.parameters]}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def format_table(records: list[dict[str, Any]]) -> str:
    """Human-readable listing: a header per space, then one aligned row per knob."""
    blocks = []
    for rec in records:
        rows = [["knob", "type", "range/choices", "flag/env", "default", "what"]]
        rows += [[k["name"], k["type"], k["range"], f"{k['via']} {k['target']}",
                  _cell(k["default"]), k["help"]] for k in rec["knobs"]]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = [
            f"{rec['name']}  ({rec['file']})"
            + (f": {rec['description']}" if rec["description"] else ""),
            f"  command: {' '.join(rec['command'] + rec['fixed_flags'])}",
            f"  health:  GET {rec['health_path']}"
            + ("   simulator: yes" if rec["simulator"] else ""),
        ]
        if rec["fixed_env"]:
            lines.append("  env:     " + " ".join(f"{k}={v}" for k, v in rec["fixed_env"].items()))
        for r in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
        blocks.append("\n".join(line.rstrip() for line in lines))
    return "\n\n".join(blocks)


def run(args: argparse.Namespace) -> int:
    """Print the shipped spaces; a malformed file is a UsageError (exit 2)."""
    spaces = resolve_all(load_spaces(shipped(args.dir), list(args.names)), args)
    records = [space_record(s) for s in spaces]
    if args.format == "json":
        print(json.dumps(records, indent=2, default=str))
    else:
        print(format_table(records))
    return 0
