"""The failures InfiniLM shows before it serves: a graph compile quirk, a bad token budget, a KV
pool that does not fit."""

from __future__ import annotations

from tuner.search.model import ModelInfo
from tuner.sim.config import SimConfig
from tuner.sim.memory import MemoryModel
from tuner.sim.profiles import GpuProfile


class StartupFailure(Exception):
    """The server cannot start; `log_lines` are what InfiniLM prints, exit status 3."""

    def __init__(self, reason: str, log_lines: list[str]) -> None:
        super().__init__(reason)
        self.log_lines = log_lines


def check_startup(model: ModelInfo, gpu: GpuProfile, cfg: SimConfig, memory: MemoryModel) -> None:
    """Raise `StartupFailure` for the failures InfiniLM shows before serving."""
    quirk = gpu.compile_failures.get(cfg.block_size)
    if quirk and cfg.enable_graph:
        raise StartupFailure(quirk, [
            f"RuntimeError: {quirk}",
            "RankWorker failed to initialize",
            "Application startup failed. Exiting.",
        ])
    budget = cfg.knobs.max_num_batched_tokens
    if budget is not None and not 1024 <= budget <= model.max_position_embeddings:
        msg = (f"AssertionError: INFINILM_MAX_NUM_BATCHED_TOKENS={budget} must be in "
               f"[1024, {model.max_position_embeddings}] with paged attention")
        raise StartupFailure(msg, [msg, "Application startup failed. Exiting."])
    if not memory.fits_at_startup():
        mib = memory.pool_bytes >> 20
        raise StartupFailure("KV cache does not fit", [
            f"Error Code 2 in cudaMalloc: out of memory allocating KV cache ({mib} MiB)",
            "RankWorker failed to initialize",
            "Application startup failed. Exiting.",
        ])
