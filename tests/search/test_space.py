"""Search-space loading: Optuna distributions out, one clear error per bad file."""

from pathlib import Path

import optuna
import pytest

from tuner.errors import UsageError
from tuner.search.space_file import load_space

ROOT = Path(__file__).resolve().parents[2]
GOOD = """
name: t
server: {command: ["srv", "--model", "{model}", "--port", "{port}"]}
fixed_flags: ["--fixed", "{max_output_len}"]
fixed_env: {A: "x"}
parameters:
  blocks: {type: int, low: 8, high: 64, step: 8, flag: --num-blocks, default: 16}
  frac: {type: float, low: 0.5, high: 0.9, flag: --frac}
  policy: {type: categorical, choices: [fifo, lpm], env: POLICY}
  graph: {type: bool, flag: --graph}
  first: {type: bool, env: FIRST, true_value: "yes", false_value: "no"}
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "space.yaml"
    p.write_text(text)
    return p


def test_shipped_infinilm_space_loads_with_seed_knobs():
    space = load_space(ROOT / "search_spaces" / "infinilm.yaml")
    flags = {p.flag for p in space.parameters if p.flag}
    envs = {p.env for p in space.parameters if p.env}
    assert {"--num-blocks", "--block-size", "--max-batch-size"} <= flags
    assert {"INFINILM_PREFILL_BATCH_CAP", "INFINILM_DECODE_BATCH_CAP",
            "INFINILM_LONG_CONTEXT_THRESHOLD", "INFINILM_LONG_CONTEXT_MAX_BATCH",
            "INFINILM_DECODE_FIRST_WHEN_RUNNING"} <= envs
    assert space.server.simulator is not None


def test_distributions_and_render(tmp_path):
    space = load_space(_write(tmp_path, GOOD))
    d = space.distributions()
    assert d["blocks"] == optuna.distributions.IntDistribution(8, 64, step=8)
    assert isinstance(d["frac"], optuna.distributions.FloatDistribution)
    assert d["policy"].choices == ("fifo", "lpm")
    argv, env = space.render({"blocks": 24, "frac": 0.7, "policy": "lpm", "graph": True, "first": False},
                             model="/m", host="127.0.0.1", port=9, max_output_len=128)
    assert argv == ["srv", "--model", "/m", "--port", "9", "--fixed", "128",
                    "--num-blocks", "24", "--frac", "0.7", "--graph"]
    assert env == {"A": "x", "POLICY": "lpm", "FIRST": "no"}
    argv, env = space.render({"graph": False}, model="/m", host="h", port=1, max_output_len=1)
    assert "--graph" not in argv and "POLICY" not in env


@pytest.mark.parametrize("bad, needle", [
    ("name: t\nserver: {command: [x]}\nparameters: {a: {type: wat, low: 1, high: 2, flag: --a}}",
     "parameters.a.type"),
    ("name: t\nserver: {command: [x]}\nparameters: {a: {type: int, low: 5, high: 2, flag: --a}}",
     "low (5) is greater than high (2)"),
    ("name: t\nserver: {command: [x]}\nparameters: {a: {type: categorical, choices: [], env: A}}",
     "parameters.a.choices"),
    ("name: t\nserver: {command: [x]}\nparameters: {a: {type: int, low: 1, high: 2}}",
     "exactly one of 'flag' or 'env'"),
    ("name: t\nserver: {command: [x]}\nparameters: {a: {type: int, low: 1, high: 2, flag: --a, colour: red}}",
     "unknown key"),
    ("name: t\nparameters: {a: {type: int, low: 1, high: 2, flag: --a}}", "server: missing"),
    ("name: [unclosed\n", "malformed YAML"),
    ("name: t\nserver: {command: [x], prefill_steps: whole}\n"
     "parameters: {a: {type: int, low: 1, high: 2, flag: --a}}", "server.prefill_steps"),
])
def test_bad_files_name_file_and_key(tmp_path, bad, needle):
    path = _write(tmp_path, bad)
    with pytest.raises(UsageError) as err:
        load_space(path)
    assert str(path) in str(err.value) and needle in str(err.value)


def test_env_value_with_newline_is_refused_when_loading(tmp_path):
    with pytest.raises(UsageError, match="fixed_env.A: environment value contains a newline"):
        load_space(_write(tmp_path, GOOD.replace('{A: "x"}', '{A: "x\\ny"}')))


def test_env_value_with_newline_from_a_placeholder_is_refused(tmp_path):
    space = load_space(_write(tmp_path, GOOD.replace('{A: "x"}', '{A: "{model}"}')))
    with pytest.raises(UsageError, match="newline"):
        space.render({}, model="m\nx", host="h", port=1, max_output_len=1)


def test_simulate_needs_a_simulator_entry(tmp_path):
    space = load_space(_write(tmp_path, GOOD))
    with pytest.raises(UsageError, match="no server.simulator"):
        space.render({}, model="m", host="h", port=1, max_output_len=1, simulate="rtx4090")


def test_fingerprint_changes_with_parameters(tmp_path):
    a = load_space(_write(tmp_path, GOOD)).fingerprint()
    b = load_space(_write(tmp_path, GOOD.replace("high: 64", "high: 128"))).fingerprint()
    assert a != b
