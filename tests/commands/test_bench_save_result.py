"""`tuner bench --save-result` against the simulated server run as a real process on loopback."""

from __future__ import annotations

import json
import random

import pytest

from tests.commands.test_bench import parse
from tests.sim.test_server import free_port, start, stop, wait_health
from tuner.commands import bench

SIM = ["--gpu", "rtx4090", "--host", "127.0.0.1", "--num-blocks", "64", "--block-size", "256",
       "--time-scale", "50"]


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory):
    port = free_port()
    proc = start([*SIM, "--port", str(port)], tmp_path_factory.mktemp("sim") / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, proc, timeout=30)
        yield url
    finally:
        stop(proc)


def _bench(url, *extra):
    return bench.run(parse(["--url", url, "--concurrency", "2", "--input-len", "64",
                            "--output-len", "8", "--num-prompts", "4", "--no-progress", *extra]))


def test_save_result_is_vllm_shaped_and_lengths_are_warned(sim_url, tmp_path, capsys):
    path = tmp_path / "vllm.json"
    assert _bench(sim_url, "--model", "m", "--save-result", str(path)) == 0
    err = capsys.readouterr().err
    doc = json.loads(path.read_text())            # one cell: a plain JSON document, like vllm's
    assert doc["backend"] == "openai-chat" and doc["model_id"] == "m"
    assert doc["tokenizer_id"] is None and doc["max_concurrency"] == 2
    assert doc["num_prompts"] == 4 and doc["completed"] == 4 and doc["request_rate"] == "inf"
    assert len(doc["input_lens"]) == len(doc["ttfts"]) == len(doc["itls"]) == 4
    assert doc["output_lens"] == [8] * 4 and all(len(i) == 7 for i in doc["itls"])
    assert all(text.strip() for text in doc["generated_texts"]) and doc["errors"] == [""] * 4
    assert all(0 < t < doc["duration"] for t in doc["ttfts"])
    assert doc["duration_clock"].startswith("simulated")
    assert "duration_s" not in doc
    asked, seen = 64, doc["input_lens"][0]
    line = [x for x in err.splitlines() if x.startswith("warning: prompt lengths")]
    assert len(line) == 1 and f"{seen} prompt tokens per request where {asked} were asked " \
        f"({(seen - asked) / asked:+.1%}" in line[0]


def test_tokenizer_in_the_model_folder_makes_lengths_exact(sim_url, tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "zeta"]
    corpus = [" ".join(rng.choices(words, k=30)) for _ in range(50)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=200,
                                                        special_tokens=["<unk>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    path = tmp_path / "r.json"
    assert _bench(sim_url, "--model", str(tmp_path), "--save-result", str(path)) == 0
    assert "prompt lengths are approximate" not in capsys.readouterr().err
    assert json.loads(path.read_text())["tokenizer_id"] == str(tmp_path)


def test_without_save_result_the_json_rows_keep_their_shape(sim_url, tmp_path):
    out = tmp_path / "rows.json"
    assert _bench(sim_url, "--model", "m", "-o", str(out)) == 0
    [row] = json.loads(out.read_text())
    assert row["completed"] == 4 and "duration_s" not in row
    assert row["duration_clock"].startswith("simulated") and row["duration"] > 0


def test_save_result_without_a_file_takes_vllms_file_name(sim_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _bench(sim_url, "--model", "org/m", "--save-result") == 0
    [path] = list(tmp_path.glob("*.json"))
    assert path.name.startswith("openai-chat-infqps-concurrency2-m-")
    assert json.loads(path.read_text())["model_id"] == "org/m"
