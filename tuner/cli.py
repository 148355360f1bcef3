"""The `tuner` command line: one subcommand per module in `tuner/commands/`.

User errors (`UsageError`) print one line and exit with status 2; faults of the machine under
the tuner (`FaultError`: storage gone for good, disk full) one line and status 3; Ctrl-C exits
with 130 after the running trial has stopped its server.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from tuner import __version__
from tuner.errors import FaultError, UsageError

COMMANDS = ("tune", "bench", "export", "inspect", "targets", "ablate")


def _sigterm_to_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def fault_message(exc: BaseException) -> str | None:
    """The machine's fault behind `exc`, if any: Optuna may raise its own error while failing a
    trial on a full disk, with the real cause in the exception's context."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, FaultError):
            return str(seen)
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return (f"disk full: {seen.filename or ''} {seen.strerror}; free space and run the "
                    "same command to resume (completed trials are kept)")
        seen = seen.__cause__ or seen.__context__
    return None


class OneLineParser(argparse.ArgumentParser):
    """argparse with the CLI's error contract: one line, exit 2, no usage dump; and no prefix
    matching, so a mistyped `--gpu-memory` is refused instead of read as `--gpu-memory-cap`.

    Subcommand parsers are made by `add_subparsers`, which uses the parent's class.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
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
    except Exception as exc:  # noqa: BLE001 - anything else is a bug and keeps its traceback
        message = fault_message(exc)
        if message is None:
            raise
        print(f"tuner {args.command}: error: {message}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"tuner {args.command}: interrupted; servers stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
