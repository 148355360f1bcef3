"""A cell's requests, serialised before the cell starts.

Building a long prompt and its JSON costs tens of microseconds, which inside a measured cell would
delay the stamping of other streams; so every request of a cell is ready before its first send.
A closed-loop cell on the simulated server also announces its plan (tuner.sim.admission), so the
simulator does not turn the client's wall-clock jitter into simulated time.
"""

from __future__ import annotations

import random
import uuid

from tuner.bench.client import StreamClient
from tuner.bench.conversations import Chats
from tuner.bench.prompts import PromptMaker, render_prompt
from tuner.bench.records import Cell

SIM_PLAN_HEADER = "X-Tuner-Sim-Plan"  # tuner.sim.admission reads it
# Distinct prompts per cell; beyond this they repeat (far apart, so prefix caches rarely help),
# and building them never happens while the cell is being measured.
MAX_PROMPT_POOL = 512
# request bytes, a trace's arrival offsets, a multi-turn cell's conversations (whose requests are
# built as they are sent: each holds the answers before it)
Payloads = tuple[list[bytes], "list[float] | None", "Chats | None"]


def plan_headers(cell: Cell, total: int) -> dict[str, str]:
    """A simulated server's `X-Tuner-Sim-Plan` for a closed-loop cell (tuner.sim.admission): the
    requests it keeps in flight and sends in all, so that the server waits for each wave instead of
    turning the client's wall-clock jitter into simulated time.  Open loop: none."""
    if cell.request_rate is not None:
        return {}
    streams = min(cell.concurrency, total) if total else cell.concurrency
    return {SIM_PLAN_HEADER: f"{uuid.uuid4().hex[:12]} {streams} {total}"}


def payloads(client: StreamClient, maker: PromptMaker, cell: Cell, rng: random.Random,
              seed: int = 0, sim: bool = False) -> Payloads:
    """The requests, built before the cell starts, and a trace's arrival offsets."""
    if cell.source is not None:
        specs = cell.source.requests(seed, maker)
        trace = specs[0].arrival_s is not None
        if specs[0].turn_of is not None:
            headers = plan_headers(cell, cell.num_prompts or 0) if sim else None
            sessions = None if cell.request_rate else cell.concurrency
            return [], None, Chats(specs, client, maker, rng, sessions, headers)
        headers = plan_headers(cell, len(specs)) if sim and not trace else None
        shared: dict[tuple[str, int], str] = {}
        data = [client.prepare(render_prompt(s, maker, rng, shared), s.output_len, headers)
                for s in specs]
        return data, [s.arrival_s or 0.0 for s in specs] if trace else None, None
    n = max(2 * cell.concurrency, min(cell.num_prompts or MAX_PROMPT_POOL, MAX_PROMPT_POOL))
    if cell.num_prompts is not None:
        n = min(n, cell.num_prompts)
    headers = plan_headers(cell, cell.num_prompts or 0) if sim else None
    return [client.prepare(maker.make(cell.input_len, rng), cell.output_len, headers)
            for _ in range(max(n, 1))], None, None
