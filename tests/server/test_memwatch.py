"""The memory high-water mark: the poller's mark, and a real simulated server's per-cell marks.

The second test is an integration test: `run_trial` launches the simulator as a real process on
127.0.0.1 with a simulated card (TUNER_SIM_NVML) that the server holds its memory on.
"""

from __future__ import annotations

import threading

from tuner.bench.records import Cell
from tuner.paths import REPO_ROOT
from tuner.search.space_file import load_space
from tuner.search.workload import load_workload
from tuner.server.memwatch import MemoryWatch
from tuner.sim import nvml
from tuner.trial.context import TrialContext
from tuner.trial.run import run_trial


def test_the_mark_is_the_highest_reading_and_a_failed_read_is_skipped():
    readings = iter([5, 9, None, 7])
    done = threading.Event()

    def read():
        try:
            value = next(readings)
        except StopIteration:
            done.set()
            return 3
        if value is None:
            raise RuntimeError("NVML hiccup")
        return value
    watch = MemoryWatch(read, poll_s=0.001)
    watch.start()
    assert done.wait(5.0)
    watch.stop()
    assert watch.mark() == 9 and not watch._thread.is_alive()


def test_each_cell_records_the_mark_the_server_left_on_the_card(tmp_path, monkeypatch):
    card = tmp_path / "gpu.json"
    nvml.create(card)
    monkeypatch.setenv(nvml.SIM_NVML_ENV, str(card))
    base = nvml.read_state(card).used_bytes
    ctx = TrialContext(space=load_space(REPO_ROOT / "search_spaces" / "infinilm.yaml"),
                       workload=load_workload(REPO_ROOT / "studies" / "quick.yaml"),
                       model_dir=str(REPO_ROOT / "models" / "llama-3.2-1b"), simulate="rtx4090",
                       time_scale=50.0, stall_timeout_s=600.0, gpu_index=0,
                       gpu_baseline_bytes=base, gpu_wait_s=30.0)
    cells = [Cell(1, 2048, 8, 2), Cell(4, 64, 8, 4)]
    res = run_trial(ctx, {"kv_cache_tokens": 16384, "block_size": 256, "max_batch_size": 8},
                    tmp_path / "t", cells=cells)
    assert res.outcome.kind == "ok" and res.idle_bytes is not None
    marks = [row["peak_bytes"] for row in res.cells]
    # the 2k prompt's prefill raised the mark above idle; the short cell cannot lower it
    assert marks[0] > res.idle_bytes and marks[1] >= marks[0] and res.peak_bytes == marks[1]
    assert nvml.read_state(card).used_bytes == base      # the server's memory left with it
