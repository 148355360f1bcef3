"""Load a workload YAML (docs/architecture.md) into a validated `Workload`.

Every mistake is a `UsageError` naming the file and the key (`studies/q.yaml: cells[1].concurrency:
must be an integer > 0, got 0`), because a typo found after an hour of tuning costs the hour.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tuner.bench.capacity import CapacitySpec, parse_capacity
from tuner.bench.prompts import PromptMaker
from tuner.bench.records import Cell, Warmup
from tuner.bench.sources import parse_source
from tuner.errors import UsageError

TOP_KEYS = ("name", "seed", "warmup", "defaults", "cells", "objectives", "slo", "capacity")
CELL_KEYS = ("concurrency", "input_len", "output_len", "num_prompts", "duration_s", "request_rate",
             "source")
WARMUP_KEYS = ("requests", "input_len", "output_len")
DEFAULT_KEYS = ("num_prompts_per_concurrency",)
DEFAULT_PROMPTS_PER_CONCURRENCY = 4
DEFAULT_WARMUP = Warmup(requests=1, input_len=16, output_len=4)
GOODPUT_KEYS = ("ttft", "tpot", "e2el")  # per-request quantities that vllm's --goodput understands


@dataclass(frozen=True)
class Workload:
    name: str
    seed: int
    warmup: Warmup | None
    cells: tuple[Cell, ...]
    objectives: tuple[str, ...] = ()
    slo: dict[str, float] = field(default_factory=dict)
    capacity: CapacitySpec | None = None

    def goodput_slo_ms(self) -> dict[str, float]:
        """Per-request limits for `request_goodput`, read off the aggregate SLOs: a p99 TTFT limit
        of 2000 ms means each request should see TTFT <= 2000 ms."""
        out: dict[str, float] = {}
        for key, limit in self.slo.items():
            parts = key.split("_")
            if len(parts) == 3 and parts[2] == "ms" and parts[1] in GOODPUT_KEYS:
                out[parts[1]] = min(limit, out.get(parts[1], limit))
        return out


def load_workload(path: str | Path, extra_keys: Iterable[str] = ()) -> Workload:
    """`extra_keys`: top-level keys another loader owns (a study file adds its own) and that are
    therefore not unknown here."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: malformed YAML: {' '.join(str(exc).split())}") from None
    return parse_workload(data, str(path), extra_keys)


def parse_workload(data: Any, source: str, extra_keys: Iterable[str] = ()) -> Workload:
    top = _mapping(data, source, "(top level)", (*TOP_KEYS, *extra_keys))
    defaults = _mapping(top.get("defaults", {}), source, "defaults", DEFAULT_KEYS)
    per_conc = _int(defaults, "num_prompts_per_concurrency", source, "defaults", 1,
                    DEFAULT_PROMPTS_PER_CONCURRENCY)
    raw_cells = top.get("cells")
    if not isinstance(raw_cells, list) or not raw_cells:
        raise UsageError(f"{source}: cells: must be a non-empty list of cells")
    cells = tuple(_cell(c, source, f"cells[{i}]", per_conc) for i, c in enumerate(raw_cells))
    raw_capacity = top.get("capacity")
    capacity = None
    if raw_capacity is not None:
        capacity = parse_capacity(raw_capacity, source, len(cells))
    warmup: Warmup | None = DEFAULT_WARMUP
    if "warmup" in top:
        if top["warmup"] is None:
            warmup = None
        else:
            w = _mapping(top["warmup"], source, "warmup", WARMUP_KEYS)
            warmup = Warmup(_int(w, "requests", source, "warmup", 0, 1),
                            _int(w, "input_len", source, "warmup", 0, 16),
                            _int(w, "output_len", source, "warmup", 1, 4))
    name = top.get("name", Path(source).stem)
    if not isinstance(name, str) or not name:
        raise UsageError(f"{source}: name: must be a non-empty string")
    seed = _int(top, "seed", source, "", None, 0)
    return Workload(name, seed, warmup, cells, _objectives(top.get("objectives", []), source),
                    _slo(top.get("slo", {}), source), capacity)


def _mapping(value: Any, source: str, where: str, allowed: Iterable[str]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise UsageError(f"{source}: {where}: must be a mapping, got {type(value).__name__}")
    allowed = tuple(allowed)
    for key in value:
        if key not in allowed:
            raise UsageError(
                f"{source}: {_at(where, key)}: unknown key (allowed: {', '.join(allowed)})"
            )
    return value


def _at(where: str, key: str) -> str:
    return key if where in ("", "(top level)") else f"{where}.{key}"


def _int(
    m: Mapping[str, Any], key: str, source: str, where: str, low: int | None, default: int | None
) -> int:
    value = m.get(key, default)
    if value is None:
        raise UsageError(f"{source}: {_at(where, key)}: required")
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        bound = f" >= {low}" if low is not None else ""
        raise UsageError(f"{source}: {_at(where, key)}: must be an integer{bound}, got {value!r}")
    return value


def _positive(m: Mapping[str, Any], key: str, source: str, where: str) -> float | None:
    value = m.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UsageError(f"{source}: {_at(where, key)}: must be a number > 0, got {value!r}")
    return float(value)


def _cell(raw: Any, source: str, where: str, per_conc: int) -> Cell:
    c = _mapping(raw, source, where, CELL_KEYS)
    if "source" in c:
        return _source_cell(c, source, where)
    concurrency = _int(c, "concurrency", source, where, 1, None)
    input_len = _int(c, "input_len", source, where, 0, None)
    output_len = _int(c, "output_len", source, where, 1, None)
    num_prompts = _int(c, "num_prompts", source, where, 1, 0) if "num_prompts" in c else None
    duration = _positive(c, "duration_s", source, where)
    if num_prompts is None and duration is None:
        num_prompts = concurrency * per_conc
    return Cell(concurrency, input_len, output_len, num_prompts, duration,
                _positive(c, "request_rate", source, where))


def _source_cell(c: Mapping[str, Any], source: str, where: str) -> Cell:
    """A cell whose requests come from a dataset, trace or shared-prefix source; its input_len and
    output_len are the source's largest (counted in words: the model's tokenizer is not known
    here), which is what `--max-new-tokens` is rendered from."""
    for key in ("input_len", "output_len", "num_prompts"):
        if key in c:
            raise UsageError(f"{source}: {where}.{key}: set by the source (give it there)")
    src = parse_source(c["source"], Path(source).parent, f"{source}: {where}.source")
    specs = src.requests(0, PromptMaker(None))
    return Cell(_int(c, "concurrency", source, where, 1, None),
                max(s.input_len for s in specs), max(s.output_len for s in specs), len(specs),
                _positive(c, "duration_s", source, where),
                _positive(c, "request_rate", source, where), src)


def _objectives(value: Any, source: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise UsageError(f"{source}: objectives: must be a list like [\"max output_throughput\"]")
    out = []
    for i, item in enumerate(value):
        parts = item.split() if isinstance(item, str) else []
        if len(parts) != 2 or parts[0] not in ("max", "min"):
            raise UsageError(
                f'{source}: objectives[{i}]: must be "max METRIC" or "min METRIC", got {item!r}'
            )
        out.append(f"{parts[0]} {parts[1]}")
    return tuple(out)


def _slo(value: Any, source: str) -> dict[str, float]:
    if not isinstance(value, dict):
        raise UsageError(f"{source}: slo: must be a mapping of metric -> limit")
    out = {}
    for key, limit in value.items():
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0:
            raise UsageError(f"{source}: slo.{key}: must be a number > 0, got {limit!r}")
        out[str(key)] = float(limit)
    return out
