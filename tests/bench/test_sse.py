"""SSE parsing edge cases that real servers and real networks produce."""

from tuner.bench.sse import SSEParser


def feed_all(parts: list[bytes]) -> list[str]:
    p = SSEParser()
    out: list[str] = []
    for part in parts:
        out.extend(p.feed(part))
    return out + p.close()


def test_several_events_in_one_read():
    assert feed_all([b"data: a\n\ndata: b\n\ndata: [DONE]\n\n"]) == ["a", "b", "[DONE]"]


def test_event_split_across_reads_anywhere():
    raw = b'data: {"x": 1}\n\ndata: {"y": 2}\n\n'
    for cut in range(1, len(raw)):
        assert feed_all([raw[:cut], raw[cut:]]) == ['{"x": 1}', '{"y": 2}']


def test_crlf_line_endings_even_when_split_between_cr_and_lf():
    assert feed_all([b"data: a\r", b"\n\r\n", b"data: b\r\n\r\n"]) == ["a", "b"]


def test_comments_and_other_fields_are_skipped():
    raw = b": keep-alive\n\nevent: message\nid: 3\nretry: 10\ndata: a\n\n: ping\n\n"
    assert feed_all([raw]) == ["a"]


def test_multiline_data_joined_with_newline():
    assert feed_all([b"data: a\ndata: b\n\n"]) == ["a\nb"]


def test_utf8_character_split_between_reads():
    raw = 'data: {"t": "é漢"}\n\n'.encode()
    i = raw.index("漢".encode()) + 1  # inside the 3-byte character
    assert feed_all([raw[:i], raw[i:]]) == ['{"t": "é漢"}']


def test_no_space_after_colon_and_last_event_without_blank_line():
    assert feed_all([b"data:a\n\ndata: tail"]) == ["a", "tail"]
