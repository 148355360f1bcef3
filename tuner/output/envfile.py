"""Write and check env files that docker --env-file, systemd EnvironmentFile= and bash read alike.

The rule (why it is this strict): the three readers disagree on everything except the bare form.
docker keeps the rest of the line after `=` verbatim (quotes included); systemd strips quotes and
backslash escapes and trims whitespace; bash `set -a; . best.env` runs a line with an unquoted
space as a command and expands `$`, backticks and `~`.  So every line is one of

    # comment      -- printable ASCII without backslash (systemd continues a comment that
                      ends in a backslash)
    KEY=VALUE      -- KEY matches [A-Za-z_][A-Za-z0-9_]* and is not a name bash treats specially;
                      VALUE matches [A-Za-z0-9_./:,=+@%-]* (no quotes, spaces, `$`, backticks,
                      backslashes, `~`, `#`, `;`, newlines)

and a value outside that set is refused with an error naming the key: there is no quoting that
all three read identically.  Server arguments contain spaces, so they are stored as their argv
tokens joined by commas (TUNER_SERVER_ARGS=--num-blocks,64,--block-size,256); a token that
contains a comma or is empty is refused.  Split it back with `IFS=, read -ra args <<<"$VAR"` or
`value.split(",")`; `server_args_line()` gives the equivalent launch line for humans.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from tuner.errors import UsageError

SERVER_ARGS_VAR = "TUNER_SERVER_ARGS"
KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
VALUE_RE = re.compile(r"[A-Za-z0-9_./:,=+@%-]*")
COMMENT_RE = re.compile(r"[ -\[\]-~]*")  # printable ASCII except backslash
# Names bash makes read-only, recomputes on every read, or uses to parse the file itself.
BASH_SPECIAL = {"BASHOPTS", "BASHPID", "BASH_ARGC", "BASH_ARGV", "BASH_ENV", "BASH_LINENO",
                "BASH_SOURCE", "BASH_VERSINFO", "DIRSTACK", "EPOCHREALTIME", "EPOCHSECONDS", "EUID",
                "FUNCNAME", "GROUPS", "HISTCMD", "IFS", "LINENO", "OLDPWD", "OPTIND", "PPID", "PS4",
                "PWD", "RANDOM", "SECONDS", "SHELLOPTS", "SHLVL", "SRANDOM", "UID", "_"}


def _describe(value: str) -> str:
    for ch, what in (
        ("\n", "a newline"),
        ("\r", "a carriage return"),
        ("$", "'$'"),
        ("`", "a backtick"),
        ("\\", "a backslash"),
        ('"', "a double quote"),
        ("'", "a single quote"),
        (" ", "a space"),
        ("\t", "a tab"),
    ):
        if ch in value:
            return what
    bad = next(c for c in value if not VALUE_RE.fullmatch(c))
    return repr(bad)


def check_key(key: str) -> None:
    """Refuse names that are not plain identifiers or that bash would not simply assign."""
    if not KEY_RE.fullmatch(key):
        raise UsageError(
            f"env var name {key!r} is not [A-Za-z_][A-Za-z0-9_]*: refusing to write it"
        )
    if key in BASH_SPECIAL:
        raise UsageError(
            f"env var {key}: bash treats this name specially, so `. best.env` would not "
            "set it as docker and systemd do"
        )


def check_value(key: str, value: str) -> None:
    """Refuse a value the three readers would not read identically, naming the key."""
    if not VALUE_RE.fullmatch(value):
        raise UsageError(f"env var {key}: value {value!r} contains {_describe(value)}; best.env "
                         "values may only use [A-Za-z0-9_./:,=+@%-] (see `tuner export --help`)")


def encode_server_args(args: Sequence[str]) -> str:
    """Server argv tokens joined by commas, each token checked like a value."""
    for tok in args:
        if tok == "" or "," in tok:
            raise UsageError(f"{SERVER_ARGS_VAR}: argument {tok!r} is empty or contains ',' and "
                             "cannot be stored comma-separated")
        check_value(f"{SERVER_ARGS_VAR} (argument {tok!r})", tok)
    return ",".join(args)


def decode_server_args(value: str) -> list[str]:
    """Inverse of encode_server_args."""
    return value.split(",") if value else []


def server_args_line(args: Sequence[str]) -> str:
    """The arguments as a shell launch line, for comments and messages."""
    return shlex.join(args)


def comment(text: str) -> str:
    """One `# ...` line; characters outside printable ASCII or a backslash become '?'."""
    clean = "".join(c if COMMENT_RE.fullmatch(c) else "?" for c in text)
    return f"# {clean}".rstrip()


def render(env: Mapping[str, str], header: Sequence[str] = ()) -> str:
    """The env file text: comment header, then KEY=VALUE lines in the given order."""
    lines = [comment(h) for h in header]
    for key, value in env.items():
        check_key(key)
        check_value(key, value)
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str, encoding: str = "ascii") -> None:
    """Write via a temp file in the same folder and os.replace, so no partial file is ever left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these files are meant to be read by services
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse(text: str) -> dict[str, str]:
    """Read back a file written by render (the strict subset only); UsageError on anything else."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise UsageError(f"env file line {n}: not KEY=VALUE")
        check_key(key)
        check_value(key, value)
        out[key] = value
    return out
