"""What does checking every SSE event cost the client?  CPU per token chunk, side by side.

Two paths of tuner.bench.stream on the same bytes (reads of 50 chunks in the shape of
benchmarks/paced_server.py's, and in vLLM's): the template match of tuner.bench.frames, and the
full `json.loads` check every chunk would take without it.  The minimum over interleaved repeats is
printed (other processes share the cores; the minimum is the cost, the rest is waiting).

Run: PYTHONPATH=. python benchmarks/client_event_cost.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

from tuner.bench import stream
from tuner.bench.records import RequestRecord

CHUNKS = {
    "paced_server": ('{"id":"x","object":"chat.completion.chunk","created":1,"model":"paced",'
                     '"choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}],'
                     '"rcv_t":1234.5678,"due_t":1234.5679,"srv_t":%d.568}'),
    "vllm": ('{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1732000000,'
             '"model":"m","choices":[{"index":0,"delta":{"content":"tok%d"},"logprobs":null,'
             '"finish_reason":null}]}'),
}
READS, PER_READ = 20, 50


class _Activity:
    last = 0.0


def per_event_us(template: str) -> float:
    """Microseconds per chunk through Stream.on_body (SSE split + check + count)."""
    reads = [b"".join(b"data: %s\n\n" % (template % (r * PER_READ + i)).encode()
                      for i in range(PER_READ)) for r in range(READS)]
    rec = RequestRecord(0.0)
    s = stream.Stream(rec, True, _Activity(), lambda: None, None)
    s.on_head(200, {"content-type": "text/event-stream"})
    t0 = time.perf_counter()
    for data in reads:
        s.on_body(data, 1.0)
    elapsed = time.perf_counter() - t0
    assert rec.error is None and len(rec.token_times) == READS * PER_READ, rec.error
    return elapsed / (READS * PER_READ) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    print(f"us per token chunk, min over {args.repeats} interleaved repeats of "
          f"{READS * PER_READ} chunks")
    print(f"{'chunks like':14s} {'template match':>14s} {'json.loads':>11s}")
    for name, template in CHUNKS.items():
        fast, full = [], []
        for _ in range(args.repeats):
            fast.append(per_event_us(template))
            with mock.patch.object(stream, "learn", lambda data, key: None), \
                    mock.patch.object(stream, "known", lambda data, keys: None):
                full.append(per_event_us(template))
        print(f"{name:14s} {min(fast):14.2f} {min(full):11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
