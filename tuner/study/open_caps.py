"""Open caps: the incumbent with one batch cap that holds fewer requests than the workload
keeps in flight raised to that count.

Why: a cap on the requests of one step (running requests, a prefill or a decode batch) below
the concurrency of the busiest cell of the matrix makes requests wait for one another, and no
other knob makes up for it.  On the fresh Mistral-7B / RTX 4090 scenario of
benchmarks/search_efficiency.py one seed ended 30 trials at 0.90 of the best with a decode
cap of 19 beside a 48-request chat cell: every decode cap from 38 up ran 11% faster, and the
cap was never moved, because its local turns went to the incumbent's categorical flips and to
random one-or-two-knob neighbours (one number of eight, at most a quarter of its range).  The
move is the smallest change that stops the cap from binding: above the cell's concurrency a
cap holds nothing back.  A cap kept low on purpose (a tight TPOT SLO) is kept by the run: the
raised config misses the SLO and is never tried again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution, IntDistribution

from tuner.bench.records import Cell
from tuner.search.space import SearchSpace

CAP_ROLES = ("max_batch", "prefill_batch_cap", "decode_batch_cap")   # counts of requests


def in_flight(cells: Sequence[Cell]) -> int:
    """The most requests one cell of the matrix keeps in flight (0 without cells)."""
    return max((min(c.concurrency, c.num_prompts or c.concurrency) for c in cells), default=0)


def request_caps(space: SearchSpace) -> list[str]:
    """The knobs of `space` that cap the requests of one step."""
    return [p.name for p in space.parameters if p.role in CAP_ROLES]


def opened_caps(params: Mapping[str, Any], caps: Collection[str],
                dists: Mapping[str, BaseDistribution],
                cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """`params` (restricted to `dists`) with one of the request `caps` below
    `in_flight(cells)` raised to it (to the top of its range where that is lower), the most
    binding cap first."""
    want = in_flight(cells)
    base = {k: params[k] for k in dists}
    out = []
    for name in caps:
        dist = dists.get(name)
        if not isinstance(dist, IntDistribution) or dist.single():
            continue
        steps = -(-(min(want, dist.high) - dist.low) // dist.step)   # on its grid, not below
        target = min(dist.high, dist.low + steps * dist.step)
        if target > int(base[name]):
            out.append((int(base[name]) / target, {**base, name: target}))
    return [c for _, c in sorted(out, key=lambda rc: rc[0])]
