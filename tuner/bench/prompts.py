"""Prompts of an exact token length.

With a tokenizer (tokenizer.json in the model dir, read by the optional `tokenizers` package) a
prompt is random token ids decoded to text and re-encoded until the count is exact, as vllm's
random dataset does: random ids defeat prefix caching and give realistic token lengths.
Without one, a prompt is whitespace-separated words, one token per word: the simulator counts
words, and a real server's own count comes back in `usage` anyway.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.bench.sources import RequestSpec

# Short, common words: most BPE vocabularies hold each as a single token (with its leading space).
_WORDS = (
    "the of and to in is was for on are with as by at from this have not but had his they "
    "she one all were her there been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first "
    "any my now such like our over man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people "
    "how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old year "
    "off come since against go came right used take three"
).split()

_MAX_FIX_ROUNDS = 10


class PromptMaker:
    """Deterministic given the rng passed to `make`: same seed, same prompts."""

    def __init__(self, tokenizer_dir: str | Path | None = None) -> None:
        self.tokenizer = _load_tokenizer(tokenizer_dir) if tokenizer_dir else None
        if self.tokenizer is not None:
            special = {
                tid for tid, tok in self.tokenizer.get_added_tokens_decoder().items() if tok.special
            }
            size = self.tokenizer.get_vocab_size(with_added_tokens=False)
            self._ids = [i for i in range(size) if i not in special]

    @property
    def exact(self) -> bool:
        """True when lengths are counted by the model's own tokenizer."""
        return self.tokenizer is not None

    def make(self, input_len: int, rng: random.Random) -> str:
        if input_len <= 0:
            return ""
        if self.tokenizer is None:
            return " ".join(rng.choices(_WORDS, k=input_len))
        return self._from_tokens(input_len, rng)

    def count(self, text: str) -> int:
        if self.tokenizer is None:
            return len(text.split())
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def _from_tokens(self, input_len: int, rng: random.Random) -> str:
        """Decode random ids, re-encode, then trim or extend: decode/encode is not a bijection,
        so a few rounds are needed to land on the exact count."""
        tok = self.tokenizer
        assert tok is not None
        ids = rng.choices(self._ids, k=input_len)
        text = tok.decode(ids, skip_special_tokens=True)
        for _ in range(_MAX_FIX_ROUNDS):
            ids = tok.encode(text, add_special_tokens=False).ids
            if len(ids) == input_len:
                return text
            if len(ids) > input_len:
                ids = ids[:input_len]
            else:
                ids = ids + rng.choices(self._ids, k=input_len - len(ids))
            assert tok is not None
            text = tok.decode(ids, skip_special_tokens=True)
        return text  # within a token or two: the server's usage count is what gets reported


def _load_tokenizer(tokenizer_dir: str | Path):
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    return Tokenizer.from_file(str(path))


def render_prompt(spec: RequestSpec, maker: PromptMaker, rng: random.Random,
                  shared: dict[tuple[str, int], str]) -> str:
    """The prompt text of one request: the dataset's own text, else each shared segment's text
    (the same for the same key, from an rng seeded by the key, kept in `shared`) followed by
    fresh random text for the rest of `input_len`."""
    if spec.text is not None:
        return spec.text
    parts = []
    for key, n in spec.segments:
        if (key, n) not in shared:
            shared[(key, n)] = maker.make(n, random.Random(key))
        parts.append(shared[(key, n)])
    rest = spec.input_len - sum(n for _, n in spec.segments)
    if rest > 0:
        parts.append(maker.make(rest, rng))
    return " ".join(parts)
