"""Errors that name the fix: one line, exit status 2, nothing written (issue 17)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakestudy import make_study_dir
from tuner.cli import main
from tuner.paths import REPO_ROOT
from tuner.sim.profiles import get_profile

MODEL = str(REPO_ROOT / "models" / "llama-3.1-8b")


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    (tmp_path / "studies").mkdir(exist_ok=True)
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().err.strip().splitlines()


def _tune(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str,
          model: str = MODEL) -> tuple[int, list[str]]:
    return _run(tmp_path, capsys, "tune", "--model", model, "--simulate", "rtx4090",
                "--trials", "1", "--studies-dir", str(tmp_path / "studies"), *extra)


def _refused(tmp_path: Path, rc: int, err: list[str], *needles: str) -> None:
    assert rc == 2 and len(err) == 1, err
    assert all(n in err[0] for n in needles), err[0]
    assert list((tmp_path / "studies").iterdir()) == []


def test_a_hugging_face_id_as_model_says_a_local_folder_is_needed(tmp_path, capsys):
    rc, err = _tune(tmp_path, capsys, model="meta-llama/Llama-3.1-8B-Instruct")
    _refused(tmp_path, rc, err, "not a Hugging Face id", "config.json")


def test_a_missing_required_argument_is_one_line(tmp_path, capsys):
    rc, err = _run(tmp_path, capsys, "tune", "--simulate", "rtx4090")
    _refused(tmp_path, rc, err, "tuner tune: error:", "--model", "tuner tune --help")


def test_option_prefixes_are_not_expanded(tmp_path, capsys):
    rc, err = _tune(tmp_path, capsys, "--gpu-memory-c", "8GiB")
    _refused(tmp_path, rc, err, "unrecognized arguments: --gpu-memory-c")


def test_an_unknown_space_name_lists_the_shipped_ones(tmp_path, capsys):
    rc, err = _tune(tmp_path, capsys, "--space", "vlm")
    _refused(tmp_path, rc, err, "no search space 'vlm'", "vllm", "tuner targets")


def test_an_unknown_gpu_profile_lists_the_known_ones(tmp_path, capsys):
    rc, err = _run(tmp_path, capsys, "tune", "--model", MODEL, "--simulate", "rtx9999",
                   "--studies-dir", str(tmp_path / "studies"))
    _refused(tmp_path, rc, err, "unknown GPU profile 'rtx9999'", "rtx4090")


def test_an_unknown_study_lists_the_existing_ones(tmp_path, capsys):
    make_study_dir(tmp_path / "studies", "demo")
    before = sorted(p.name for p in (tmp_path / "studies").iterdir())
    rc, err = _run(tmp_path, capsys, "inspect", "--study", "nope",
                   "--studies-dir", str(tmp_path / "studies"))
    assert rc == 2 and len(err) == 1 and "no study 'nope'" in err[0] and "demo" in err[0], err
    assert sorted(p.name for p in (tmp_path / "studies").iterdir()) == before


def test_shipped_space_names_and_gpu_names_in_capitals_are_accepted():
    from tuner.paths import space_file
    assert space_file("vllm") == REPO_ROOT / "search_spaces" / "vllm.yaml"
    assert get_profile("RTX4090") is get_profile("rtx4090")


def test_reruns_say_what_they_do_and_a_changed_setup_is_refused_or_warned(tmp_path, capsys):
    studies = tmp_path / "studies"
    base = ["tune", "--model", MODEL, "--simulate", "rtx4090", "--time-scale", "50",
            "--trials", "2", "--study", "s", "--studies-dir", str(studies), "--no-export"]
    assert main([*base, "--sampler", "random", "--seed", "1"]) == 0
    capsys.readouterr()
    assert main([*base, "--sampler", "random", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 measured trials already, nothing to run" in out
    assert "use --trials 7 to measure 5 more" in out
    assert main([*base, "--sampler", "tpe"]) == 0
    err = capsys.readouterr().err
    assert "warning: study 's' was made with RandomSampler; continuing it with TPESampler" in err
    other = tmp_path / "w.yaml"
    other.write_text((REPO_ROOT / "studies" / "quick.yaml").read_text().replace(
        "name: quick", "name: other", 1))
    before = (studies / "s" / "study.db").read_bytes()
    rc, err_lines = _run(tmp_path, capsys, *base, "--workload", str(other))
    assert rc == 2 and len(err_lines) == 1 and "exists with workload 'quick'" in err_lines[0]
    assert (studies / "s" / "study.db").read_bytes() == before


def test_ablate_takes_model_space_workload_and_simulator_from_the_study(tmp_path, capsys):
    import argparse

    import optuna

    from tuner.commands.ablate import from_study
    from tuner.study.study_record import StudyInfo
    studies = tmp_path / "studies"
    assert main(["tune", "--model", MODEL, "--simulate", "RTX4090", "--time-scale", "50",
                 "--trials", "1", "--study", "a", "--studies-dir", str(studies),
                 "--space", "infinilm",
                 "--sampler", "random", "--no-export", "--gpu-memory-cap", "20GiB"]) == 0
    study = optuna.load_study(study_name="a", storage=f"sqlite:///{studies / 'a' / 'study.db'}")
    args = argparse.Namespace(model=None, space=None, workload=None, simulate=None,
                              gpu_memory_cap=None)
    from_study(args, StudyInfo.of(study))
    assert args.model == MODEL and args.simulate == "RTX4090" and args.gpu_memory_cap == "20GiB"
    assert args.space == str(REPO_ROOT / "search_spaces" / "infinilm.yaml")
    assert args.workload == str(REPO_ROOT / "studies" / "quick.yaml")
