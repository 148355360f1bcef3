"""The step shape: what one step of each cell can hold under a config."""

from tuner.bench.records import Cell
from tuner.paths import REPO_ROOT
from tuner.search.space_file import load_space
from tuner.study.step_shape import step_shape

SPACE = load_space(REPO_ROOT / "search_spaces" / "infinilm.yaml")
TRANSFORMERS = load_space(REPO_ROOT / "search_spaces" / "transformers.yaml")
CHAT = (Cell(16, 128, 2048, 32), Cell(64, 64, 512, 128))
BASE = {"max_batch_size": 14, "max_num_batched_tokens": 6403, "prefill_batch_cap": 10,
        "decode_batch_cap": 17, "long_context_threshold": 8192, "long_context_max_batch": 7,
        "long_context_use_total_len": False, "decode_first_when_running": True}


def shape(params: dict, cells=CHAT, space=SPACE):
    return step_shape(space, {**BASE, **params}, cells)


def test_a_cap_above_what_the_step_can_hold_anyway_changes_nothing():
    """The batch cap (14) decodes 14 whether the decode cap is 17 or 47; ten 128-token prompts
    are 1280 tokens under a budget of 6403 or 2561."""
    assert shape({"decode_batch_cap": 47}) == shape({})
    assert shape({"max_num_batched_tokens": 2561}) == shape({})
    assert shape({"long_context_max_batch": 1}) == shape({})   # no prompt is long


def test_a_cap_or_budget_that_binds_before_or_after_changes_the_shape():
    assert shape({"decode_batch_cap": 4}) != shape({})      # 4 of 14
    assert shape({"max_batch_size": 42}) != shape({})       # decodes 17 instead of 14
    assert shape({"max_num_batched_tokens": 1024}) != shape({})   # below 1280 + decodes
    assert shape({"decode_first_when_running": False}) != shape({})


def test_the_guard_binds_where_its_threshold_calls_a_prompt_long():
    cells = (Cell(8, 4096, 256, 16),)
    assert shape({"long_context_max_batch": 1}, cells) == shape({}, cells)   # 4096 < 8192
    assert shape({"long_context_threshold": 4096, "long_context_max_batch": 1}, cells) \
        != shape({"long_context_threshold": 4096}, cells)
    assert shape({"long_context_threshold": 4096}, cells) != shape({}, cells)


def test_a_budget_the_server_checks_at_start_up_is_always_part_of_the_shape():
    """transformers serve reserves a full budget's forward: its size is never inert."""
    base = {"cb_max_batch_tokens": 8192}
    assert shape({**base, "cb_max_batch_tokens": 16384}, space=TRANSFORMERS) \
        != shape(base, space=TRANSFORMERS)
