"""Prompt lengths: the model's tokenizer when its folder has one, and how far off they are when
it has none.

Without tokenizer.json a prompt of N tokens is N short words, which a real tokenizer may count
differently (the issue that led here: `--input-len 256` reached a server as 292 tokens, +14%,
and nothing said so).  The server's own `usage.prompt_tokens` says by how much; that count also
holds the chat template, which no prompt text can avoid, so the warning says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tuner.bench.records import CellResult

TOKENIZER_FILE = "tokenizer.json"


def tokenizer_dir(explicit: str | None, model: str) -> str | None:
    """--tokenizer if given, else the --model folder when it holds tokenizer.json (as vllm
    bench serve takes the tokenizer from --model)."""
    if explicit is not None:
        return explicit
    return model if (Path(model) / TOKENIZER_FILE).is_file() else None


def has_tokenizer(path: str | None) -> bool:
    return path is not None and (Path(path) / TOKENIZER_FILE).is_file()


def length_warning(results: Sequence[CellResult], api: str) -> str:
    """One line: prompt lengths are approximate, and by how much the server counted more or
    fewer tokens than asked, over the synthetic cells' completed requests."""
    asked = counted = n = 0
    for r in results:
        if r.cell.source is not None:
            continue
        for rec in r.records:
            if rec.ok and rec.prompt_tokens is not None:
                asked += r.cell.input_len
                counted += rec.prompt_tokens
                n += 1
    head = (f"warning: prompt lengths are approximate (no {TOKENIZER_FILE} in --tokenizer or "
            "the --model folder: one word per token)")
    if not asked:
        return head + "; the server reported no prompt token counts to check them against"
    template = ", chat template included" if api == "chat" else ""
    return (f"{head}: the server counted {counted / n:.0f} prompt tokens per request where "
            f"{asked / n:.0f} were asked ({(counted - asked) / asked:+.1%}{template})")
