"""The simulator's block-level prefix cache (upstream InfiniLM's rules, tuner/sim/prefix_cache)."""

from __future__ import annotations

import requests

from tests.sim.test_server import free_port, start, stop, wait_health
from tuner.bench.records import Cell
from tuner.bench.sources import SharedPrefixSource
from tuner.paths import REPO_ROOT
from tuner.sim import simulate
from tuner.sim.api import open_engine
from tuner.sim.prefix_cache import PrefixCache, segment_block_hashes, token_block_hashes

MODEL = str(REPO_ROOT / "models" / "llama-3.1-8b")
ARGS = ["--num-blocks", "64", "--block-size", "16", "--max-batch-size", "8"]


def test_hashes_chain_over_full_blocks_only():
    a = segment_block_hashes([("sys", 40), ("q1", 10)], 16)
    b = segment_block_hashes([("sys", 40), ("q2", 10)], 16)
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]  # block 3 holds q's first tokens
    assert segment_block_hashes([("other", 40)], 16)[0] != a[0]
    # the same content split into segments differently is a different identity, but the word
    # form hashes by content
    tokens = list("abcdefgh")
    assert token_block_hashes(tokens, 4) == token_block_hashes(tokens + ["x"], 4)


def test_fully_cached_prompt_recomputes_its_last_block():
    cache = PrefixCache(True)
    hashes = segment_block_hashes([("p", 64)], 16)
    cache.register(hashes)
    assert cache.hits(hashes, 64, 16) == 3   # 4 blocks cached, the last one computed again
    assert cache.hits(hashes, 70, 16) == 4
    assert PrefixCache(False).hits(hashes, 70, 16) == 0


def test_released_blocks_stay_findable_until_evicted():
    cache = PrefixCache(True)
    h = segment_block_hashes([("p", 48)], 16)
    cache.register(h)
    cache.release(h)
    assert cache.evictable() == 3 and cache.evictable(h[:1]) == 2
    assert cache.hits(h, 60, 16) == 3
    assert cache.evict(2) == 2 and cache.hits(h, 60, 16) == 0  # oldest (the first block) gone


def engine(*extra):
    return open_engine(MODEL, "rtx4090", ARGS + list(extra), {})


def test_engine_reuses_a_shared_prefix_and_charges_only_the_rest():
    cell = Cell(1, 0, 8, 4, source=SharedPrefixSource(1, 480, 16, 1, 8, conversations=4))
    on, off = (simulate(MODEL, "rtx4090", ARGS + extra, {}, [cell])[0]
               for extra in ([], ["--disable-prefix-caching"]))
    ttft_on = [r.ttft for r in on.records]
    ttft_off = [r.ttft for r in off.records]
    assert abs(ttft_on[0] - ttft_off[0]) < 1e-9     # the first request finds nothing cached
    assert all(a < 0.5 * b for a, b in zip(ttft_on[1:], ttft_off[1:]))


def test_cache_blocks_are_counted_against_the_pool():
    eng = engine()
    seg = segment_block_hashes([("<template>", 36), ("p", 476)], 16)  # 32 full blocks
    a = eng.submit(512, 16, 0.0, tuple(seg))  # 33 blocks: 32 of prompt, 1 for the output
    while not a.finished:
        eng.advance()
    # finished: the prompt's 32 hashed blocks stay cached (idle), the other one is returned
    assert eng.free_blocks == 64 - 32 and eng.cache.evictable() == 32
    b = eng.submit(1000, 8, eng.clock)  # needs 63 blocks: the cache must give way
    while not b.finished:
        eng.advance()
    assert b.error is None and eng.cache.evictable() < 32


def test_http_server_hits_on_a_repeated_prefix_and_not_when_disabled(tmp_path):
    """Over HTTP the simulator hashes the template and the messages' words into blocks."""
    prefix = " ".join(f"w{i}" for i in range(600))
    ttfts = {}
    for flag in ([], ["--disable-prefix-caching"]):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start(["--port", str(port), "--time-scale", "50", *ARGS, *flag],
                     tmp_path / "server.log")
        try:
            wait_health(url, proc)
            seen = []
            for question in ("first question", "another one"):
                body = {"messages": [{"role": "user", "content": f"{prefix} {question}"}],
                        "max_tokens": 2}
                resp = requests.post(url + "/v1/chat/completions", json=body, timeout=10)
                arrival = float(resp.headers["X-Tuner-Sim-Arrival"])
                seen.append(resp.json()["sim_t"][0] - arrival)
            ttfts[bool(flag)] = seen
        finally:
            stop(proc)
    assert ttfts[False][1] < 0.5 * ttfts[True][1]
