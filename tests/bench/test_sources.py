"""Dataset, trace and shared-prefix sources: parsing, seeded sampling, and file:line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.bench.prompts import PromptMaker, render_prompt
from tuner.bench.sources import RequestSpec, SharedPrefixSource, parse_source
from tuner.errors import UsageError
from tuner.search.workload import parse_workload

WORDS = PromptMaker(None)


def sharegpt(path: Path, convs: list[list[str]]) -> Path:
    data = [{"id": str(i), "conversations": [
        {"from": "human" if k % 2 == 0 else "gpt", "value": v} for k, v in enumerate(c)]}
        for i, c in enumerate(convs)]
    path.write_text(json.dumps(data, indent=1))
    return path


def words(n: int) -> str:
    return " ".join(["w"] * n)


def test_sharegpt_lengths_filter_and_seeded_sampling(tmp_path):
    convs = [[words(10 + i), words(20 + i)] for i in range(6)]
    convs.append([words(2), words(50)])  # prompt under 4 tokens: skipped, as vLLM does
    convs.append([words(30)])            # no completion: skipped
    src = parse_source({"dataset": {"path": "d.json", "num_prompts": 4}},
                       sharegpt(tmp_path / "d.json", convs).parent, "w")
    a = src.requests(1, WORDS)
    assert a == src.requests(1, WORDS) and a != src.requests(2, WORDS)
    assert len(a) == 4 and len(set(a)) == 4
    assert all(s.output_len == s.input_len + 10 and s.input_len >= 10 for s in a)
    many = parse_source({"dataset": {"path": "d.json", "num_prompts": 15}}, tmp_path, "w")
    assert len(many.requests(0, WORDS)) == 15  # oversampled past the 6 usable entries


def test_jsonl_dataset_prompt_or_lengths(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"input_len": 7, "output_len": 3}\n\n{"prompt": "a b c d e"}\n')
    src = parse_source({"dataset": {"path": str(path), "output_len": 9}}, tmp_path, "w")
    specs = sorted(src.requests(0, WORDS), key=lambda s: s.input_len)
    assert specs == [RequestSpec(5, 9, text="a b c d e"), RequestSpec(7, 3)]


def test_trace_offsets_time_scale_and_hash_ids(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 1000, "input_length": 600, "output_length": 4, '
                    '"hash_ids": [7, 8]}\n{"timestamp": 1500, "input_len": 10, "output_len": 2}\n')
    src = parse_source({"trace": {"path": "t.jsonl", "time_scale": 2}}, tmp_path, "w")
    a, b = src.requests(0, WORDS)
    assert (a.arrival_s, b.arrival_s) == (0.0, 0.25)
    assert a.segments == (("h7", 512), ("h8", 88)) and b.segments == ()


def test_shared_prefix_turns_reuse_history():
    src = SharedPrefixSource(groups=2, prefix_len=100, suffix_len=10, turns=2, output_len=5,
                             conversations=3)
    specs = src.requests(0, WORDS)
    assert len(specs) == 12
    first, second = specs[0], specs[6]  # conversation 0 of group 0, turns 0 and 1
    assert first.input_len == 110 and second.input_len == 125
    assert second.segments[: len(first.segments)] == first.segments
    shared: dict = {}
    import random
    t1, t2 = (render_prompt(s, WORDS, random.Random(0), shared) for s in (first, second))
    assert t2.startswith(t1) and len(t2.split()) == 125


@pytest.mark.parametrize("name, text, line, needle", [
    ("t.jsonl", '{"timestamp": 5, "input_length": 3, "output_length": 2}\n{"timestamp": 4, '
     '"input_length": 3, "output_length": 2}\n', 2, "earlier"),
    ("t.jsonl", '{"timestamp": 5, "input_length": 3, "output_length": 2}\n\n{oops\n', 3,
     "not JSON"),
    ("t.jsonl", '{"timestamp": 5, "input_length": 3}\n', 1, "output_length"),
    ("d.jsonl", '{"input_len": 3, "output_len": 2}\n{"input_len": -1, "output_len": 2}\n', 2,
     "input_len"),
    ("d.json", '[\n {"conversations": [{"from": "human", "value": "a b c d"}]},\n {"x": 1}\n]', 3,
     "conversations"),
    ("d.json", '[\n {"conversations": []},\n {"conversations": [}\n]', 3, "not JSON"),
])
def test_malformed_line_is_named(tmp_path, name, text, line, needle):
    path = tmp_path / name
    path.write_text(text)
    kind = "trace" if name.startswith("t") else "dataset"
    with pytest.raises(UsageError) as exc:
        parse_source({kind: {"path": str(path), "num_prompts": 1}}, tmp_path, "w")
    msg = str(exc.value)
    assert msg.startswith(f"{path}:{line}: ") and needle in msg and "\n" not in msg


def test_source_cell_in_a_workload(tmp_path):
    (tmp_path / "r.jsonl").write_text('{"input_len": 7, "output_len": 3}\n'
                                      '{"input_len": 70, "output_len": 30}\n')
    w = parse_workload({"cells": [{"source": {"dataset": {"path": "r.jsonl"}}, "concurrency": 4,
                                   "request_rate": 2}]}, str(tmp_path / "w.yaml"))
    [cell] = w.cells
    assert (cell.input_len, cell.output_len, cell.num_prompts) == (70, 30, 2)
    assert cell.key == "dataset_c4_r2"
    with pytest.raises(UsageError, match=r"cells\[0\]\.input_len: set by the source"):
        parse_workload({"cells": [{"source": {"dataset": {"path": "r.jsonl"}}, "concurrency": 1,
                                   "input_len": 3}]}, str(tmp_path / "w.yaml"))
    with pytest.raises(UsageError, match=r"source.shared_prefix.turn: unknown key"):
        parse_workload({"cells": [{"source": {"shared_prefix": {"turn": 1}}, "concurrency": 1}]},
                       str(tmp_path / "w.yaml"))


def test_dataset_lengths_are_token_exact_with_a_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=280, special_tokens=["<unk>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    maker = PromptMaker(tmp_path)
    convs = [["the quick brown fox jumps zyxw", "over the lazy dog and the fox"]]
    src = parse_source({"dataset": {"path": "d.json"}}, sharegpt(tmp_path / "d.json", convs).parent,
                       "w")
    [spec] = src.requests(0, maker)
    ids = tok.encode(convs[0][0], add_special_tokens=False).ids
    out = tok.encode(convs[0][1], add_special_tokens=False).ids
    assert (spec.input_len, spec.output_len) == (len(ids), len(out))
    assert spec.input_len != len(convs[0][0].split())  # not the word count
