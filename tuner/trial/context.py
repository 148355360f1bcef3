"""What every trial of a study shares, and the one way a config becomes a server command line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.bench.records import Cell
from tuner.search.space import SearchSpace
from tuner.search.workload import Workload

HOST = "127.0.0.1"


@dataclass(frozen=True)
class TrialContext:
    """Everything about a study that does not change from trial to trial."""

    space: SearchSpace
    workload: Workload
    model_dir: str
    simulate: str | None = None          # GPU profile name when running the simulator
    time_scale: float = 1.0              # simulated seconds per wall second (simulator only)
    stall_timeout_s: float = 60.0        # no token on any stream for this long = hang (server time)
    startup_timeout_s: float | None = None
    model_name: str | None = None
    gpu_index: int | None = None         # NVML index of the real GPU to check between trials
    gpu_baseline_bytes: int = 0          # its memory use when idle
    gpu_known_pids: tuple[int, ...] = () # processes of the tuner's own on it (a memory-cap ballast)
    gpu_wait_s: float = 300.0
    extra_env: dict[str, str] = field(default_factory=dict)  # added to every server's environment

    @property
    def scale(self) -> float:
        """Simulated seconds per wall second: the time scale with --simulate, else 1."""
        return self.time_scale if self.simulate else 1.0

    def render(
        self,
        params: dict[str, Any],
        *,
        port: int = 0,
        cells: Sequence[Cell] | None = None,
        simulate: str | None = None,
        in_process: bool = False,
    ) -> tuple[list[str], dict[str, str]]:
        """The argv and environment a server gets for `params` on this study's workload.

        `simulate` overrides the study's simulator profile (the in-process runner); an
        in-process or never-launched config renders with time scale 1 and port 0.
        """
        cells = self.workload.cells if cells is None else cells
        profile = simulate if simulate is not None else self.simulate
        scale = 1.0 if in_process else self.scale
        argv, env = self.space.render(
            params, model=self.model_dir, host=HOST, port=port,
            max_output_len=max(c.output_len for c in cells), simulate=profile,
            extra_placeholders={"time_scale": f"{scale:g}"})
        return argv, {**self.extra_env, **env}
