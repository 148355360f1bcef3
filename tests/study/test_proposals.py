

def test_a_knob_whose_change_alone_changed_nothing_is_inert():
    a = _record({"x": 4, "y": 0.5, "c": 16}, value=2.0)
    b = _record({"x": 4, "y": 0.5, "c": 256}, value=2.0)     # only c moved, same value
    c = _record({"x": 8, "y": 0.5, "c": 16}, value=4.0)      # x matters
    assert inert_knobs([a, b, c], ["x", "y", "c"]) == {"c"}
    rng = random.Random(0)
    for _ in range(50):
        assert neighbour(a.params, SPACE, rng, inert={"c"})["c"] == 16
