"""Where a cell's requests come from when they are not all alike: a dataset, a trace, or
synthetic shared-prefix traffic.

A source turns into a list of `RequestSpec`s (lengths, and for a trace the arrival offsets) for
a given seed.  Lengths are counted by the model's tokenizer when the model dir has one
(`tokenizer.json`), else approximately, one whitespace word per token (the simulator counts
the same way, so simulated lengths are exact; a real server reports its own count in `usage`).

`segments` name shared content: two requests whose first segments have equal keys start with
the same tokens, which is what a prefix cache can reuse.  The simulator hashes them into KV
blocks; the HTTP client renders each key into the same text every time.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tuner.bench.datafiles import (
    MIN_SHAREGPT_TOKENS,
    Entry,
    read_jsonl_dataset,
    read_sharegpt,
    read_trace,
)
from tuner.errors import UsageError

MOONCAKE_BLOCK_TOKENS = 512  # one Mooncake hash id covers 512 tokens


@dataclass(frozen=True)
class RequestSpec:
    input_len: int
    output_len: int
    arrival_s: float | None = None   # offset from the cell's start (traces)
    text: str | None = None          # the prompt as given (datasets, traces with prompts)
    segments: tuple[tuple[str, int], ...] = ()  # shared leading content: (key, tokens)
    # multi-turn: (conversation, turn); turn k+1 is sent once turn k's answer has ended, and
    # its prompt is turn k's prompt, that answer, then a new question (tuner.bench.conversations)
    turn_of: tuple[int, int] | None = None


class Counter(Protocol):
    def count(self, text: str) -> int: ...


class Source(Protocol):
    @property
    def label(self) -> str: ...

    def requests(self, seed: int, counter: Counter) -> list[RequestSpec]: ...


def _len(entry: Entry, counter: Counter) -> int:
    return entry.input_len if entry.input_len is not None else counter.count(entry.text or "")


@dataclass(frozen=True)
class DatasetSource:
    """Prompts sampled (seeded) from a file; oversampled with replacement when `num_prompts`
    exceeds the file, as vLLM does by default."""

    path: str
    entries: tuple[Entry, ...]
    num_prompts: int
    label: str = "dataset"

    def requests(self, seed: int, counter: Counter) -> list[RequestSpec]:
        pool = []
        for e in self.entries:
            n_in = _len(e, counter)
            n_out = e.output_len if e.output_len is not None else counter.count(e.completion or "")
            if e.completion is not None and min(n_in, n_out) < MIN_SHAREGPT_TOKENS:
                continue
            pool.append(RequestSpec(n_in, n_out, text=e.text))
        if not pool:
            raise UsageError(f"{self.path}: every entry is shorter than "
                             f"{MIN_SHAREGPT_TOKENS} tokens")
        rng = random.Random(f"{seed}:dataset")
        if self.num_prompts <= len(pool):
            return rng.sample(pool, self.num_prompts)
        return rng.sample(pool, len(pool)) + rng.choices(pool, k=self.num_prompts - len(pool))


@dataclass(frozen=True)
class TraceSource:
    """Requests at the trace's arrival times divided by `time_scale` (2 = twice as fast)."""

    path: str
    entries: tuple[Entry, ...]
    time_scale: float = 1.0
    num_prompts: int | None = None
    label: str = "trace"

    def requests(self, seed: int, counter: Counter) -> list[RequestSpec]:
        entries = self.entries[: self.num_prompts]
        t0 = entries[0].timestamp_s or 0.0
        out = []
        for e in entries:
            n_in = _len(e, counter)
            segs = tuple((f"h{h}", MOONCAKE_BLOCK_TOKENS) for h in e.hash_ids)
            segs = _clip(segs, n_in)
            out.append(RequestSpec(n_in, e.output_len or 1, ((e.timestamp_s or 0.0) - t0)
                                   / self.time_scale, e.text, segs))
        return out


def _clip(segments: tuple[tuple[str, int], ...], limit: int) -> tuple[tuple[str, int], ...]:
    out, used = [], 0
    for key, n in segments:
        if used >= limit:
            break
        out.append((key, min(n, limit - used)))
        used += out[-1][1]
    return tuple(out)


@dataclass(frozen=True)
class SharedPrefixSource:
    """`groups` system prompts of `prefix_len` tokens, each shared by `conversations` chats of
    `turns` turns; turn t's prompt is the system prompt, the earlier turns (question of
    `suffix_len` tokens, answer of `output_len`) and a new question.  Requests are listed turn
    by turn; each carries its `turn_of`, and a turn is sent only after the answer to the one
    before it (tuner.bench.conversations), whose text the HTTP client puts in the history."""

    groups: int
    prefix_len: int
    suffix_len: int
    turns: int
    output_len: int
    conversations: int = 1
    label: str = "shared_prefix"

    def requests(self, seed: int, counter: Counter) -> list[RequestSpec]:
        chats = list(itertools.product(range(self.groups), range(self.conversations)))
        out = []
        for t in range(self.turns):
            for conv, (g, c) in enumerate(chats):
                segs: list[tuple[str, int]] = [(f"{seed}:sys{g}", self.prefix_len)]
                for k in range(t + 1):
                    segs.append((f"{seed}:q{g}.{c}.{k}", self.suffix_len))
                    if k < t:
                        segs.append((f"{seed}:a{g}.{c}.{k}", self.output_len))
                n_in = sum(n for _, n in segs)
                out.append(RequestSpec(n_in, self.output_len, segments=tuple(segs),
                                       turn_of=(conv, t)))
        return out


SOURCE_KEYS = {
    "dataset": ("path", "format", "num_prompts", "output_len"),
    "trace": ("path", "time_scale", "num_prompts"),
    "shared_prefix": ("groups", "prefix_len", "suffix_len", "turns", "output_len",
                      "conversations"),
}


def _num(m: Mapping[str, Any], key: str, where: str, default: Any = None, kind: type = int) -> Any:
    value = m.get(key, default)
    if value is None:
        raise UsageError(f"{where}.{key}: required")
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) \
            or value <= 0:
        raise UsageError(f"{where}.{key}: must be a number > 0, got {value!r}")
    return value


def parse_source(raw: Any, base: Path, where: str) -> Source:
    """A `source:` mapping of a workload cell -> a validated source; files are read now, so a
    malformed line stops the run before anything is sent.  Relative paths are taken from the
    workload file's directory."""
    if not isinstance(raw, dict) or len([k for k in raw if k in SOURCE_KEYS]) != 1:
        raise UsageError(f"{where}: must be a mapping with one of {', '.join(SOURCE_KEYS)}")
    kind = next(k for k in raw if k in SOURCE_KEYS)
    spec = raw[kind] if isinstance(raw[kind], dict) else None
    if spec is None or set(raw) != {kind}:
        raise UsageError(f"{where}.{kind}: must be a mapping of {', '.join(SOURCE_KEYS[kind])}")
    where = f"{where}.{kind}"
    for key in spec:
        if key not in SOURCE_KEYS[kind]:
            allowed = ", ".join(SOURCE_KEYS[kind])
            raise UsageError(f"{where}.{key}: unknown key (allowed: {allowed})")
    if kind == "shared_prefix":
        args = {k: _num(spec, k, where, 1 if k in ("turns", "conversations") else None)
                for k in SOURCE_KEYS[kind]}
        return SharedPrefixSource(**args)
    if not isinstance(spec.get("path"), str):
        raise UsageError(f"{where}.path: required (a file)")
    path = Path(spec["path"])
    path = path if path.is_absolute() else base / path
    if kind == "trace":
        scale = float(_num(spec, "time_scale", where, 1.0, float))
        limit = _num(spec, "num_prompts", where) if "num_prompts" in spec else None
        return TraceSource(str(path), tuple(read_trace(path)), scale, limit)
    fmt = spec.get("format", "sharegpt" if path.suffix == ".json" else "jsonl")
    if fmt not in ("sharegpt", "jsonl"):
        raise UsageError(f"{where}.format: must be sharegpt or jsonl, got {fmt!r}")
    out_len = _num(spec, "output_len", where) if "output_len" in spec else None
    entries = read_sharegpt(path) if fmt == "sharegpt" else read_jsonl_dataset(path, out_len)
    if fmt == "sharegpt" and out_len is not None:
        entries = [Entry(e.text, e.input_len, out_len) for e in entries]
    num = _num(spec, "num_prompts", where, len(entries))
    return DatasetSource(str(path), tuple(entries), num)
