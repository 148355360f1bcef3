"""Exact-length prompts, with and without a tokenizer in the model dir."""

import random

import pytest

from tuner.bench.prompts import PromptMaker


def test_fallback_is_one_word_per_token_and_deterministic():
    maker = PromptMaker(None)
    a = maker.make(50, random.Random(1))
    assert not maker.exact and len(a.split()) == 50 and maker.count(a) == 50
    assert a == PromptMaker(None).make(50, random.Random(1))
    assert a != maker.make(50, random.Random(2))


def test_model_dir_without_tokenizer_json_falls_back(tmp_path):
    assert not PromptMaker(tmp_path).exact


def test_tokenizer_json_gives_exact_token_counts(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.decoder = tokenizers.decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog " * 3, "pack my box with five dozen liquor jugs"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    maker = PromptMaker(tmp_path)
    assert maker.exact
    for n in (1, 17, 256):
        text = maker.make(n, random.Random(n))
        assert maker.count(text) == n
