"""Per-cell metrics with the field names of `vllm bench serve`, so results compare line by line.

Definitions follow vllm/benchmarks/serve.py: TTFT is first token minus send; TPOT is
(latency - TTFT) / (output_tokens - 1) per request with more than one token; ITL is every gap
between consecutive token arrivals; E2EL is the last token minus send.  Throughputs divide by the
cell's duration.  Percentiles use linear interpolation (numpy's default), as vllm does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from tuner.bench.records import RequestRecord

PERCENTILES = (50, 90, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")

def per_request_ms(rec: RequestRecord) -> dict[str, float]:
    """The per-request quantities an SLO for goodput can name ("ttft", "tpot", "e2el"), in ms."""
    ttft, latency = rec.ttft or 0.0, rec.latency or 0.0  # both set on every ok record
    out = {"ttft": ttft * 1000.0, "e2el": latency * 1000.0}
    if rec.output_tokens > 1:
        out["tpot"] = (latency - ttft) * 1000.0 / (rec.output_tokens - 1)
    return out


def _stats(name: str, values_ms: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values_ms, dtype=float)
    if arr.size == 0:
        out = {f"mean_{name}_ms": 0.0, f"median_{name}_ms": 0.0, f"std_{name}_ms": 0.0}
        out.update({f"p{p}_{name}_ms": 0.0 for p in PERCENTILES})
        return out
    out = {
        f"mean_{name}_ms": float(arr.mean()),
        f"median_{name}_ms": float(np.median(arr)),
        f"std_{name}_ms": float(arr.std()),
    }
    out.update({f"p{p}_{name}_ms": float(np.percentile(arr, p)) for p in PERCENTILES})
    return out


def cell_metrics(
    records: Iterable[RequestRecord],
    duration_s: float,
    slo_ms: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Aggregate one cell's request records into vllm-named metrics.

    `slo_ms` maps "ttft" / "tpot" / "e2el" to a per-request limit in ms; a completed request that
    meets all of them counts towards `request_goodput` (requests/s), as in vllm's --goodput.
    """
    recs = list(records)
    ok = [r for r in recs if r.ok]
    duration_s = max(duration_s, 1e-9)
    ttfts: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    good = 0
    for r in ok:
        per = per_request_ms(r)
        ttfts.append(per["ttft"])
        e2els.append(per["e2el"])
        if "tpot" in per:
            tpots.append(per["tpot"])
        itls.extend(np.diff(np.asarray(r.token_times)) * 1000.0)
        if slo_ms and all(per.get(k, 0.0) <= v for k, v in slo_ms.items()):
            good += 1
    total_in = sum(r.prompt_tokens or 0 for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    out: dict[str, float] = {
        "completed": len(ok),
        "failed": len(recs) - len(ok),
        "duration": duration_s,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
    }
    if slo_ms:
        out["request_goodput"] = good / duration_s
    for name, vals in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out.update(_stats(name, vals))
    return {
        k: (float(v) if not isinstance(v, int) else v)
        for k, v in out.items()
        if not (isinstance(v, float) and math.isnan(v))
    }
