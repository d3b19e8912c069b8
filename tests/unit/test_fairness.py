"""The delivery scheduler: credit and fairness between classes, without servers."""

from services.domain.fairness import Scheduler

CLASSES = ("high", "normal", "low")


def everything_ready(_item) -> bool:
    return True


def picks(s: Scheduler, n: int) -> list:
    out = []
    for _ in range(n):
        item = s.pick(everything_ready)
        if item is None:
            break
        s.handed()
        s.answered()  # answered at once: credit never runs out
        out.append(item)
    return out


def test_the_highest_class_first_each_in_arrival_order():
    s = Scheduler(CLASSES, prefetch=10)
    for item in ["n1", "l1", "n2", "h1", "h2"]:
        s.add({"h": "high", "n": "normal", "l": "low"}[item[0]], item)
    assert picks(s, 10) == ["h1", "h2", "n1", "n2", "l1"]


def test_with_every_class_waiting_each_lower_one_gets_one_in_fairness_picks():
    """High, normal and low all waiting: the middle class was never picked (the fairness pick
    always went to the lowest), so normal mail waited for as long as high and low had mail."""
    s = Scheduler(CLASSES, prefetch=10, fairness=10)
    for i in range(200):
        for cls in CLASSES:
            s.add(cls, (cls, i))
    got = [cls for cls, _ in picks(s, 100)]
    assert got.count("normal") >= 9 and got.count("low") >= 9, got
    for cls in ("normal", "low"):  # never more than fairness picks before its first, or between two of its own
        at = [i for i, c in enumerate(got) if c == cls]
        assert at[0] <= 10 and all(b - a <= 10 for a, b in zip(at, at[1:], strict=False)), (cls, at)


def test_a_waiting_lower_class_gets_one_in_fairness_picks():
    s = Scheduler(CLASSES, prefetch=10, fairness=4)
    for i in range(12):
        s.add("high", f"h{i}")
    s.add("low", "l0")
    s.add("low", "l1")
    got = picks(s, 14)
    assert got[:4] == ["h0", "h1", "h2", "l0"]
    assert got[4:8] == ["h3", "h4", "h5", "l1"]
    assert got[8:] == ["h6", "h7", "h8", "h9", "h10", "h11"]


def test_no_pick_without_credit_and_credit_comes_back_when_answered():
    s = Scheduler(CLASSES, prefetch=2)
    for i in range(3):
        s.add("normal", i)
    assert s.pick(everything_ready) == 0
    s.handed()
    assert s.pick(everything_ready) == 1
    s.handed()
    assert not s.has_credit() and s.pick(everything_ready) is None
    s.answered()
    assert s.pick(everything_ready) == 2


def test_a_dropped_pick_costs_no_credit_and_an_unready_head_blocks_its_class_only():
    s = Scheduler(CLASSES, prefetch=1)
    s.add("high", "slow")
    s.add("normal", "n")
    assert s.pick(lambda item: item != "slow") == "n"  # high's head still being prepared
    assert s.pick(lambda item: item != "slow") is None  # nothing else ready; no credit spent
    assert s.pick(everything_ready) == "slow"


def test_an_unknown_class_is_the_default_and_queued_lists_what_is_left():
    s = Scheduler(CLASSES, prefetch=5)
    s.add("urgent", "u")
    s.add("low", "l")
    assert list(s.queued()) == ["u", "l"]
    assert s.pick(everything_ready) == "u"
    assert list(s.queued()) == ["l"]
