"""Read prompt datasets and arrival traces, and name the file and line of anything malformed.

Formats (facts from the tools people already feed, not their code):

* ShareGPT JSON, as `vllm bench serve --dataset-name sharegpt` reads it: one JSON array of
  entries `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...},
  ...]}`; the first turn is the prompt and the second the reference completion, whose length
  is the request's output length.  vLLM skips pairs whose prompt or completion is under 4 tokens;
  so do we.
* Plain JSONL, one request per line: `{"prompt": TEXT}` (vLLM's `custom` dataset) or
  `{"input_len": N}`, with `"output_len": N` on the line or given once for the whole source.
* Trace JSONL, one request per line in arrival order: `{"timestamp": MS, "input_length": N,
  "output_length": N}` as in Mooncake's traces and AIPerf's `mooncake_trace` (timestamps in
  milliseconds from the trace's start; `input_len`/`output_len` are accepted too), optionally
  `"hash_ids"` (Mooncake: one id per 512-token block of shared content) and `"prompt"`.

A bad line is a `UsageError` reading `FILE:LINE: what is wrong`, raised while the workload is
loaded, so nothing has been sent or written when it appears.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import UsageError

MIN_SHAREGPT_TOKENS = 4  # vLLM's ShareGPT filter: shorter prompts or completions are skipped


@dataclass(frozen=True)
class Entry:
    """One request as the file states it; lengths None when only text is given."""

    text: str | None
    input_len: int | None
    output_len: int | None
    completion: str | None = None   # ShareGPT: the reference answer, counted for output_len
    timestamp_s: float | None = None
    hash_ids: tuple[int, ...] = ()


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) per non-blank line."""
    for n, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{n}: not JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise UsageError(f"{path}:{n}: must be a JSON object, got {type(obj).__name__}")
        yield n, obj


def _count(obj: dict[str, Any], keys: tuple[str, ...], where: str, low: int) -> int | None:
    for key in keys:
        if key in obj:
            value = obj[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UsageError(f"{where}: {key}: must be an integer >= {low}, got {value!r}")
            return value
    return None


def _text(obj: dict[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise UsageError(f"{where}: {key}: must be a string")
    return value


def read_jsonl_dataset(path: Path, default_output: int | None) -> list[Entry]:
    out = []
    for n, obj in _jsonl(path):
        where = f"{path}:{n}"
        text = _text(obj, "prompt", where)
        input_len = _count(obj, ("input_len",), where, 1)
        if (text is None) == (input_len is None):
            raise UsageError(f"{where}: give exactly one of prompt (text) or input_len")
        output_len = _count(obj, ("output_len",), where, 1) or default_output
        if output_len is None:
            raise UsageError(f"{where}: output_len: required (on the line or as the source's)")
        out.append(Entry(text, input_len, output_len))
    if not out:
        raise UsageError(f"{path}: no requests in the file")
    return out


def _array_items(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, item) of a top-level JSON array, decoded item by item so that a bad entry
    can be named by its line."""
    text = _read(path)
    dec = json.JSONDecoder()
    i = len(text) - len(text.lstrip())
    if not text.startswith("[", i):
        line = text.count("\n", 0, i) + 1
        raise UsageError(f"{path}:{line}: ShareGPT file must be a JSON array")
    i += 1
    while True:
        i += len(text[i:]) - len(text[i:].lstrip())
        if text.startswith("]", i):
            return
        line = text.count("\n", 0, i) + 1
        try:
            item, end = dec.raw_decode(text, i)
        except ValueError as exc:
            raise UsageError(f"{path}:{getattr(exc, 'lineno', line)}: not JSON: "
                             f"{getattr(exc, 'msg', exc)}") from None
        yield line, item
        i = end + len(text[end:]) - len(text[end:].lstrip())
        if text.startswith(",", i):
            i += 1
        elif not text.startswith("]", i):
            raise UsageError(f"{path}:{text.count(chr(10), 0, i) + 1}: expected ',' or ']'")


def read_sharegpt(path: Path) -> list[Entry]:
    out = []
    for line, item in _array_items(path):
        where = f"{path}:{line}"
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or not all(
                isinstance(t, dict) and isinstance(t.get("value"), str) for t in turns):
            raise UsageError(f"{where}: entry needs \"conversations\": [{{\"from\": ..., "
                             "\"value\": TEXT}, ...]")
        if len(turns) >= 2:  # vLLM skips entries without a completion; so do we
            out.append(Entry(turns[0]["value"], None, None, completion=turns[1]["value"]))
    if not out:
        raise UsageError(f"{path}: no conversation with a prompt and a completion")
    return out


def read_trace(path: Path) -> list[Entry]:
    out: list[Entry] = []
    last = 0.0
    for n, obj in _jsonl(path):
        where = f"{path}:{n}"
        stamp = obj.get("timestamp")
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or stamp < 0:
            raise UsageError(f"{where}: timestamp: must be milliseconds >= 0, got {stamp!r}")
        if stamp / 1000.0 < last:
            raise UsageError(f"{where}: timestamp: {stamp} is earlier than the line before")
        last = stamp / 1000.0
        text = _text(obj, "prompt", where)
        input_len = _count(obj, ("input_length", "input_len"), where, 1)
        output_len = _count(obj, ("output_length", "output_len"), where, 1)
        if output_len is None or (input_len is None and text is None):
            raise UsageError(f"{where}: needs output_length and input_length (or prompt)")
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or not all(isinstance(h, int) for h in ids):
            raise UsageError(f"{where}: hash_ids: must be a list of integers")
        out.append(Entry(text, input_len, output_len, timestamp_s=last, hash_ids=tuple(ids)))
    if not out:
        raise UsageError(f"{path}: no requests in the file")
    return out
