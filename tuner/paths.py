"""Where shipped files live, so `tuner` works from any directory once installed in place."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def shipped(path: str) -> Path:
    """`path` as given if it exists, else relative to the project checkout."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    candidate = REPO_ROOT / p
    return candidate if candidate.exists() else p
