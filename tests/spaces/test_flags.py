"""Every flag and variable a shipped space sends exists in the real server's recorded command line.

The recorded lists (tests/data/flags/) were extracted from named releases; their headers say
which release, which file and the exact command. When a server renames a flag (SGLang's
--cuda-graph-max-bs became --cuda-graph-max-bs-decode; vLLM dropped --max-num-partial-prefills),
re-record the list for the new release and this test names the flags the space must change.
"""

from __future__ import annotations

import pytest
import yaml

from tests.targets_data import FLAGS_DIR, SPACE_FLAG_FILES, SPACES_DIR, header, recorded
from tuner.server.launchers.transformers_serve import CB_FIELDS, CB_PREFIX

SEED_ENV = {"INFINILM_PREFILL_BATCH_CAP", "INFINILM_DECODE_BATCH_CAP",
            "INFINILM_LONG_CONTEXT_THRESHOLD", "INFINILM_LONG_CONTEXT_MAX_BATCH",
            "INFINILM_LONG_CONTEXT_USE_TOTAL_LEN", "INFINILM_DECODE_FIRST_WHEN_RUNNING"}


def _raw(name: str) -> dict:
    return yaml.safe_load((SPACES_DIR / f"{name}.yaml").read_text())


def space_flags(raw: dict) -> set[str]:
    """Every `--flag` the space can put on the server's command line (python's own -m excluded)."""
    tokens = [*raw["server"]["command"], *raw.get("fixed_flags", [])]
    flags = {t for t in tokens if t.startswith("--")}
    return flags | {p["flag"] for p in raw["parameters"].values() if "flag" in p}


def test_every_shipped_space_has_a_recorded_command_line():
    assert {f.stem for f in SPACES_DIR.glob("*.yaml")} == set(SPACE_FLAG_FILES)


@pytest.mark.parametrize("name", sorted(p.name for p in FLAGS_DIR.glob("*.txt")))
def test_recorded_lists_say_where_they_came_from(name):
    head = header(name)
    for key in ("release:", "source:", "obtained"):
        assert key in head, f"{name}: no {key!r} line"
    assert recorded(name), f"{name} lists nothing"


@pytest.mark.parametrize("space, flag_file", sorted(SPACE_FLAG_FILES.items()))
def test_every_flag_exists_in_the_real_server(space, flag_file):
    missing = space_flags(_raw(space)) - recorded(flag_file)
    assert not missing, f"{space}.yaml uses flags that {flag_file} does not have: {sorted(missing)}"


def test_issue_knobs_are_covered():
    vllm = space_flags(_raw("vllm"))
    assert {"--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization", "--block-size",
            "--long-prefill-token-threshold", "--max-cudagraph-capture-size"} <= vllm
    assert "--disable-chunked-prefill" in vllm and "--enable-chunked-prefill" in recorded("vllm-0.33.0.txt")
    assert "--max-num-partial-prefills" not in recorded("vllm-0.33.0.txt")
    assert {"--max-running-requests", "--chunked-prefill-size", "--mem-fraction-static",
            "--schedule-policy", "--schedule-conservativeness",
            "--cuda-graph-max-bs-decode"} <= space_flags(_raw("sglang"))
    assert {"--cb-num-blocks", "--cb-block-size", "--cb-max-batch-tokens", "--cb-max-memory-percent",
            "--cb-use-cuda-graph"} <= space_flags(_raw("transformers"))


def test_infinilm_env_names_are_upstream_or_the_seed_patch():
    known = recorded("infinilm-env.txt")
    assert known == SEED_ENV | {"INFINILM_MAX_NUM_BATCHED_TOKENS"}
    used = {p["env"] for p in _raw("infinilm")["parameters"].values() if "env" in p}
    assert used <= known, sorted(used - known)
    assert SEED_ENV <= used


def test_transformers_env_knobs_are_real_config_fields_without_a_flag():
    fields = recorded("transformers-5.17.0-cb-fields.txt")
    serve_flags = recorded("transformers-5.17.0-serve.txt")
    assert set(CB_FIELDS) <= fields, sorted(set(CB_FIELDS) - fields)
    assert not {f"--cb-{f.replace('_', '-')}" for f in CB_FIELDS} & serve_flags
    raw = _raw("transformers")
    envs = [p["env"] for p in raw["parameters"].values() if "env" in p]
    assert envs and all(e.startswith(CB_PREFIX) for e in envs)
    assert {e[len(CB_PREFIX):].lower() for e in envs} <= set(CB_FIELDS)
    assert {"scheduler_type", "max_requests_per_batch"} <= {e[len(CB_PREFIX):].lower() for e in envs}
