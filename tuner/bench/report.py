"""Bench results as a terminal table, a JSON list of cells and a CSV beside it.

JSON rows carry vllm bench serve's field names so a user can diff them against `vllm bench serve
--save-result` output; the CSV holds the same rows for spreadsheets.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.bench.runner import CellResult

# (header, key, format)
_COLUMNS = (
    ("conc", "concurrency", "{:d}"),
    ("in", "input_len", "{:d}"),
    ("out", "output_len", "{:d}"),
    ("ok", "completed", "{:d}"),
    ("fail", "failed", "{:d}"),
    ("dur s", "duration", "{:.2f}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("out tok/s", "output_throughput", "{:.1f}"),
    ("TTFT mean", "mean_ttft_ms", "{:.2f}"),
    ("TTFT p99", "p99_ttft_ms", "{:.2f}"),
    ("TPOT mean", "mean_tpot_ms", "{:.3f}"),
    ("TPOT p99", "p99_tpot_ms", "{:.3f}"),
    ("ITL mean", "mean_itl_ms", "{:.3f}"),
    ("ITL p99", "p99_itl_ms", "{:.3f}"),
    ("E2E p99", "p99_e2el_ms", "{:.1f}"),
    ("error", "error_class", "{}"),
)


def rows(results: Sequence[CellResult], time_scale: float = 1.0) -> list[dict[str, Any]]:
    return [r.to_dict(time_scale) for r in results]


def format_table(results: Sequence[CellResult]) -> str:
    """Latencies in ms; a plain fixed-width table that survives copy-paste into an issue."""
    table = [[h for h, _, _ in _COLUMNS]]
    for row in rows(results):
        cells = []
        for _, key, fmt in _COLUMNS:
            value = row.get(key)
            cells.append("-" if value is None else fmt.format(value))
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in table]
    return "\n".join(lines)


def write_results(results: Sequence[CellResult], path: str | Path,
                  time_scale: float = 1.0) -> tuple[Path, Path]:
    """Write `path` (JSON) and the CSV beside it (same stem); -> (json path, csv path)."""
    path = Path(path)
    data = rows(results, time_scale)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    csv_path = path.with_suffix(".csv")
    fields: list[str] = []
    for row in data:
        fields.extend(k for k in row if k not in fields)
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(data)
    return path, csv_path
