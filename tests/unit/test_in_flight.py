"""services/domain/in_flight.py: one holder per mail, and a newer copy is never a duplicate."""

from services.domain.in_flight import InFlight


def test_a_copy_not_newer_than_the_one_held_is_a_duplicate():
    f = InFlight()
    assert f.claim(("q", 1), 0)
    assert not f.claim(("q", 1), 0)
    assert f.claim(("q", 2), 0)  # another mail


def test_a_newer_copy_replaces_the_holder_and_the_older_release_keeps_it():
    f = InFlight()
    assert f.claim(("q", 1), 0)  # the redelivered copy a RETRY superseded, being judged
    assert f.claim(("q", 1), 1)  # the RETRY's copy arrives meanwhile: not a duplicate
    assert not f.claim(("q", 1), 0)
    f.release(("q", 1), 0)  # the superseded copy is skipped: the newer copy's hold stays
    assert ("q", 1) in f and not f.claim(("q", 1), 1)
    f.release(("q", 1), 1)
    assert ("q", 1) not in f and len(f) == 0
