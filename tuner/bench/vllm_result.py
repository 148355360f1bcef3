"""`tuner bench --save-result`: one cell as the JSON `vllm bench serve --save-result` writes.

Why: users already keep and diff vllm's result files (and tools read them), so a cell measured
here is saved under the same field names: the run's setup (`date`, `backend`, `model_id`,
`tokenizer_id`, `num_prompts`, `request_rate`, `burstiness`, `max_concurrency`), the aggregate
metrics (`duration`, `completed`, throughputs, `request_goodput`, mean/median/std/pNN of
ttft/tpot/itl/e2el in ms) and the per-request arrays (`input_lens`, `output_lens`, `ttfts`,
`itls` in seconds, `generated_texts`, `errors`).  Field names and units follow
vllm/benchmarks/serve.py (v0.31).  Fields vllm does not have say what vllm leaves implicit:
which clock `duration` was measured on, and where `input_lens` came from.

Several cells make several results: one JSON object per line, as vllm's `--append-result`
writes them; a file of one cell is a plain JSON document, exactly like vllm's.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.bench.records import CellResult, RequestRecord, duration_clock

BACKENDS = {"chat": "openai-chat", "completions": "openai"}   # vllm's --backend names


@dataclass(frozen=True)
class RunInfo:
    """What a result file says about the run besides the measurements."""

    api: str
    model_id: str
    tokenizer_id: str | None      # the tokenizer.json folder used, None: approximate lengths
    time_scale: float = 1.0       # the simulator's simulated seconds per wall second
    date: str = ""                # vllm's format, %Y%m%d-%H%M%S; now when empty

    @property
    def backend(self) -> str:
        return BACKENDS.get(self.api, self.api)


def _rate(cell_rate: float | None) -> float | str:
    return cell_rate if cell_rate is not None else "inf"   # vllm: "inf" = all at once


def _per_request(records: Sequence[RequestRecord], input_len: int | None,
                 texts: Mapping[int, str]) -> dict[str, Any]:
    """vllm's arrays: one entry per request sent, in order; times in seconds."""
    ok = [r.ok for r in records]
    counted = all(r.prompt_tokens is not None for r in records if r.ok)
    return {
        "input_lens": [r.prompt_tokens if r.prompt_tokens is not None else input_len
                       for r in records],
        "input_lens_source": ("the server's usage.prompt_tokens" if counted and any(ok)
                              else "the requested length"),
        "output_lens": [r.output_tokens if r.ok else 0 for r in records],
        "ttfts": [r.ttft if r.ok and r.ttft is not None else 0.0 for r in records],
        "itls": [[b - a for a, b in zip(r.token_times, r.token_times[1:])] if r.ok else []
                 for r in records],
        "generated_texts": [texts.get(id(r), "") for r in records],
        "errors": ["" if r.ok else (r.error or r.error_class or "failed") for r in records],
    }


def result_doc(result: CellResult, info: RunInfo,
               texts: Mapping[int, str] | None = None) -> dict[str, Any]:
    """One cell as vllm's result JSON (field order as vllm writes it)."""
    cell, m = result.cell, result.metrics
    doc: dict[str, Any] = {
        "date": info.date or _dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": info.backend, "backend": info.backend, "label": None,
        "model_id": info.model_id, "tokenizer_id": info.tokenizer_id,
        "num_prompts": cell.num_prompts if cell.num_prompts is not None else len(result.records),
        "request_rate": _rate(cell.request_rate),
        "burstiness": 1.0, "max_concurrency": cell.concurrency,
        "duration": result.duration_s,
        "duration_clock": duration_clock(result.records, info.time_scale),
        "completed": m.get("completed", 0), "failed": m.get("failed", 0),
        "total_input_tokens": m.get("total_input_tokens", 0),
        "total_output_tokens": m.get("total_output_tokens", 0),
        "request_throughput": m.get("request_throughput", 0.0),
        "request_goodput": m.get("request_goodput"),
        "output_throughput": m.get("output_throughput", 0.0),
        "total_token_throughput": m.get("total_token_throughput", 0.0),
        **_per_request(result.records, cell.input_len if cell.source is None else None,
                       texts or {}),
    }
    doc.update({k: v for k, v in m.items() if k.endswith("_ms")})
    doc["tuner_cell"] = cell.key
    doc["tuner_error"] = {"class": result.error_class, "reason": result.error} \
        if result.error_class else None
    return doc


def default_path(info: RunInfo, results: Sequence[CellResult]) -> Path:
    """vllm's file name: {backend}-{rate}qps-concurrency{c}-{model}-{date}.json (one cell)."""
    date = info.date or _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    model = info.model_id.rstrip("/").split("/")[-1]
    if len(results) == 1:
        c = results[0].cell
        return Path(f"{info.backend}-{_rate(c.request_rate)}qps-concurrency{c.concurrency}-"
                    f"{model}-{date}.json")
    return Path(f"{info.backend}-{len(results)}cells-{model}-{date}.json")


def _plain(v: Any) -> Any:
    """JSON has no inf or nan."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def write(path: Path, docs: Sequence[Mapping[str, Any]]) -> Path:
    """One JSON object per line (a single cell: a plain JSON document)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({k: _plain(v) for k, v in d.items()}, allow_nan=False) for d in docs]
    path.write_text("\n".join(lines) + "\n")
    return path
