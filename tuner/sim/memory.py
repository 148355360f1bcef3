"""GPU memory of a simulated InfiniLM server: what is allocated at start-up and at each forward.

ONE mechanism decides every pass/fail of the seed (no lookup of cases):

    peak(forward) = weights + runtime + KV pool                        (static, allocated at start)
                  + ACT_BYTES_PER_TOKEN(model) x tokens in this forward  (transient activations)
                  + RESIDENT_KV_FRACTION x kv_bytes_per_token x sum(context of live sequences)

and the forward fails (`cudaMalloc failed`) when `peak > card memory`.

* Transient activations per token of a forward: the full-vocabulary logits in fp32
  (`vocab x 4` bytes; InfiniLM computes logits for every prefill token), three MLP-intermediate
  sized bf16 tensors (gate, up, their product) and twelve hidden-sized bf16 tensors (q/k/v,
  attention output, norms, residuals).  For Llama-3.1-8B that is 0.665 MiB per token: a 4096-word
  chat prompt (4132 tokens with the template) needs 2748 MiB, which fits beside 64 x 256 blocks
  (3001 MiB free on a 4090) but not 80 (2489 MiB) or 96 (1977 MiB) -- the seed's observations --
  and a 16 x 256-word batched prefill (4672 tokens, 3107 MiB) overflows 64 blocks too.
* Live-sequence residency: a sequence that is decoding keeps buffers in the caching allocator
  that grow with its context -- modelled as if the attention gathered its paged K/V into a
  contiguous copy that the allocator keeps between steps (RESIDENT_KV_FRACTION x its KV bytes;
  a fitted assumption, not a measurement).  That is why a 4K prefill *next to* one running
  4K-context decode overflows 64 blocks (2748 + 517 > 3001 MiB) while the same prefill alone
  fits (the seed's guard-without-decode-first failure), and why decode-first fixes it.  Under
  the seed's final config the worst short-input forward still keeps ~1.1 GiB of headroom.
* Runtime overhead (CUDA context, cuBLAS/flash-attn workspaces, InfiniLM's start-up buffers,
  the graph pool when graphs are on) is the seed's idle reading minus weights and KV pool:
  22587 MiB at 96 x 256 blocks of Llama-3.1-8B = 15317 (weights) + 3072 (KV) + 4198.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.search.model import ModelInfo
from tuner.sim.profiles import MIB, GpuProfile

RUNTIME_BASE_MIB = 3686
GRAPH_POOL_MIB = 512
MLP_TENSORS_PER_TOKEN = 3
HIDDEN_TENSORS_PER_TOKEN = 12
LOGITS_BYTES = 4
RESIDENT_KV_FRACTION = 1.0


@dataclass(frozen=True)
class MemoryModel:
    """Per-GPU memory arithmetic for one model, card and KV pool (tensor parallel `tp`)."""

    model: ModelInfo
    gpu: GpuProfile
    num_blocks: int
    block_size: int
    enable_graph: bool
    tp: int = 1

    @property
    def capacity_bytes(self) -> int:
        return self.gpu.memory_bytes

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_bytes // self.tp

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token // self.tp

    @property
    def runtime_bytes(self) -> int:
        return (RUNTIME_BASE_MIB + (GRAPH_POOL_MIB if self.enable_graph else 0)) * MIB

    @property
    def pool_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.kv_bytes_per_token

    @property
    def idle_bytes(self) -> int:
        """What `nvidia-smi` shows once the server is up and idle."""
        return self.weight_bytes + self.runtime_bytes + self.pool_bytes

    @property
    def act_bytes_per_token(self) -> int:
        m = self.model
        return (
            m.vocab * LOGITS_BYTES
            + (MLP_TENSORS_PER_TOKEN * m.intermediate // self.tp
               + HIDDEN_TENSORS_PER_TOKEN * m.hidden) * m.dtype_bytes
        )

    @property
    def resident_bytes_per_context_token(self) -> float:
        return RESIDENT_KV_FRACTION * self.kv_bytes_per_token

    def fits_at_startup(self) -> bool:
        return self.idle_bytes <= self.capacity_bytes

    def forward_peak(self, forward_tokens: int, live_context_tokens: int) -> int:
        """Peak bytes of a forward over `forward_tokens` tokens while live sequences (those
        already decoding) hold `live_context_tokens` tokens of context in total."""
        return int(
            self.idle_bytes
            + self.act_bytes_per_token * forward_tokens
            + self.resident_bytes_per_context_token * live_context_tokens
        )
