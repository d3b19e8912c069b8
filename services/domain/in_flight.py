"""The copies of mails being prepared or handed out by one dequeue process, one holder per mail.

A mail can have several broker messages at once: a RETRY or a hold publishes a newer generation
while the older message is still in the queue, and a stream that closes publishes again what it
never handed out. One copy per mail is worked on at a time; another copy that arrives meanwhile
is a duplicate (acked, skipped) **only if it is not newer** than the one held. A newer copy
replaces the holder: the older one is superseded, and skipping the newer one for it would leave
the mail live in the view with no message anywhere (#36: a RETRYed mail's new copy arrived while
the redelivered old copy was being judged, and both were acked).

A release names the generation it releases, so an older copy that finishes late never releases
the newer copy's hold.
"""

from __future__ import annotations

from collections.abc import Hashable


class InFlight:
    def __init__(self) -> None:
        self._held: dict[Hashable, int] = {}

    def claim(self, key: Hashable, generation: int) -> bool:
        """Hold ``key`` for the copy of ``generation``; False when a copy at least as new holds it."""
        held = self._held.get(key)
        if held is not None and held >= generation:
            return False
        self._held[key] = generation
        return True

    def release(self, key: Hashable, generation: int) -> None:
        """Release the hold of the copy of ``generation`` (a newer copy's hold stays)."""
        if self._held.get(key) == generation:
            del self._held[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._held

    def __len__(self) -> int:
        return len(self._held)
