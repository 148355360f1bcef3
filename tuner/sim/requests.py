"""One request as the simulated engine tracks it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class SimRequest:
    """One request inside the engine; `token_times` are simulated seconds."""

    rid: int
    arrival: float
    prompt_len: int
    max_tokens: int
    blocks: int = 0
    token_times: list[float] = field(default_factory=list)
    finished: bool = False
    error: str | None = None
    deferred_logged: bool = False
    hashes: tuple[int, ...] = ()   # chained hashes of the full blocks of prompt + answer
    held: list[int] = field(default_factory=list)  # cache blocks this request references
    cached_tokens: int = 0

    @property
    def generated(self) -> int:
        return len(self.token_times)

    @property
    def context(self) -> int:
        return self.prompt_len + self.generated

    @property
    def remaining(self) -> int:
        return self.max_tokens - self.generated
