"""Read a model directory's `config.json` into the numbers the tuner needs.

Memory estimates and the simulator depend on the model's *shapes* only (layers, heads, widths,
vocabulary), never on its weights, so a Hugging Face `config.json` is enough.  The parameter count
is computed from the shapes (a decoder-only transformer with gated MLP, as Llama, Qwen2 and
Mistral are) so that it agrees with the weights' byte size without reading them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import UsageError

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "int8": 1}
_REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "max_position_embeddings",
)


@dataclass(frozen=True)
class ModelInfo:
    """Architecture numbers of one model (tensor parallel 1)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_position_embeddings: int
    dtype_bytes: int
    tie_word_embeddings: bool
    qkv_bias: bool = False

    @property
    def params(self) -> int:
        """Parameter count from the shapes: embeddings, attention, gated MLP, norms, lm_head."""
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        attn = self.hidden * (q_out + 2 * kv_out) + q_out * self.hidden
        if self.qkv_bias:
            attn += q_out + 2 * kv_out
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attn + mlp + 2 * self.hidden
        embed = self.vocab * self.hidden
        lm_head = 0 if self.tie_word_embeddings else self.vocab * self.hidden
        return self.layers * per_layer + embed + lm_head + self.hidden

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


def load_model_info(model_dir: str | Path) -> ModelInfo:
    """Parse `<model_dir>/config.json`; a missing file or key is a `UsageError` naming it."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file (a model dir needs its config.json)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: cannot read JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{path}: expected a JSON object")
    for key in _REQUIRED:
        if not isinstance(cfg.get(key), int) or cfg[key] <= 0:
            raise UsageError(f"{path}: missing or non-positive integer key '{key}'")
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if dtype not in _DTYPE_BYTES:
        raise UsageError(f"{path}: unsupported torch_dtype '{dtype}'")
    return ModelInfo(
        name=Path(model_dir).resolve().name,
        layers=cfg["num_hidden_layers"],
        hidden=cfg["hidden_size"],
        intermediate=cfg["intermediate_size"],
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=cfg["vocab_size"],
        max_position_embeddings=cfg["max_position_embeddings"],
        dtype_bytes=_DTYPE_BYTES[dtype],
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
    )
