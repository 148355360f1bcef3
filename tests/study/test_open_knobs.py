"""The knobs the server-default trial leaves open are drawn where the config can run."""

import argparse
from pathlib import Path

import optuna
from optuna.distributions import IntDistribution

from tuner.bench.records import Cell
from tuner.commands.tune_options import warm_start
from tuner.search.bounds import resolve_space
from tuner.search.model import load_model_info
from tuner.search.objectives import parse_objectives
from tuner.search.space_file import load_space
from tuner.search.workload import Workload
from tuner.study.open_knobs import fill
from tuner.study.proposals import guided
from tuner.study.sampler import make_sampler, startup_trials
from tuner.trial.context import TrialContext
from tuner.trial.pipeline import AdaptivePipeline
from tuner.trial.prescreen import PRIOR_MARGIN

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
DISTS = {"a": IntDistribution(1, 100), "b": IntDistribution(1, 100)}


def _draws(values):
    it = iter(values)
    return lambda name, dist: next(it)


def test_the_first_draw_that_fits_wins_and_the_given_knobs_stay():
    room = lambda p: 100 - p["a"] - p["b"] - p["given"]  # noqa: E731
    drawn = fill(DISTS, {"given": 10}, _draws([80, 50, 30, 20, 60, 5]), room)
    assert drawn == {"a": 30, "b": 20}


def test_a_first_draw_that_fits_is_kept_as_drawn():
    calls = []

    def draw(name, dist):
        calls.append(name)
        return 1
    assert fill(DISTS, {}, draw, lambda p: 0.0) == {"a": 1, "b": 1}
    assert calls == ["a", "b"]          # one draw per knob, in order: the sampler's own draw


def test_where_nothing_fits_the_draw_that_came_closest_wins():
    room = lambda p: -p["a"]  # noqa: E731
    values = [9, 1, 3, 1, 7, 1]
    assert fill(DISTS, {}, _draws(values), room, tries=3) == {"a": 3, "b": 1}


def _trial0(sampler_seed: int, wrapped: bool):
    """Trial 0 of `tune` with the transformers space, Llama-3.2-3B on a 12 GiB card and a RAG
    matrix (the H100 study of round 29), as the tuner's pipeline renders it."""
    model_dir = ROOT / "models" / "llama-3.2-3b"
    model, cap = load_model_info(model_dir), 12 * GIB
    cells = (Cell(8, 3072, 64, 8), Cell(32, 512, 128, 32), Cell(64, 128, 64, 64))
    space = resolve_space(load_space(ROOT / "search_spaces" / "transformers.yaml"), model, cap,
                          cells)
    ctx = TrialContext(space=space, workload=Workload("rag", 0, None, cells),
                       model_dir=str(model_dir))
    pipeline = AdaptivePipeline(ctx, parse_objectives(["max output_throughput"]), model, cap,
                                kv_share=True)
    sampler = make_sampler("auto", sampler_seed, 20)
    if wrapped:
        sampler = guided(sampler, pipeline.kv_edge, startup_trials(20), sampler_seed,
                         limits=space.limits(), budgets=space.budgets(), trials=20)
    study = optuna.create_study(directions=["maximize"], sampler=sampler)
    warm_start(study, space, argparse.Namespace(no_defaults=False, seed_config=None,
                                                warm_start_from=None), "", ROOT, pipeline)
    params = pipeline.suggest(study.ask())
    edge = pipeline.kv_edge
    room = edge.room_at([])(params, int(params[edge.param.name]))
    return params, room


def test_the_default_trial_draws_its_open_knobs_where_it_fits():
    """Seed 0's plain draw (the round 29 study's trial 0) wants a 5365-token forward budget
    that puts even the smallest pool more than the pre-screen's prior margin over the card, so
    trial 0 was skipped.  The tuner's trial 0 keeps the space's defaults and draws the open
    knobs again: with the default block size of 256 the smallest pool (64 blocks) does not fit
    by the uncalibrated estimate whatever they are, so the draw that comes closest wins, and
    the pre-screen lets it run."""
    plain, plain_room = _trial0(0, wrapped=False)
    assert plain["cb_max_batch_tokens"] == 5365 and plain_room < -PRIOR_MARGIN * 12 * GIB
    tuned, room = _trial0(0, wrapped=True)
    assert -PRIOR_MARGIN * 12 * GIB < room < 0 and room > plain_room
    assert tuned["cb_block_size"] == 256 and tuned["scheduler_type"] == "fifo"   # the defaults
    assert tuned["cb_max_batch_tokens"] != 5365
