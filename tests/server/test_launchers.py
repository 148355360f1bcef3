"""tuner.server.launchers.transformers_serve without a GPU or transformers: env parsing, the config patch."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.server.launchers import transformers_serve as ts


def test_cb_overrides_are_typed_and_only_from_the_prefix():
    env = {"TUNER_CB_SCHEDULER_TYPE": "prefill_first", "TUNER_CB_MAX_REQUESTS_PER_BATCH": "64",
           "TUNER_CB_SAFETY_MARGIN": "0.1", "TUNER_CB_USE_ASYNC_BATCHING": "false",
           "TUNER_GPU_MEMORY_CAP_GIB": "24", "PATH": "/bin"}
    assert ts.cb_overrides(env) == {"scheduler_type": "prefill_first", "max_requests_per_batch": 64,
                                    "safety_margin": 0.1, "use_async_batching": False}
    assert ts.cb_overrides({}) == {}


@pytest.mark.parametrize("env, needle", [
    ({"TUNER_CB_SCHEDULER": "fifo"}, "no settable ContinuousBatchingConfig field 'scheduler'"),
    ({"TUNER_CB_BLOCK_SIZE": "64"}, "'block_size'"),   # has a --cb- flag: pass it as a flag
    ({"TUNER_CB_MAX_REQUESTS_PER_BATCH": "lots"}, "TUNER_CB_MAX_REQUESTS_PER_BATCH='lots'"),
    ({"TUNER_CB_ALLOW_BLOCK_SHARING": "maybe"}, "not a boolean"),
])
def test_bad_cb_variables_are_refused(env, needle):
    with pytest.raises(ts.LauncherError, match=needle):
        ts.cb_overrides(env)


def test_memory_cap():
    assert ts.memory_cap_gib({}) is None
    assert ts.memory_cap_gib({ts.CAP_ENV: " "}) is None
    assert ts.memory_cap_gib({ts.CAP_ENV: "24"}) == 24.0
    for bad in ("0", "-1", "lots"):
        with pytest.raises(ts.LauncherError, match=ts.CAP_ENV):
            ts.memory_cap_gib({ts.CAP_ENV: bad})


@pytest.mark.parametrize("argv, index", [
    (["serve", "m", "--device", "cuda:1"], 1), (["serve", "m", "--device=cuda:3"], 3),
    (["serve", "m", "--device", "auto"], 0), (["serve", "m"], 0)])
def test_device_index(argv, index):
    assert ts.device_index(argv) == index


def _config_class():
    seen = []

    @dataclasses.dataclass
    class Config:
        block_size: int = 256
        scheduler_type: str = "fifo"
        max_requests_per_batch: int | None = None

        def __post_init__(self):
            seen.append((self.scheduler_type, self.max_requests_per_batch))

    return Config, seen


def test_overrides_reach_every_config_before_its_post_init():
    config_cls, seen = _config_class()
    ts.install_cb_overrides(config_cls, {"scheduler_type": "prefill_first", "max_requests_per_batch": 8})
    c = config_cls(block_size=64)
    assert (c.block_size, c.scheduler_type, c.max_requests_per_batch) == (64, "prefill_first", 8)
    assert seen == [("prefill_first", 8)]
    assert dataclasses.replace(c).scheduler_type == "prefill_first"


def test_override_of_a_field_the_class_lacks_is_refused():
    config_cls, _ = _config_class()
    with pytest.raises(ts.LauncherError, match="safety_margin"):
        ts.install_cb_overrides(config_cls, {"safety_margin": 0.1})


def test_main_exits_2_before_loading_anything_on_a_bad_variable(monkeypatch, capsys):
    monkeypatch.setenv("TUNER_CB_SCHEDULER", "fifo")
    assert ts.main(["serve", "/m"]) == 2
    assert "TUNER_CB_SCHEDULER" in capsys.readouterr().err
