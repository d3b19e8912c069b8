"""Which delivery a consumer gets next: credit and fairness between delivery classes, pure.

A consumer holds at most ``prefetch`` deliveries unanswered (its credit). Among the deliveries
ready to hand out, the highest class goes first (high, normal, low), each class in arrival order;
each lower class that waits gets one delivery in ``fairness`` at the least, so none is starved
(with all three waiting: high, then normal and low in turn).
Items are whatever the caller queues (a subscription queues its deliveries being prepared): the
scheduler asks ``ready(item)`` of the head of each class and never looks inside.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

#: A waiting lower class gets at least one delivery in this many.
FAIRNESS = 10


class Scheduler(Generic[T]):
    def __init__(self, classes: tuple[str, ...], prefetch: int, fairness: int = FAIRNESS, default: str = "normal") -> None:
        self._classes: dict[str, collections.deque[T]] = {c: collections.deque() for c in classes}
        self._default = default
        self.prefetch = prefetch
        self._fairness = fairness
        #: Per class, the picks in a row that went to another class while it waited.
        self._passed: dict[str, int] = dict.fromkeys(classes, 0)
        #: Handed out and not answered yet.
        self.unanswered = 0

    def add(self, cls: str, item: T) -> None:
        """Queue ``item`` at the end of its class (an unknown class is the default one)."""
        self._classes[cls if cls in self._classes else self._default].append(item)

    def has_credit(self) -> bool:
        return self.unanswered < self.prefetch

    def pick(self, ready: Callable[[T], bool]) -> T | None:
        """The next item to hand out, taken off its class; None without credit or when no class's
        head is ready. The caller counts a handed-out item with ``handed`` (an item it drops,
        e.g. a delivery that turned out to be skipped, costs no credit)."""
        if not self.has_credit():
            return None
        waiting = [c for c, items in self._classes.items() if items and ready(items[0])]
        if not waiting:
            return None
        starved = [c for c in waiting[1:] if self._passed[c] >= self._fairness - 1]
        chosen = max(starved, key=self._passed.__getitem__) if starved else waiting[0]  # the longest passed; a tie: the higher
        for c in self._passed:
            self._passed[c] = self._passed[c] + 1 if c in waiting and c != chosen else 0
        return self._classes[chosen].popleft()

    def handed(self) -> None:
        self.unanswered += 1

    def answered(self) -> None:
        self.unanswered -= 1

    def queued(self) -> Iterator[T]:
        """Every item still queued, class by class."""
        for items in self._classes.values():
            yield from items
