"""The whole pre-screen, as a trial meets it, replayed on every committed study of a real GPU.

Why: the pre-screen's rules were grown on the simulator's suite, where a rule that skips a
feasible config shows up as a number.  On a real card the evidence differs (NVML's idle
readings, servers that allocate their pool on first use, OOMs that surface as a dead step
loop), and a rule that misreads it costs a user a good config without a word.  Each config
these studies launched is judged here as `AdaptivePipeline` judges a proposal: with the trials
before it as the study's history, the proposals' calibrated need and the cells a nearer
measurement vouches for.  The memory estimate stored with each trial is recomputed with the
current code (older records lack the per-cell forms the rules read), as the current code would
have stored it.

No config that ran (ok or over the SLO) may be skipped.  The OOMs skipped are counted, at least
as many as the current rules skip: 33 of the 38 OOMs among 404 launched configs of 24 studies.
The footprint-check refusals of transformers serve are all skipped.  Of the seed's InfiniLM's 8,
the 3 whose 4k prefill an earlier OOM proved larger than estimated are; the other 5 were the
first OOM of their form of forward (there is nothing before one to learn from) or a config
whose need the estimate put under one seen healthy.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import optuna
import pytest

from tuner.bench.records import Cell
from tuner.search.bounds import resolve_space
from tuner.search.model import ModelInfo, load_model_info
from tuner.search.space import SearchSpace
from tuner.search.space_file import load_space
from tuner.search.workload import load_workload
from tuner.study.record import TrialRecord, records
from tuner.study.storage import as_storage
from tuner.trial.kv_calibration import measured, proven
from tuner.trial.kv_share import KvEdge, kv_param
from tuner.trial.memory_estimate import estimate, knobs_from_params
from tuner.trial.prescreen import calibrated_runtime, decide, estimate_attr

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
GIB = 2 ** 30
H200 = "benchmarks/h200/"
TRANSFORMERS = "search_spaces/transformers.yaml"

# (storage files, search space, model, workload, card bytes)
STUDIES = [
    (sorted(RESULTS.glob("h200-transformers-8b*/study.db")), TRANSFORMERS,
     "models/llama-3.1-8b", None, 24 * GIB),
    ([RESULTS / "infinilm-seed-h200" / "study.db"],
     "benchmarks/results/infinilm-seed-h200/seed_space.yaml", "models/llama-3.1-8b",
     H200 + "workload-seed8b.yaml", 24 * GIB),
    ([RESULTS / "infinilm-h200" / "capped_study.db"],
     "benchmarks/results/infinilm-h200/capped_space.yaml", "models/llama-3.2-1b",
     H200 + "workload.yaml", 12 * GIB),
    ([RESULTS / "infinilm-h200" / "study.db"], "search_spaces/infinilm.yaml",
     "models/llama-3.2-1b", H200 + "workload.yaml", 143771 * 2 ** 20),
    ([RESULTS / "h200" / "study_cap8.db"], TRANSFORMERS, "models/llama-3.2-1b",
     H200 + "workload.yaml", 8 * GIB),
    ([RESULTS / "h200" / "study.db", *sorted((RESULTS / "two-gpu-h200").glob("journal_*.log"))],
     TRANSFORMERS, "models/llama-3.2-1b", H200 + "workload.yaml", 24 * GIB),
    ([RESULTS / "h100-transformers-3b-rag-r29" / "study.db"], TRANSFORMERS,
     "models/llama-3.2-3b", H200 + "workload-rag3b.yaml", 12 * GIB),
]


def _rebuilt(t: TrialRecord, space: SearchSpace, model: ModelInfo,
             cells: list[Cell]) -> TrialRecord:
    """The record as the current code would have stored it: its estimate recomputed."""
    knobs = knobs_from_params(space, dict(t.params))
    if t.memory is None or t.outcome == "skipped" or knobs.kv_tokens is None:
        return t
    est = estimate(model, knobs, cells, runtime=t.memory.get("runtime"))
    return dataclasses.replace(t, memory=estimate_attr(est, knobs.cuda_graph))


def _replay(path: Path, space_file: str, model_dir: str, workload: str,
            card: int) -> list[tuple[str, bool]]:
    """(outcome, skipped now) for every config the study launched."""
    model = load_model_info(ROOT / model_dir)
    cells = list(load_workload(ROOT / workload).cells)
    space = resolve_space(load_space(ROOT / space_file), model, card, cells)
    edge = KvEdge(space, model, card, tuple(cells)) if kv_param(space) is not None else None
    storage = as_storage(f"journal:{path}" if path.suffix == ".log" else f"sqlite:///{path}")
    out = []
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        trials = [_rebuilt(t, space, model, cells)
                  for t in records(study, (optuna.trial.TrialState.COMPLETE,))]
        for t in trials:
            knobs = knobs_from_params(space, dict(t.params))
            if t.outcome not in ("ok", "slo", "oom") or knobs.kv_tokens is None:
                continue
            before = [b for b in trials if b.number < t.number]
            est = estimate(model, knobs, cells,
                           runtime=calibrated_runtime(before, knobs.cuda_graph))
            calibrated, near = edge.screen_evidence(dict(t.params), before, est) \
                if edge is not None else (None, frozenset[str]())
            verdict = decide(est, card, before, calibrated, knobs.cuda_graph,
                             proven(before, card), measured(before), near)
            out.append((t.outcome, verdict.skip))
    return out


@functools.cache
def _judged(group: int) -> list[tuple[str, bool]]:
    """(outcome, skipped now) over every study of `STUDIES[group]`, replayed once per session."""
    paths, space_file, model_dir, workload, card = STUDIES[group]
    assert paths and all(p.is_file() for p in paths)
    return [j for path in paths for j in _replay(
        path, space_file, model_dir, workload or H200 + (
            "workload-seed8b.yaml" if "seedwl" in path.parent.name else "workload.yaml"), card)]


@pytest.mark.parametrize("group", range(len(STUDIES)),
                         ids=["transformers-8b-24g", "infinilm-seed-8b-24g", "infinilm-1b-12g",
                              "infinilm-1b-h200", "transformers-1b-8g", "transformers-1b-24g",
                              "transformers-3b-12g"])
def test_no_config_that_ran_on_a_real_gpu_is_skipped(group):
    judged = _judged(group)
    assert judged
    assert [j for j in judged if j[0] != "oom" and j[1]] == []


def test_the_real_ooms_the_rules_skip():
    """The counts of the module doc: a rule that stops skipping a real OOM shows here."""
    judged = [j for group in range(len(STUDIES)) for j in _judged(group)]
    assert sum(outcome == "oom" for outcome, _ in judged) == 38
    assert sum(outcome == "oom" and skip for outcome, skip in judged) >= 33
