"""Make a random-weight model dir of a real architecture, with a tokenizer that works offline.

Serving speed depends on shapes, not weight values, so random weights of the Llama-3.2-1B (or
Llama-3.1-8B) shape are a faithful stand-in where no weights can be downloaded.  The tokenizer is
a word-level one over `w0 w1 ...` (one word = one token), so a prompt's token count is exact, and
the config has no eos token, so every request generates exactly max_tokens.

    python benchmarks/h200/mkmodel.py OUT_DIR [--shape llama-3.2-1b|llama-3.2-3b|llama-3.1-8b|tiny] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SHAPES = {
    "tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192),
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         max_position_embeddings=131072, rope_theta=500000.0),
    "llama-3.2-3b": dict(vocab_size=128256, hidden_size=3072, intermediate_size=8192,
                         num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                         max_position_embeddings=131072, rope_theta=500000.0),
    "llama-3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         max_position_embeddings=131072, rope_theta=500000.0),
}
SPECIAL = ["<unk>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|> {% endif %}")


def make(out: Path, shape: str, device: str) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    dims = SHAPES[shape]
    out.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate(SPECIAL)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL), dims["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                   additional_special_tokens=SPECIAL[1:])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    cfg = LlamaConfig(**dims, tie_word_embeddings=shape != "llama-3.1-8b", bos_token_id=None,
                      eos_token_id=None, pad_token_id=None)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16 if device.startswith("cuda") else torch.float32)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(do_sample=False)
    model.save_pretrained(out)
    _flat_config(out / "config.json", dims, str(torch.get_default_dtype()).removeprefix("torch."))
    n = sum(p.numel() for p in model.parameters())
    (out / "tuner_model.json").write_text(json.dumps({"shape": shape, "params": n, "random_weights": True}))
    print(f"[mkmodel] {shape}: {n / 1e9:.2f} B params, random weights, saved to {out} in "
          f"{time.time() - t0:.1f} s", flush=True)


def _flat_config(path: Path, dims: dict, dtype: str) -> None:
    """transformers 5 nests rope_theta under rope_parameters; InfiniLM's C++ config reader wants
    it (and the dtype, head_dim and a null rope_scaling) at the top level."""
    cfg = json.loads(path.read_text())
    cfg.update({"rope_theta": dims.get("rope_theta", 10000.0), "rope_scaling": None,
                "torch_dtype": dtype, "dtype": dtype,
                "head_dim": dims["hidden_size"] // dims["num_attention_heads"]})
    path.write_text(json.dumps(cfg, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if (args.out / "config.json").exists():
        print(f"[mkmodel] {args.out} exists, kept", flush=True)
        return
    make(args.out, args.shape, args.device)


if __name__ == "__main__":
    main()
