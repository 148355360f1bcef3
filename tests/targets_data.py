"""Shared helpers for the targets tests: the recorded flag lists and the shipped spaces."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGS_DIR = ROOT / "tests" / "data" / "flags"
SPACES_DIR = ROOT / "search_spaces"

# Each shipped space and the recorded command line of the release it is written for.
SPACE_FLAG_FILES = {
    "vllm": "vllm-0.33.0.txt",
    "sglang": "sglang-0.5.23.txt",
    "transformers": "transformers-5.17.0-serve.txt",
    "infinilm": "infinilm-df1a1fd.txt",
}


def recorded(name: str) -> set[str]:
    """The names of a recorded list: every line that is neither blank nor a '#' header."""
    lines = (FLAGS_DIR / name).read_text().splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


def header(name: str) -> str:
    """The '#' header of a recorded list (where it came from and how)."""
    return "\n".join(ln for ln in (FLAGS_DIR / name).read_text().splitlines() if ln.startswith("#"))
