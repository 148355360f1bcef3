"""The card's memory high-water mark while a trial's cells run, sampled through NVML.

Why: an OOM is the only evidence the memory estimate is too low, unless the study also sees how
much a healthy run used.  The caching allocators of the servers tuner drives (PyTorch's for
vLLM, SGLang and transformers serve; InfiniCore's pool for InfiniLM) keep what a forward
reserved, so the device's used memory only grows while a server runs: its high-water mark per
cell, read by polling, is the cell's peak need (`tuner.trial.kv_calibration` turns it into the
estimate's forward scale without an OOM).  An allocator that hands memory back between polls
makes the mark read low; the OOMs still correct that case.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tuner.server.gpu import used_reader

POLL_S = 0.05


class MemoryWatch:
    """Polls `read_used()` in a thread; `mark()` is the highest reading so far."""

    def __init__(self, read_used: Callable[[], int | None], poll_s: float = POLL_S) -> None:
        self._read = read_used
        self._poll_s = poll_s
        self._high: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tuner-memwatch", daemon=True)

    def _sample(self) -> None:
        try:
            used = self._read()
        except Exception:  # noqa: BLE001 - a failed read is a missing sample, not a failed trial
            return
        if used is not None:
            with self._lock:
                self._high = used if self._high is None else max(self._high, used)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            self._sample()

    def mark(self) -> int | None:
        """The highest used bytes seen since the watch started (a fresh sample included)."""
        self._sample()
        with self._lock:
            return self._high

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


@contextmanager
def watching(gpu_index: int | None, baseline_bytes: int) -> Iterator[MemoryWatch | None]:
    """A running watch of GPU `gpu_index`'s used bytes over `baseline_bytes` (None without a
    GPU to read), stopped on every exit path."""
    if gpu_index is None:
        yield None
        return
    with used_reader(gpu_index) as read:
        watch = MemoryWatch(lambda: None if (used := read()) is None else used - baseline_bytes)
        watch.start()
        try:
            yield watch
        finally:
            watch.stop()
