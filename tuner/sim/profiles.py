"""GPU profiles: public spec numbers plus the efficiency factors and quirks the simulator uses.

Spec numbers are the vendors' public figures: memory as `nvidia-smi` reports it (MiB), HBM/GDDR
bandwidth, dense bf16 tensor TFLOPs (no sparsity).  The efficiency factors and overheads were
calibrated on the RTX 4090 against the seed report (see `benchmarks/sim_calibration.py`) and are
reused for the other cards: they describe how well InfiniLM's kernels use a GPU, which is a
property of the software more than of the card.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tuner.errors import UsageError

MIB = 1 << 20


@dataclass(frozen=True)
class GpuProfile:
    """One GPU model as the simulator sees it.

    `compile_failures` maps a block size to the start-up error InfiniLM raised for it on this
    card (the seed's RTX 4090 could not compile paged attention with graphs at block size 128).
    """

    name: str
    memory_mib: int
    hbm_gbps: float
    bf16_tflops: float
    bw_efficiency: float = 0.93
    compute_efficiency: float = 0.85
    graph_step_overhead_s: float = 0.0003
    eager_step_overhead_s: float = 0.003
    prefill_overhead_s: float = 0.006
    compile_failures: dict[int, str] = field(default_factory=dict)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


_4090_BS128 = (
    "paged attention kernel compilation failed for block_size=128 with graphs enabled "
    "(seen by the seed on RTX 4090, InfiniLM 7c1efb5)"
)

PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in (
        GpuProfile("rtx4090", 24564, 1008.0, 165.2, compile_failures={128: _4090_BS128}),
        GpuProfile("rtx3090", 24576, 936.0, 71.0),
        GpuProfile("l40s", 46068, 864.0, 362.0),
        GpuProfile("a100-40g", 40960, 1555.0, 312.0),
        GpuProfile("a100-80g", 81920, 2039.0, 312.0),
        GpuProfile("h100-80g", 81559, 3350.0, 989.0),
        GpuProfile("h200", 143771, 4800.0, 989.0),
    )
}


CAP_ENV = "TUNER_GPU_MEMORY_CAP_GIB"   # tuner.ballast.cap_env: the card the tuner tunes for


def get_profile(name: str, env: Mapping[str, str] | None = None) -> GpuProfile:
    """The profile called `name`, in any case (`RTX4090` as printed on the card); an unknown
    name is a `UsageError` listing the known ones.

    With `--gpu-memory-cap` the tuner tells the server the card it tunes for (`CAP_ENV` in `env`);
    a real server under the ballast sees only that much memory, so the simulated card has it
    too (ignoring it, the simulator called InfiniLM's default 512 x 256 pool of an 8B model fine
    under a 24 GiB cap where the real server ran out of memory at start-up)."""
    try:
        profile = PROFILES[name.lower()]
    except KeyError:
        raise UsageError(f"unknown GPU profile '{name}' (known: {', '.join(PROFILES)})") from None
    raw = (env or {}).get(CAP_ENV)
    if raw is None:
        return profile
    try:
        cap_mib = int(float(raw) * 1024)
    except ValueError:
        raise UsageError(f"{CAP_ENV}={raw!r} is not a number of GiB") from None
    if cap_mib <= 0:
        raise UsageError(f"{CAP_ENV}={raw!r} must be > 0")
    return replace(profile, memory_mib=min(profile.memory_mib, cap_mib))
