"""Block-level prefix caching, as upstream InfiniLM does it (on unless `--disable-prefix-caching`).

Facts from InfiniTensor/InfiniLM `python/infinilm/llm/cache_manager.py` (`BlockManager`):

* only full blocks are reused; a block's hash chains the previous block's hash with its tokens,
  so a block matches only when everything before it matches too;
* a new request walks its prompt's blocks and reuses cached ones until the first miss; when every
  prompt token would be cached, the last block is computed again (the step needs one token to
  prefill); the prefill then computes only the uncached tokens;
* a finished request's blocks are not freed: their reference count drops to zero and they stay
  findable until a new allocation needs the space (`try_free_blocks`);
* hashes are registered after the prefill step, so requests prefilled in the same step do not
  share with each other.

* blocks filled during decode are hashed too (`append_slot`), so a multi-turn follow-up whose
  history holds the answer reuses the answer's blocks as well.

Differences, on purpose: eviction here is least-recently-used (upstream frees zero-reference
blocks in its set's iteration order), and an answer's blocks are published when the request
finishes rather than as each fills (the same for a follow-up, which is sent after the answer).
Prefill time is charged for the computed tokens only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


def segment_block_hashes(segments: Sequence[tuple[str, int]], block_size: int) -> list[int]:
    """Chained hashes of the full blocks covered by `segments` ((key, tokens) of shared content:
    equal keys mean equal tokens)."""
    out: list[int] = []
    prev = -1
    piece: list[tuple[str, int, int]] = []
    filled = 0
    for key, n in segments:
        start = 0
        while start < n:
            take = min(n - start, block_size - filled)
            piece.append((key, start, start + take))
            start += take
            filled += take
            if filled == block_size:
                prev = hash((prev, tuple(piece)))
                out.append(prev)
                piece, filled = [], 0
    return out


def token_block_hashes(tokens: Sequence[str], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of a token (here: word) sequence."""
    out: list[int] = []
    prev = -1
    for i in range(0, len(tokens) - block_size + 1, block_size):
        prev = hash((prev, tuple(tokens[i:i + block_size])))
        out.append(prev)
    return out


class PrefixCache:
    """Hash -> reference count of one physical block each; zero-reference blocks are evictable."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.refs: dict[int, int] = {}
        self.idle: OrderedDict[int, None] = OrderedDict()  # ref 0, oldest first
        self.hit_tokens = 0
        self.prompt_tokens = 0

    def hits(self, hashes: Sequence[int], prompt_len: int, block_size: int) -> int:
        """Leading blocks of the prompt found in the cache."""
        if not self.enabled:
            return 0
        n = 0
        for h in hashes:
            if h not in self.refs:
                break
            n += 1
        if n * block_size >= prompt_len:
            n = max(0, (prompt_len - 1) // block_size)
        return n

    def evictable(self, keep: Iterable[int] = ()) -> int:
        """Blocks that could be freed now, not counting those in `keep` (about to be reused)."""
        return len(self.idle) - sum(1 for h in keep if h in self.idle)

    def evict(self, n: int) -> int:
        """Free the `n` least recently used idle blocks; returns how many were freed."""
        done = 0
        while done < n and self.idle:
            h, _ = self.idle.popitem(last=False)
            del self.refs[h]
            done += 1
        return done

    def acquire(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            self.refs[h] += 1
            self.idle.pop(h, None)

    def register(self, hashes: Iterable[int]) -> list[int]:
        """Publish freshly computed blocks; returns those taken in (a hash already present was
        computed twice: that copy stays private to its request)."""
        taken = []
        for h in hashes:
            if h not in self.refs:
                self.refs[h] = 1
                taken.append(h)
        return taken

    def release(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            self.refs[h] -= 1
            if self.refs[h] == 0:
                self.idle[h] = None

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
