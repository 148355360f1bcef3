"""The `tuner` command line: one subcommand per module in `tuner/commands/`.

User errors (`UsageError`) print one line and exit with status 2; Ctrl-C exits with 130 after
the running trial has stopped its server.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence

from tuner import __version__
from tuner.errors import UsageError

COMMANDS = ("tune", "bench", "export", "inspect", "targets", "ablate")


def _sigterm_to_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuner", description="Adaptive auto-tuner for LLM inference server knobs.")
    parser.add_argument("--version", action="version", version=f"tuner {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"tuner.commands.{name}")
        module.add_parser(sub)
        sub.choices[name].set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.cli_argv = argv  # what `tune --gpus` hands on to its workers
    signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"tuner {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tuner {args.command}: interrupted; servers stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
