"""Step times from a roofline of the GPU profile and the model.

A forward reads every weight once and the KV it attends over, and does 2 x params FLOPs per token
plus attention.  Small forwards (decode) are bound by the bytes, large prefills by the FLOPs; the
transition is modelled additively (bytes time + FLOPs time + fixed overhead), which matches the
seed's RTX 4090 figures at both ends: single-stream TPOT 17.5-18.3 ms (16.06 GB of bf16 weights
at 1008 GB/s x 0.93) and TTFT 32 / 59 / 530 ms at 32 / 256 / 4096 words (165 TFLOPs x 0.85).
Graphs remove most per-step launch overhead (0.3 ms instead of 3 ms).  With tensor parallel
`tp`, bytes and FLOPs split evenly over the GPUs; the all-reduce traffic is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tuner.search.model import ModelInfo
from tuner.sim.profiles import GpuProfile


@dataclass(frozen=True)
class StepTimer:
    """Seconds per prefill or decode step for one model on one card (tensor parallel `tp`)."""

    model: ModelInfo
    gpu: GpuProfile
    enable_graph: bool
    tp: int = 1

    @property
    def _bytes_per_s(self) -> float:
        return self.gpu.hbm_gbps * 1e9 * self.gpu.bw_efficiency

    @property
    def _flops_per_s(self) -> float:
        return self.gpu.bf16_tflops * 1e12 * self.gpu.compute_efficiency

    @property
    def _weight_bytes(self) -> float:
        return self.model.weight_bytes / self.tp

    @property
    def _flops_per_token(self) -> float:
        return 2.0 * self.model.params / self.tp

    @property
    def _attn_flops_per_qk(self) -> float:
        """FLOPs of one query attending to one key across all layers (QK^T and PV)."""
        m = self.model
        return 4.0 * m.heads * m.head_dim * m.layers / self.tp

    @property
    def _step_overhead(self) -> float:
        return (
            self.gpu.graph_step_overhead_s if self.enable_graph else self.gpu.eager_step_overhead_s
        )

    def prefill(self, prompt_lens: list[int]) -> float:
        """One batched prefill of these prompts (causal attention: L^2 / 2 pairs each)."""
        tokens = sum(prompt_lens)
        kv_write = tokens * self.model.kv_bytes_per_token / self.tp
        attn_pairs = sum(n * n / 2.0 for n in prompt_lens)
        flops = tokens * self._flops_per_token + attn_pairs * self._attn_flops_per_qk
        return (
            (self._weight_bytes + kv_write) / self._bytes_per_s
            + flops / self._flops_per_s
            + self.gpu.prefill_overhead_s
        )

    def decode_params(self, batch: int) -> tuple[float, float]:
        """(seconds independent of context, seconds per token of total context) of a decode step.

        Linear in the batch's total context, so a run of identical decode steps has closed-form
        times (the engine advances them in bulk).
        """
        fixed = (
            self._weight_bytes / self._bytes_per_s
            + batch * self._flops_per_token / self._flops_per_s
            + self._step_overhead
        )
        per_ctx = (self.model.kv_bytes_per_token / self.tp) / self._bytes_per_s + (
            self._attn_flops_per_qk / self._flops_per_s
        )
        return fixed, per_ctx

    def decode(self, batch: int, total_context: int) -> float:
        fixed, per_ctx = self.decode_params(batch)
        return fixed + per_ctx * total_context

    def decode_run(self, batch: int, total_context: int, steps: int) -> np.ndarray:
        """Durations of `steps` consecutive decode steps of the same batch (context grows by
        `batch` tokens per step)."""
        fixed, per_ctx = self.decode_params(batch)
        return fixed + per_ctx * (total_context + batch * np.arange(steps, dtype=float))
