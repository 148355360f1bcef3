"""Multi-turn traffic, turn after answer: which turn goes next (tuner.bench.turns), in the
in-process simulator with its timestamps, and over HTTP against the simulated server as a real
process on loopback."""

from __future__ import annotations

from collections import defaultdict

from tests.sim.test_server import free_port, start, stop, wait_health
from tuner.bench.records import Cell, RequestRecord
from tuner.bench.runner import run_cells
from tuner.bench.sources import SharedPrefixSource
from tuner.bench.turns import TurnQueue, renew
from tuner.paths import REPO_ROOT
from tuner.sim.api import open_engine, simulate

MODEL = str(REPO_ROOT / "models" / "llama-3.1-8b")
SRC = SharedPrefixSource(groups=2, prefix_len=96, suffix_len=8, turns=3, output_len=16,
                         conversations=2)
WORDS = type("Words", (), {"count": staticmethod(lambda text: len(text.split()))})()


def test_closed_loop_keeps_sessions_open_and_follow_ups_join_the_back():
    q = TurnQueue(SRC.requests(0, WORDS), sessions=4)
    first = [q.pop() for _ in range(4)]
    assert [(t.serial, t.index) for t in first if t] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert q.pop() is None                      # every conversation waits for its answer
    q.answered(first[2], ok=True)
    q.answered(first[0], ok=False)              # a failed answer ends it: the next one opens
    a, b = q.pop(), q.pop()
    assert a is not None and (a.serial, a.index) == (2, 1)
    assert b is not None and (b.serial, b.index) == (4, 0)  # source's conversation 0, again
    assert b.spec.segments[0] == first[0].spec.segments[0]          # same system prompt
    assert b.spec.segments[1] != first[0].spec.segments[1]          # a fresh question
    assert a.spec.segments[: len(first[2].spec.segments)] == first[2].spec.segments
    answer = q.answer_segment(first[2])
    assert answer == a.spec.segments[len(first[2].spec.segments)] and answer[1] == 16


def test_open_loop_opens_on_demand_and_a_last_turn_opens_nothing():
    q = TurnQueue(SRC.requests(0, WORDS), sessions=None)
    assert q.pop() is None and q.mean_turns == 3
    t = q.open()
    assert q.pop() == t
    assert q.answered(t, ok=False) is None and q.pop() is None


def test_renew_keeps_epoch_zero():
    spec = SRC.requests(0, WORDS)[0]
    assert renew(spec, 0) is spec and renew(spec, 2).segments[1][0].endswith("~2")


def _by_conversation(records: list[RequestRecord]) -> dict[int, list[RequestRecord]]:
    chats: dict[int, list[RequestRecord]] = defaultdict(list)
    for rec in records:
        assert rec.turn_of is not None
        chats[rec.turn_of[0]].append(rec)
    return {c: sorted(recs, key=lambda r: r.turn_of or (0, 0)) for c, recs in chats.items()}


def _check_turn_after_answer(records: list[RequestRecord], turns: int) -> None:
    chats = _by_conversation(records)
    assert any(len(recs) == turns for recs in chats.values())
    for recs in chats.values():
        assert [r.turn_of[1] for r in recs if r.turn_of] == list(range(len(recs)))
        for prev, nxt in zip(recs, recs[1:]):
            # (sim_t is rounded to the microsecond)
            assert prev.ok and nxt.send_time >= prev.token_times[-1] - 1e-6
            # the follow-up's prompt is the previous prompt, its answer and a new question
            assert nxt.prompt_tokens == (prev.prompt_tokens or 0) + prev.output_tokens + 8


def test_in_process_turns_are_sent_after_their_answers_and_reuse_them():
    cell = Cell(8, 0, 16, 24, request_rate=50.0, source=SRC)  # past the source's 12 turns
    on, off = (simulate(MODEL, "rtx4090", ["--num-blocks", "256", "--block-size", "16", *x], {},
                        [cell])[0] for x in ([], ["--disable-prefix-caching"]))
    assert on.error_class is None and len(on.records) == 24
    _check_turn_after_answer(on.records, 3)
    ttft_off = {r.turn_of: r.ttft or 0.0 for r in off.records}
    later = [r for r in on.records if r.turn_of and r.turn_of[1] > 0 and r.turn_of in ttft_off]
    assert len(later) >= 8
    # the history (earlier prompt and answer) is served from the cache: prefill only the rest
    assert sum(r.ttft or 0.0 for r in later) < 0.6 * sum(ttft_off[r.turn_of] for r in later)


def test_engine_publishes_answer_blocks_for_the_follow_up():
    eng = open_engine(MODEL, "rtx4090", ["--num-blocks", "64", "--block-size", "16"], {})
    from tuner.sim.prefix_cache import segment_block_hashes
    first = segment_block_hashes([("p", 64), ("a", 32)], 16)       # prompt 4 blocks + answer 2
    a = eng.submit(64, 33, 0.0, tuple(first))
    while not a.finished:
        eng.advance()
    follow = segment_block_hashes([("p", 64), ("a", 32), ("q", 40)], 16)
    b = eng.submit(136, 4, eng.clock, tuple(follow))
    while not b.finished:
        eng.advance()
    assert b.cached_tokens == 96  # the prompt's 4 blocks and the answer's 2


def test_http_turns_carry_the_answers_and_follow_them(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["--port", str(port), "--time-scale", "20", "--num-blocks", "256",
                  "--block-size", "16"], tmp_path / "server.log")
    try:
        wait_health(url, proc)
        closed, paced = run_cells(url, [Cell(3, 0, 16, 12, source=SRC),
                                        Cell(8, 0, 16, 12, request_rate=6.0, source=SRC)],
                                  model_name="m", health_url=url + "/health")
    finally:
        stop(proc)
    for res in (closed, paced):
        assert res.error_class is None and len(res.records) == 12, res.error
        assert all(r.sim for r in res.records)
        _check_turn_after_answer(res.records, 3)
