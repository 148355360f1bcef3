"""--save-result documents (vllm bench serve's fields), the length warning, the text hook."""

from __future__ import annotations

import json

from tuner.bench.lengths import length_warning, tokenizer_dir
from tuner.bench.records import Cell, CellResult, RequestRecord, duration_clock
from tuner.bench.texts import TextCollector
from tuner.bench.vllm_result import RunInfo, default_path, result_doc, write

# vllm/benchmarks/serve.py (v0.31): the setup, aggregate and per-request keys of a result file
VLLM_KEYS = {"date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate",
             "burstiness", "max_concurrency", "duration", "completed", "failed",
             "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
             "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts",
             "itls", "generated_texts", "errors",
             *(f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99")
               for m in ("ttft", "tpot", "itl", "e2el"))}


def _cell_result(sim: bool = False) -> CellResult:
    from tuner.bench.metrics import cell_metrics
    ok = RequestRecord(send_time=1.0, token_times=[1.1, 1.15, 1.25], prompt_tokens=40,
                       completion_tokens=3, sim=sim)
    ok2 = RequestRecord(send_time=1.0, token_times=[1.2, 1.3, 1.4], prompt_tokens=36,
                        completion_tokens=3, sim=sim)
    bad = RequestRecord(send_time=1.0, error="HTTP 500: boom", error_class="http_error")
    records = [ok, ok2, bad]
    cell = Cell(2, 32, 3, num_prompts=3)
    return CellResult(cell, records, 0.4, cell_metrics(records, 0.4), "partial", "1 of 3 failed")


def test_result_doc_has_vllm_fields_and_units():
    result = _cell_result()
    doc = result_doc(result, RunInfo("chat", "meta/llama", "/models/x", date="20260101-000000"),
                     {id(result.records[0]): "hi there"})
    assert VLLM_KEYS <= set(doc)
    assert doc["backend"] == "openai-chat" and doc["request_rate"] == "inf"
    assert doc["max_concurrency"] == 2 and doc["num_prompts"] == 3
    assert doc["input_lens"] == [40, 36, 32] and doc["output_lens"] == [3, 3, 0]
    assert [round(x, 9) for x in doc["ttfts"]] == [0.1, 0.2, 0.0]  # seconds, as vllm
    assert [round(x, 6) for x in doc["itls"][0]] == [0.05, 0.1] and doc["itls"][2] == []
    assert doc["generated_texts"] == ["hi there", "", ""]
    assert doc["errors"] == ["", "", "HTTP 500: boom"]
    assert doc["completed"] == 2 and doc["failed"] == 1 and doc["request_goodput"] is None
    assert abs(doc["mean_ttft_ms"] - 150) < 1e-9
    assert doc["duration_clock"] == "wall clock"
    json.dumps(doc, allow_nan=False)


def test_duration_clock_labels_simulated_and_rescaled_time():
    assert duration_clock(_cell_result(sim=True).records, 25.0).startswith("simulated")
    assert duration_clock(_cell_result().records, 25.0) == ("wall clock x 25 (the simulator's "
                                                            "time scale)")
    row = _cell_result().to_dict()
    assert "duration_s" not in row and "duration_limit_s" not in row and row["duration"] == 0.4


def test_one_cell_is_a_json_document_several_are_json_lines(tmp_path):
    info = RunInfo("completions", "org/m", None, date="20260101-000000")
    one = write(tmp_path / "a.json", [result_doc(_cell_result(), info)])
    assert json.loads(one.read_text())["backend"] == "openai"
    two = write(tmp_path / "b.json", [result_doc(_cell_result(), info)] * 2)
    assert [json.loads(line)["completed"] for line in two.read_text().splitlines()] == [2, 2]
    assert str(default_path(info, [_cell_result()])) == (
        "openai-infqps-concurrency2-m-20260101-000000.json")


def test_length_warning_says_by_how_much():
    text = length_warning([_cell_result()], "chat")
    assert text.startswith("warning: prompt lengths are approximate")
    assert "38 prompt tokens per request where 32 were asked (+18.8%, chat template included)" \
        in text
    empty = CellResult(Cell(1, 8, 2), [], 0.1, {})
    assert "reported no prompt token counts" in length_warning([empty], "chat")


def test_tokenizer_defaults_to_the_model_folder(tmp_path):
    assert tokenizer_dir(None, str(tmp_path)) is None
    (tmp_path / "tokenizer.json").write_text("{}")
    assert tokenizer_dir(None, str(tmp_path)) == str(tmp_path)
    assert tokenizer_dir("/other", str(tmp_path)) == "/other"
    assert tokenizer_dir(None, "meta-llama/Llama-3.1-8B") is None


def test_text_collector_reads_chat_and_completion_chunks():
    rec, other = RequestRecord(0.0), RequestRecord(0.0)
    hook = TextCollector()
    hook(rec, json.dumps({"choices": [{"delta": {"content": "Hel"}}]}), 0.1)
    hook(rec, json.dumps({"choices": [{"delta": {"content": "lo"}}]}), 0.2)
    hook(other, json.dumps({"choices": [{"text": "x"}]}), 0.1)
    hook(other, "not json", 0.2)
    hook(other, json.dumps({"choices": [{"delta": {}, "finish_reason": "length"}]}), 0.3)
    assert hook.texts() == {id(rec): "Hello", id(other): "x"}
