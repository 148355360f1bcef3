"""Bad input to `tuner tune`: one line naming the problem, exit status 2, nothing written.

Each case runs the real command line (`tuner.cli.main`) against an empty studies dir and checks
that the dir is still empty afterwards: no study folder, no study.db, no trial folder.  A
mistake that is only found after the study was created would leave a half-made study that the
next, corrected command would trip over.
"""

from __future__ import annotations

import errno
import hashlib
import json
import socket
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from tuner.cli import main
from tuner.paths import REPO_ROOT

MODEL = str(REPO_ROOT / "models" / "llama-3.1-8b")
SPACE = REPO_ROOT / "search_spaces" / "infinilm.yaml"
WORKLOAD = REPO_ROOT / "studies" / "quick.yaml"


def _space(tmp_path: Path, edit: Any = None, text: str | None = None) -> str:
    """A copy of the shipped InfiniLM space, changed by `edit(raw)` or replaced by `text`."""
    path = tmp_path / "space.yaml"
    if text is None:
        raw = yaml.safe_load(SPACE.read_text())
        if edit is not None:
            edit(raw)
        text = yaml.safe_dump(raw, sort_keys=False)
    path.write_text(text)
    return str(path)


def _workload(tmp_path: Path, edit: Any) -> str:
    raw = yaml.safe_load(WORKLOAD.read_text())
    edit(raw)
    path = tmp_path / "workload.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def _tune(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str,
          model: str = MODEL) -> tuple[int, list[str]]:
    studies = tmp_path / "studies"
    studies.mkdir(exist_ok=True)
    rc = main(["tune", "--model", model, "--simulate", "rtx4090", "--trials", "2",
               "--study", "s", "--studies-dir", str(studies), "--sampler", "random",
               "--no-export", *extra])
    return rc, capsys.readouterr().err.strip().splitlines()


def _assert_refused(tmp_path: Path, rc: int, err: list[str], needle: str) -> None:
    assert rc == 2
    assert len(err) == 1, err
    assert err[0].startswith("tuner tune: error: ") and needle in err[0], err[0]
    assert list((tmp_path / "studies").iterdir()) == []


def _set_param(name: str, **spec: Any) -> Any:
    def edit(raw: dict[str, Any]) -> None:
        raw["parameters"][name] = spec
    return edit


def test_missing_model_dir(tmp_path, capsys):
    rc, err = _tune(tmp_path, capsys, model=str(tmp_path / "no-model"))
    _assert_refused(tmp_path, rc, err, "model dir not found")


def test_config_json_without_the_needed_keys(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 4096}))
    rc, err = _tune(tmp_path, capsys, model=str(model))
    _assert_refused(tmp_path, rc, err, "missing or non-positive integer key 'intermediate_size'")


def test_malformed_space_yaml(tmp_path, capsys):
    rc, err = _tune(tmp_path, capsys, "--space", _space(tmp_path, text="name: [unclosed\n"))
    _assert_refused(tmp_path, rc, err, "malformed YAML")


def test_malformed_workload_yaml(tmp_path, capsys):
    path = tmp_path / "w.yaml"
    path.write_text("cells: {concurrency: 4\n")
    rc, err = _tune(tmp_path, capsys, "--workload", str(path))
    _assert_refused(tmp_path, rc, err, "malformed YAML")


def test_unknown_parameter_type(tmp_path, capsys):
    space = _space(tmp_path, _set_param("num_blocks", type="integer", low=1, high=8, flag="--num-blocks"))
    rc, err = _tune(tmp_path, capsys, "--space", space)
    _assert_refused(tmp_path, rc, err, "parameters.num_blocks.type: unknown parameter type 'integer'")


def test_low_greater_than_high(tmp_path, capsys):
    space = _space(tmp_path, _set_param("num_blocks", type="int", low=64, high=16, flag="--num-blocks"))
    rc, err = _tune(tmp_path, capsys, "--space", space)
    _assert_refused(tmp_path, rc, err, "parameters.num_blocks: low (64) is greater than high (16)")


def test_empty_choice_list(tmp_path, capsys):
    space = _space(tmp_path, _set_param("block_size", type="categorical", choices=[], flag="--block-size"))
    rc, err = _tune(tmp_path, capsys, "--space", space)
    _assert_refused(tmp_path, rc, err, "parameters.block_size.choices: must be a non-empty list")


def test_unknown_slo_metric(tmp_path, capsys):
    workload = _workload(tmp_path, lambda raw: raw.update(slo={"p99_latency_ms": 100}))
    rc, err = _tune(tmp_path, capsys, "--workload", workload)
    _assert_refused(tmp_path, rc, err, "unknown metric 'p99_latency_ms'")


def test_unknown_objective(tmp_path, capsys):
    rc, err = _tune(tmp_path, capsys, "--objective", "maximize speed")
    _assert_refused(tmp_path, rc, err, "unknown objective 'maximize speed'")


def test_objective_on_an_unknown_metric(tmp_path, capsys):
    rc, err = _tune(tmp_path, capsys, "--objective", "max tokens_per_joule")
    _assert_refused(tmp_path, rc, err, "unknown metric 'tokens_per_joule'")


class _NoEphemeralPorts(socket.socket):
    """A kernel whose ephemeral port range is used up: binding to port 0 fails."""

    def bind(self, address: Any) -> None:
        if isinstance(address, tuple) and address[1] == 0:
            raise OSError(errno.EADDRINUSE, "Address already in use")
        super().bind(address)


def test_no_free_port(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(socket, "socket", _NoEphemeralPorts)
    rc, err = _tune(tmp_path, capsys)
    _assert_refused(tmp_path, rc, err, "no free port on 127.0.0.1")


def test_server_command_not_found(tmp_path, capsys):
    def edit(raw: dict[str, Any]) -> None:
        raw["server"]["simulator"] = ["no-such-server-6f1c", "--port", "{port}"]
    rc, err = _tune(tmp_path, capsys, "--space", _space(tmp_path, edit))
    _assert_refused(tmp_path, rc, err, "server command not found: no-such-server-6f1c")


def test_server_path_not_found(tmp_path, capsys):
    def edit(raw: dict[str, Any]) -> None:
        raw["server"]["simulator"] = [str(tmp_path / "bin" / "server"), "--port", "{port}"]
    rc, err = _tune(tmp_path, capsys, "--space", _space(tmp_path, edit))
    _assert_refused(tmp_path, rc, err, f"server command not found: {tmp_path / 'bin' / 'server'}")


def test_unreachable_storage_url(tmp_path, capsys):
    url = "postgresql+psycopg2://tuner:tuner@127.0.0.1:1/tuner"  # port 1: connection refused
    rc, err = _tune(tmp_path, capsys, "--storage", url)
    _assert_refused(tmp_path, rc, err, f"cannot open storage {url}")


def test_workload_cell_with_zero_concurrency(tmp_path, capsys):
    workload = _workload(tmp_path, lambda raw: raw["cells"][0].update(concurrency=0))
    rc, err = _tune(tmp_path, capsys, "--workload", workload)
    _assert_refused(tmp_path, rc, err, "cells[0].concurrency: must be an integer >= 1, got 0")


@pytest.mark.parametrize("key", ["input_len", "output_len"])
def test_workload_negative_length(tmp_path, capsys, key):
    workload = _workload(tmp_path, lambda raw: raw["cells"][1].update({key: -5}))
    rc, err = _tune(tmp_path, capsys, "--workload", workload)
    _assert_refused(tmp_path, rc, err, f"cells[1].{key}: must be an integer >= ")


def test_env_value_with_a_newline(tmp_path, capsys):
    space = _space(tmp_path, lambda raw: raw.update(fixed_env={"INFINILM_LOG": "a\nb"}))
    rc, err = _tune(tmp_path, capsys, "--space", space)
    _assert_refused(tmp_path, rc, err, "fixed_env.INFINILM_LOG: environment value contains a newline")


def test_env_choice_with_a_newline(tmp_path, capsys):
    space = _space(tmp_path, _set_param("long_context_threshold", type="categorical",
                                        choices=["1024", "2048\n"], env="INFINILM_LONG_CONTEXT_THRESHOLD"))
    rc, err = _tune(tmp_path, capsys, "--space", space)
    _assert_refused(tmp_path, rc, err, "INFINILM_LONG_CONTEXT_THRESHOLD contains a newline")


def test_resume_of_a_study_that_does_not_exist(tmp_path, capsys):
    rc, err = _tune(tmp_path, capsys, "--resume")
    _assert_refused(tmp_path, rc, err, "--resume: no study 's'")


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_existing_study_with_a_different_search_space(tmp_path, capsys):
    from tuner.search.objectives import parse_objectives
    from tuner.search.space_file import load_space
    from tuner.study.create import create_or_load
    from tuner.study.storage import open_storage
    from tuner.trial.context import TrialContext
    from tuner.search.workload import load_workload

    studies = tmp_path / "studies"
    (studies / "s").mkdir(parents=True)
    ctx = TrialContext(space=load_space(SPACE), workload=load_workload(WORKLOAD), model_dir=MODEL,
                       simulate="rtx4090")
    storage = open_storage(f"sqlite:///{studies / 's' / 'study.db'}")
    study = create_or_load("s", storage, ctx, parse_objectives(["max output_throughput"]),
                           optuna.samplers.RandomSampler(), "rtx4090 (simulated)")
    storage.engine.dispose()
    before = _tree(studies)
    narrower = _space(tmp_path, lambda raw: raw["parameters"]["max_batch_size"].update(high=64))
    rc = main(["tune", "--model", MODEL, "--simulate", "rtx4090", "--trials", "2", "--study", "s",
               "--studies-dir", str(studies), "--space", narrower,
               "--objective", "max output_throughput", "--no-export"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "study 's' exists with a different search space" in err[0]
    assert _tree(studies) == before
    assert optuna.load_study(study_name="s", storage=storage).get_trials() == []
    assert study.user_attrs["space_file"] == str(SPACE)
