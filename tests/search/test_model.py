"""ModelInfo: parameter counts from shapes agree with the models' published sizes."""

import json
from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.search.model import load_model_info

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.mark.parametrize("name, billions", [
    ("llama-3.1-8b", 8.03), ("llama-3.2-1b", 1.24), ("llama-3.2-3b", 3.21),
    ("qwen2.5-7b", 7.62), ("mistral-7b", 7.25), ("llama-3.1-70b", 70.55),
])
def test_param_counts_match_published_sizes(name, billions):
    assert load_model_info(MODELS / name).params / 1e9 == pytest.approx(billions, abs=0.01)


def test_llama_8b_memory_figures():
    info = load_model_info(MODELS / "llama-3.1-8b")
    assert info.kv_bytes_per_token == 128 * 1024  # 2 x 32 layers x 8 kv heads x 128 x 2 B
    assert info.weight_bytes == info.params * 2
    assert (info.head_dim, info.kv_heads, info.tie_word_embeddings) == (128, 8, False)


def test_head_dim_defaults_to_hidden_over_heads():
    info = load_model_info(MODELS / "qwen2.5-7b")
    assert info.head_dim == 3584 // 28 and info.kv_heads == 4


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(UsageError, match="config.json"):
        load_model_info(tmp_path)


def test_missing_key_names_file_and_key(tmp_path):
    cfg = json.loads((MODELS / "llama-3.1-8b" / "config.json").read_text())
    del cfg["vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match=r"config\.json.*'vocab_size'"):
        load_model_info(tmp_path)


def test_bad_json_is_a_usage_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match="config.json"):
        load_model_info(tmp_path)
