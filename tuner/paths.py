"""Where shipped files live, so `tuner` works from any directory once installed in place."""

from __future__ import annotations

from pathlib import Path

from tuner.errors import UsageError

REPO_ROOT = Path(__file__).resolve().parents[1]
SPACES_DIR = "search_spaces"


def shipped(path: str) -> Path:
    """`path` as given if it exists, else relative to the project checkout."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    candidate = REPO_ROOT / p
    return candidate if candidate.exists() else p


def space_file(arg: str) -> Path:
    """`--space` as a path, or as a shipped space's name (`vllm`, as `tuner targets` lists it)."""
    p = shipped(arg)
    if p.exists() or Path(arg).suffix or "/" in arg:
        return p
    by_name = REPO_ROOT / SPACES_DIR / f"{arg.lower()}.yaml"
    if by_name.is_file():
        return by_name
    names = sorted(f.stem for f in (REPO_ROOT / SPACES_DIR).glob("*.yaml"))
    raise UsageError(f"no search space '{arg}': give a YAML file or a shipped space "
                     f"({', '.join(names) or 'none'}; see `tuner targets`)")
