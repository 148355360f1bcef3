"""The text each request generated, for `--save-result`'s `generated_texts`.

Why a hook and not the client: the client only needs token arrival times, and decoding every
chunk's JSON a second time costs client time while a cell is measured, so texts are collected
only when a result file asks for them, through the client's per-event hook.
"""

from __future__ import annotations

import json
from collections import defaultdict

from tuner.bench.records import RequestRecord


class TextCollector:
    """`on_event` hook: appends each chunk's text to its request's; `texts()` by id(record)."""

    def __init__(self) -> None:
        self._parts: dict[int, list[str]] = defaultdict(list)

    def __call__(self, record: RequestRecord, data: str, arrival: float) -> None:
        try:
            obj = json.loads(data)
        except ValueError:
            return  # the client itself judges malformed events
        choices = obj.get("choices") if isinstance(obj, dict) else None
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(text, str):
                self._parts[id(record)].append(text)

    def texts(self) -> dict[int, str]:
        return {k: "".join(v) for k, v in self._parts.items()}
