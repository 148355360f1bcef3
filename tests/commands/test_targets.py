"""`tuner targets`: every shipped space and knob listed; bad names and bad files exit 2."""

from __future__ import annotations

import json

import yaml

from tests.targets_data import SPACES_DIR
from tuner.cli import main


def test_lists_every_shipped_space_and_knob(capsys):
    assert main(["targets"]) == 0
    blocks = {b.split()[0]: b for b in capsys.readouterr().out.strip().split("\n\n")}
    for path in SPACES_DIR.glob("*.yaml"):
        raw = yaml.safe_load(path.read_text())
        lines = blocks[raw["name"]].splitlines()
        assert f"({path.relative_to(SPACES_DIR.parent)})" in lines[0]
        for knob, spec in raw["parameters"].items():
            via = f"flag {spec['flag']}" if "flag" in spec else f"env {spec['env']}"
            line = next(ln for ln in lines if ln.split()[:1] == [knob])
            assert via in line and spec["type"] in line


def test_json_has_ranges_choices_targets_and_defaults(capsys):
    assert main(["targets", "--format", "json", "vllm", "transformers"]) == 0
    records = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(records) == {"vllm", "transformers"}
    knobs = {k["name"]: k for k in records["vllm"]["knobs"]}
    want = {"type": "int", "low": 8, "high": 1024, "log": True, "via": "flag",
            "target": "--max-num-seqs", "default": None}
    assert {k: knobs["max_num_seqs"][k] for k in want} == want
    assert knobs["num_gpu_blocks"]["range"] == "[64, auto]"   # high: auto, no --model
    assert knobs["block_size"]["choices"] == [16, 32, 64]
    tknobs = {k["name"]: k for k in records["transformers"]["knobs"]}
    assert tknobs["scheduler_type"]["target"] == "TUNER_CB_SCHEDULER_TYPE"
    assert records["transformers"]["fixed_env"] == {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}


def test_model_and_card_resolve_the_kv_range(capsys):
    assert main(["targets", "--format", "json", "transformers", "--model",
                 "models/llama-3.1-8b", "--gpu-memory", "24GiB"]) == 0
    knob = {k["name"]: k for k in json.loads(capsys.readouterr().out)[0]["knobs"]}["cb_num_blocks"]
    assert knob["range"].endswith("(auto)") and 64 < knob["high"] < 16384
    assert main(["targets", "transformers", "--gpu-memory", "24GiB"]) == 2


def test_unknown_space_exits_2(capsys):
    assert main(["targets", "nosuchserver"]) == 2
    err = capsys.readouterr().err
    assert "nosuchserver" in err and "vllm" in err


def test_a_malformed_space_file_exits_2_naming_it(tmp_path, capsys):
    (tmp_path / "good.yaml").write_text(
        "name: good\nserver: {command: [srv]}\nparameters: {a: {type: int, low: 1, high: 4, flag: --a}}\n")
    (tmp_path / "bad.yaml").write_text(
        "name: bad\nserver: {command: [srv]}\nparameters: {a: {type: int, low: 1, high: 4}}\n")
    assert main(["targets", "--dir", str(tmp_path)]) == 2
    assert "bad.yaml" in capsys.readouterr().err


def test_a_folder_of_one_user_space(tmp_path, capsys):
    (tmp_path / "mine.yaml").write_text(
        "name: mine\nserver: {command: [srv, --port, '{port}']}\n"
        "parameters: {a: {type: int, low: 1, high: 4, flag: --a, default: 2}}\n")
    assert main(["targets", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "mine" in out and "flag --a" in out and "[1, 4]" in out
