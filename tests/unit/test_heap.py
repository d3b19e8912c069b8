"""The collector once start-up is done (services/runtime/heap.py): frozen once, spaced out."""

from __future__ import annotations

import gc
import weakref

import pytest

from services.runtime import heap


@pytest.fixture
def restored(monkeypatch):
    before = gc.get_threshold()
    monkeypatch.setattr(heap, "_settled", False)
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_settle_freezes_what_exists_and_spaces_out_the_collections(restored):
    kept = [[i] for i in range(1000)]  # tracked objects that outlive start-up
    assert heap.settle() is True
    assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold() == (heap.YOUNG, heap.MIDDLE, heap.OLD)


def test_settle_runs_once_per_process(restored):
    assert heap.settle() is True
    frozen = gc.get_freeze_count()
    made_since = [[i] for i in range(10_000)]
    assert heap.settle() is False  # a reconnection later does not freeze what the service made since
    # Frozen objects freed meanwhile (by another thread of the test session) lower the count; a
    # second freeze would raise it by the 10,000 lists at least.
    assert gc.get_freeze_count() < frozen + len(made_since)
    del made_since


def test_a_cycle_made_after_settling_is_still_collected(restored):
    heap.settle()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None


def test_each_collection_is_counted_by_generation():
    heap.count_pauses()
    heap.count_pauses()  # once per process, however often it is called
    assert gc.callbacks.count(heap._on_collection) == 1
    before = heap.PAUSES.labels("2")._value.get()
    gc.collect()
    assert heap.PAUSES.labels("2")._value.get() > before
