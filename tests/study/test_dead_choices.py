"""Dead choices: a categorical choice, or a pair, the server never started with."""

from optuna.distributions import CategoricalDistribution

from tests.study.test_flips import GRAPHS, _rec
from tests.study.test_proposals import SPACE, _record
from tuner.study.dead_choices import avoiding, dead_choices


def test_a_choice_that_never_started_is_dead_after_two_tries():
    tries = [_record({"c": 128}, outcome="startup")]
    assert dead_choices(tries, SPACE) == set()
    tries.append(_record({"c": 128}, outcome="startup"))
    assert dead_choices(tries, SPACE) == {(("c", 128),)}
    tries.append(_record({"c": 128}, outcome="ok"))   # it did start once: not the value's fault
    assert dead_choices(tries, SPACE) == set()


def test_a_failure_two_untried_choices_share_blames_neither():
    """c=128 failed twice, each time beside x=64, which never started either: either may be the
    cause.  Once c=128 fails beside a value that did start, it alone is to blame."""
    space = {"c": SPACE["c"], "x": CategoricalDistribution([1, 64])}
    tries = [_record({"c": 128, "x": 64}, outcome="startup") for _ in range(2)]
    tries.append(_record({"c": 16, "x": 1}))
    assert dead_choices(tries, space) == set()
    tries.append(_record({"c": 128, "x": 1}, outcome="startup"))
    assert dead_choices(tries, space) == {(("c", 128),)}
    tries.append(_record({"c": 16, "x": 64}))   # x=64 starts: c=128 was the only cause
    assert dead_choices(tries, space) == {(("c", 128),)}


def test_two_choices_that_never_started_together_are_a_dead_pair():
    """Block size 128 starts without graphs, graphs start with 16-token blocks; the two together
    failed twice (with other knobs changed): the pair is dead, each choice alone is not."""
    space = GRAPHS
    tries = [_rec({"x": 2, "c": 128, "g": False}), _rec({"x": 2, "c": 16, "g": True}),
             _rec({"x": 2, "c": 128, "g": True}, outcome="startup")]
    assert dead_choices(tries, space) == set()
    tries.append(_rec({"x": 5, "c": 128, "g": True}, outcome="startup"))
    dead = dead_choices(tries, space)
    assert dead == {(("c", 128), ("g", True))}
    fits = avoiding(dead, lambda params: 1.0)
    assert fits({"x": 9, "c": 128, "g": True}) == float("-inf")
    assert fits({"x": 9, "c": 128, "g": False}) == 1.0 and fits({"x": 9, "c": 16, "g": True}) == 1.0
    tries.append(_rec({"x": 7, "c": 128, "g": True}))   # the pair started once: not dead
    assert dead_choices(tries, space) == set()
