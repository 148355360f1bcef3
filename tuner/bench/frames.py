"""Token chunks checked at the cost of one regex match instead of a `json.loads` each.

A server writes its token chunks from one template: the same keys, the same nesting, the same
literals, with strings and numbers that change (the text, an id, a timestamp).  Once a chunk has
been parsed and found to be a plain token chunk, its *frame* is learned: a regex that repeats the
chunk's keys, punctuation and literals exactly and accepts any JSON string or number where the
chunk had one, and a non-empty JSON string in the text slot.  A later chunk that matches the frame
in full is therefore valid JSON with the same structure (`finish_reason` still null, no usage, no
error) and a non-empty text: a token.  Anything else (a truncated chunk, another shape, the last
chunk) fails the match and takes the full `json.loads` path, which also learns frames.  Only a
text key that occurs once in the chunk is learned, so that the slot is the one the parser reads.

The first chunk of each new request is tried against the frames learned last (`known`) before
`json.loads` and learning: at concurrency 256 the first tokens arrive in one wave, and ~0.1 ms
of parsing each delays the reads, which then stamp a first token with a later one's arrival.
"""

from __future__ import annotations

import re

# a JSON string's body, unrolled (runs of plain characters, possessive) so that re does not try
# an alternation per character
_BODY = r'[^"\\\x00-\x1f]*+(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*+)*+'
_STRING = f'"{_BODY}"'
_TEXT = f'"(?!"){_BODY}"'
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
# Tokens of valid JSON text: a string (a key when a colon follows), a number, anything else
# (punctuation, whitespace, true/false/null).  Digits and '-' occur only in numbers and strings.
_TOKEN = re.compile(f'(?P<s>{_STRING})(?P<colon>[ \\t\\r\\n]*:)?|(?P<n>{_NUMBER})|(?P<o>[^"0-9-]+)')
_CACHE: dict[str, re.Pattern[str]] = {}
_CACHE_MAX = 256
_RECENT: list[tuple[str, re.Pattern[str]]] = []  # (text key, frame), the latest first
_RECENT_MAX = 4


def known(data: str, keys: tuple[str, ...]) -> re.Pattern[str] | None:
    """A recently learned frame for a text key in `keys` that `data` matches in full."""
    for key, frame in _RECENT:
        if key in keys and frame.fullmatch(data):
            return frame
    return None


def learn(data: str, text_key: str) -> re.Pattern[str] | None:
    """The frame of `data` (a JSON text already parsed and found to be a plain token chunk whose
    text is under `text_key`), or None when `text_key` is not a key exactly once."""
    key = f'"{text_key}"'
    parts: list[str] = []
    slots = 0
    pos, end = 0, len(data)
    pending_text = False
    while pos < end:
        m = _TOKEN.match(data, pos)
        if m is None:
            return None
        pos = m.end()
        if m.group("s") is not None:
            if m.group("colon") is not None:
                pending_text = m.group("s") == key
                slots += pending_text
                parts.append(re.escape(m.group(0)))
                continue
            parts.append(_TEXT if pending_text else _STRING)
        elif m.group("n") is not None:
            parts.append(_NUMBER)
        else:
            parts.append(re.escape(m.group("o")))
            if not m.group("o").strip():
                continue  # whitespace between a key's colon and its value
        pending_text = False
    if slots != 1:
        return None
    pattern = "".join(parts)
    frame = _CACHE.get(pattern)
    if frame is None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        frame = _CACHE[pattern] = re.compile(pattern)
    entry = (text_key, frame)
    if entry in _RECENT:
        _RECENT.remove(entry)
    _RECENT.insert(0, entry)
    del _RECENT[_RECENT_MAX:]
    return frame
