"""Guided proposals: candidates filtered by the memory model, neighbours of the incumbent,
choices that never started avoided."""

import random

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.study import StudyDirection

from tuner.study.local_moves import incumbents, inert_knobs, neighbour
from tuner.study.proposals import GuidedSampler, guided
from tuner.study.record import TrialRecord

SPACE = {"x": IntDistribution(1, 128, log=True), "y": FloatDistribution(0.0, 1.0),
         "c": CategoricalDistribution([16, 128, 256])}


DISTS = {**SPACE, "kv_share": FloatDistribution(0.0, 1.0), "kv": IntDistribution(0, 100)}


def _record(params, outcome="ok", value=1.0):
    t = optuna.trial.create_trial(params=params, distributions={k: DISTS[k] for k in params},
                                  values=[value], user_attrs={"outcome": outcome})
    return TrialRecord.of(t)


def test_neighbour_moves_one_or_two_knobs_within_bounds():
    rng = random.Random(0)
    base = {"x": 16, "y": 0.5, "c": 16}
    for _ in range(200):
        n = neighbour(base, SPACE, rng)
        changed = [k for k in base if n[k] != base[k]]
        assert 1 <= len(changed) <= 2
        assert 1 <= n["x"] <= 128 and 0.0 <= n["y"] <= 1.0 and n["c"] in (16, 128, 256)


def test_incumbents_are_the_feasible_non_dominated_trials():
    a, b = _record({"x": 1}, value=3.0), _record({"x": 2}, value=5.0)
    failed = _record({"x": 3}, outcome="oom", value=9.0)
    assert [t.params["x"] for t in incumbents([a, b, failed], [StudyDirection.MAXIMIZE])] == [2]
    assert [t.params["x"] for t in incumbents([a, b], [StudyDirection.MINIMIZE])] == [1]


def _objective(trial):
    x = trial.suggest_int("x", 1, 128, log=True)
    y = trial.suggest_float("y", 0.0, 1.0)
    return x * y if x <= 8 else 0.0   # larger x runs out of memory


def test_proposals_prefer_candidates_that_fit():
    """Only x <= 8 fits: with the filter nearly every proposal fits, even the random start-up
    ones; plain TPE draws x log-uniformly at first (about 3 in 7 fit)."""
    slack_of = lambda trials: (lambda params: 8.0 - params["x"])  # noqa: E731
    sampler = GuidedSampler(optuna.samplers.TPESampler(seed=1, multivariate=True,
                                                       n_startup_trials=10), slack_of, 10, seed=1)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({"x": 4, "y": 0.5})
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study.optimize(_objective, n_trials=30)
    fits = sum(t.params["x"] <= 8 for t in study.trials[1:])
    assert fits >= 21   # plain TPE, same seed: 18


def test_random_and_grid_are_left_alone():
    rnd = optuna.samplers.RandomSampler(seed=0)
    assert guided(rnd, None, 10, 0) is rnd
    assert isinstance(guided(optuna.samplers.TPESampler(seed=0), None, 10, 0), GuidedSampler)


def test_the_kv_share_is_never_inert_and_a_knob_moved_with_the_pool_is_not_judged_alone():
    a = _record({"x": 4, "kv_share": 0.2, "kv": 40}, value=2.0)
    b = _record({"x": 4, "kv_share": 0.5, "kv": 70}, value=2.0)   # only the pool moved
    c = _record({"x": 8, "kv_share": 0.5, "kv": 50}, value=2.0)   # x moved, and the pool too
    assert inert_knobs([a, b, c], ["x", "kv_share"]) == set()


def test_a_stepped_float_moves_on_its_grid():
    dist = FloatDistribution(0.5, 0.95, step=0.01)
    rng = random.Random(1)
    for _ in range(100):
        moved = neighbour({"f": 0.8}, {"f": dist}, rng)["f"]
        assert dist._contains(dist.to_internal_repr(moved)), moved


def test_a_knob_whose_change_alone_changed_nothing_is_inert():
    a = _record({"x": 4, "y": 0.5, "c": 16}, value=2.0)
    b = _record({"x": 4, "y": 0.5, "c": 256}, value=2.0)     # only c moved, same value
    c = _record({"x": 8, "y": 0.5, "c": 16}, value=4.0)      # x matters
    assert inert_knobs([a, b, c], ["x", "y", "c"]) == {"c"}
    rng = random.Random(0)
    for _ in range(50):
        assert neighbour(a.params, SPACE, rng, inert={"c"})["c"] == 16


def test_candidates_the_memory_filter_rejected_are_kept_for_the_record():
    slack_of = lambda trials: (lambda params: 8.0 - params["x"])  # noqa: E731
    sampler = GuidedSampler(optuna.samplers.TPESampler(seed=3, multivariate=True), slack_of, 10,
                            seed=3)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study.optimize(_objective, n_trials=10)
    assert sampler.turned_away and all(p["x"] > 8 for p in sampler.turned_away)


def test_of_tied_incumbents_the_one_with_the_largest_pool_is_searched_from():
    """A copy of the best config at a pool that made no difference ties with it: searching
    from both would spend the local moves on two versions of one place.  The one with the
    larger pool is kept (its flips run there); without a pool knob, the first."""
    from tuner.study.local_moves import distinct

    trials = []
    for number, y, kv in ((7, 0.9, 2000), (3, 0.5, 1000), (9, 0.7, 1000)):
        t = optuna.trial.create_trial(params={"x": 4, "y": y, "kv": kv}, values=[2.0],
                                      distributions={"x": DISTS["x"], "y": DISTS["y"],
                                                     "kv": IntDistribution(1, 4096)})
        t.number = number
        trials.append(TrialRecord.of(t))
    assert [t.number for t in distinct(trials, "kv")] == [7]
    assert [t.number for t in distinct(trials, None)] == [3]


def test_a_choice_no_launched_trial_had_is_tried_as_a_flip_of_the_incumbent():
    from tuner.study.flips import untried_flips

    ran = _record({"x": 4, "y": 0.5, "c": 16})
    skipped = _record({"x": 4, "y": 0.5, "c": 128}, outcome="skipped")   # never launched
    flips = untried_flips(ran.params, [ran, skipped], SPACE)
    assert flips == [{"x": 4, "y": 0.5, "c": 128}, {"x": 4, "y": 0.5, "c": 256}]
    launched = _record({"x": 8, "y": 0.1, "c": 256}, outcome="oom")
    assert untried_flips(ran.params, [ran, launched], SPACE) == [{"x": 4, "y": 0.5, "c": 128}]


def _choices_tried(startup: int, n_trials: int) -> list[int]:
    """The `c` of every trial of a guided study whose memory model says only c = 16 fits
    (TPE kept in its start-up, so the draws come from the start-up design)."""
    slack_of = lambda trials: (lambda params: 1.0 if params["c"] == 16 else -1.0)  # noqa: E731
    base = optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=100)
    study = optuna.create_study(direction="maximize",
                                sampler=GuidedSampler(base, slack_of, startup, seed=0))
    study.enqueue_trial({"x": 4, "y": 0.5, "c": 16})
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study.optimize(lambda t: t.suggest_int("x", 1, 128, log=True) * t.suggest_float("y", 0, 1)
                   + 0 * t.suggest_categorical("c", [16, 128, 256]), n_trials=n_trials)
    return [t.params["c"] for t in study.trials]


def test_the_memory_filter_does_not_hide_a_choice_that_was_never_launched():
    """The filter keeps every draw at 16; the local moves try each other choice exactly once,
    as a flip of the incumbent."""
    tried = _choices_tried(startup=4, n_trials=16)
    assert tried.count(128) == 1 and tried.count(256) == 1


def test_a_pattern_move_repeats_the_step_of_the_last_improvement():
    from tuner.study.local_moves import pattern_move

    trials = []
    for number, (x, y, c, value) in enumerate([(4, 0.2, 16, 1.0), (2, 0.9, 16, 0.5),
                                               (8, 0.3, 128, 2.0)]):
        t = optuna.trial.create_trial(params={"x": x, "y": y, "c": c}, values=[value],
                                      distributions={k: SPACE[k] for k in ("x", "y", "c")},
                                      user_attrs={"outcome": "ok"})
        t.number = number
        trials.append(TrialRecord.of(t))
    move = pattern_move(trials, [StudyDirection.MAXIMIZE], SPACE)
    assert move["x"] == 16 and abs(move["y"] - 0.4) < 1e-9 and move["c"] == 128
    assert pattern_move(trials[:1], [StudyDirection.MAXIMIZE], SPACE) is None
    assert pattern_move(trials, [StudyDirection.MAXIMIZE] * 2, SPACE) is None


def test_a_choice_the_filter_hides_is_flipped_during_the_start_up_too():
    tried = _choices_tried(startup=100, n_trials=12)   # the whole study is start-up
    assert tried.count(128) == 1 and tried.count(256) == 1 and tried.index(128) < 8


class _Recording(optuna.samplers.TPESampler):
    """TPE that notes the trials it was asked to draw for."""

    def __init__(self) -> None:
        super().__init__(seed=0, multivariate=True, n_startup_trials=100)
        self.asked: list[int] = []

    def sample_relative(self, study, trial, search_space):
        self.asked.append(trial.number)
        return super().sample_relative(study, trial, search_space)


def _drawn_for(trials: int | None, n_trials: int) -> list[int]:
    base = _Recording()
    slack_of = lambda trials: (lambda params: 1.0)  # noqa: E731
    study = optuna.create_study(direction="maximize", sampler=GuidedSampler(
        base, slack_of, 2, seed=0, trials=trials))
    study.enqueue_trial({"x": 4, "y": 0.5, "c": 16})
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study.optimize(lambda t: t.suggest_int("x", 1, 128, log=True) * t.suggest_float("y", 0, 1)
                   + 0 * t.suggest_categorical("c", [16, 128, 256]), n_trials=n_trials)
    return base.asked


def test_the_last_third_of_the_budget_is_local_moves_only():
    """A global draw pays off through the local moves after it; in the last third of the
    measured trials there is no room left for those, so every turn is a local one."""
    assert [n for n in _drawn_for(None, 12) if n >= 8] == [9, 11]   # alternating
    assert [n for n in _drawn_for(12, 12) if n >= 8] == []          # 12 - 12 // 3 = 8 on
    assert 5 in _drawn_for(12, 12)


def test_a_local_turn_with_no_local_move_falls_back_to_the_wrapped_sampler():
    """Without a healthy run there is no incumbent and no move from one: a turn in the last
    third then goes to the wrapped sampler, a draw over the whole space."""
    base = _Recording()
    study = optuna.create_study(direction="maximize", sampler=GuidedSampler(
        base, lambda trials: (lambda params: 1.0), 2, seed=0, trials=12))

    def dies(t: optuna.Trial) -> float:     # every config runs out of memory
        t.suggest_int("x", 1, 128, log=True), t.suggest_float("y", 0, 1)
        t.suggest_categorical("c", [16, 128, 256])
        t.set_user_attr("outcome", "oom")
        return 0.0
    study.optimize(dies, n_trials=12)
    assert [n for n in base.asked if n >= 8] == [8, 9, 10, 11]
    assert all(set(t.params) == {"x", "y", "c"} for t in study.trials)


def test_a_choice_never_launched_waits_its_turn_unless_the_filter_hid_it():
    """Only a choice the memory filter turned away jumps the queue of flips: one that the few
    draws so far just did not happen to launch is ranked with the rest, and the two-way knob
    goes first (on the Qwen2.5-7B / H100 scenario of benchmarks/search_efficiency.py, 10-trial
    studies spent their three local turns on never-launched choices of flat knobs while the
    CUDA-graph flip waited)."""
    space = {**SPACE, "b": CategoricalDistribution([False, True])}
    base = optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=100)
    sampler = GuidedSampler(base, lambda trials: (lambda params: 1.0), 2, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for params, value in (({"x": 4, "y": 0.5, "c": 16, "b": False}, 2.0),
                          ({"x": 8, "y": 0.1, "c": 16, "b": True}, 1.0)):
        study.add_trial(optuna.trial.create_trial(params=params, distributions=space,
                                                  values=[value], user_attrs={"outcome": "ok"}))
    assert study.ask(space).params == {"x": 4, "y": 0.5, "c": 16, "b": True}
    sampler.turned_away.append({"x": 2, "y": 0.5, "c": 256, "b": False})
    for _ in range(2):   # local moves come at even trial numbers: 4
        study.tell(study.trials[-1].number, state=optuna.trial.TrialState.FAIL)
        asked = study.ask(space)
    assert asked.number == 4 and asked.params == {"x": 4, "y": 0.5, "c": 256, "b": False}


def test_a_run_that_missed_the_slo_above_the_incumbent_is_repaired_before_other_flips():
    """Once a flip showed that a choice misses the SLO at the incumbent, a run that carries
    that choice, missed the SLO and measured more than the incumbent is run with the winning
    choice, before any other flip (on the Llama-3.2-3B / A100 scenario of
    benchmarks/search_efficiency.py, caps-open corners with decode-first missed the TTFT SLO,
    and 10-trial studies then spent their turns on flips of an incumbent with a cap of 3)."""
    space = {**SPACE, "b": CategoricalDistribution([False, True])}
    base = optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=100)
    sampler = GuidedSampler(base, lambda trials: (lambda params: 1.0), 2, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    for params, value, outcome in (({"x": 128, "y": 0.9, "c": 256, "b": True}, 3.0, "slo"),
                                   ({"x": 4, "y": 0.5, "c": 16, "b": False}, 2.0, "ok"),
                                   ({"x": 4, "y": 0.5, "c": 16, "b": True}, 1.0, "slo")):
        study.add_trial(optuna.trial.create_trial(params=params, distributions=space,
                                                  values=[value], user_attrs={"outcome": outcome}))
    study.ask(space)   # trial 3: a draw
    study.tell(3, state=optuna.trial.TrialState.FAIL)
    asked = study.ask(space)
    assert asked.number == 4 and asked.params == {"x": 128, "y": 0.9, "c": 256, "b": False}
