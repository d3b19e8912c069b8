"""One owner per delivery: the dequeue side hands out a claim on a mail's copy, and only the
claim gives it back (services/domain/in_flight.py says which copy may hold a mail).

A subscription takes a claim when it starts preparing a message and keeps it on the delivery; the
claim is released once, by whichever step ends the delivery (skipped, settled, returned, closed):
a second release is a no-op, and no step can release a claim it does not hold. A RETRY keeps
its claim until it has recorded the newer copy it published: that copy, newer, takes the mail
over if it arrives at once (services/domain/in_flight.py).
"""

from __future__ import annotations

import uuid

from services.domain.in_flight import InFlight


class Claim:
    __slots__ = ("_held", "_key", "_generation")

    def __init__(self, held: InFlight, key: tuple[str, uuid.UUID], generation: int) -> None:
        self._held: InFlight | None = held
        self._key, self._generation = key, generation

    def release(self) -> None:
        """Give the mail back (idempotent): another copy may be claimed from now on."""
        if self._held is not None:
            self._held.release(self._key, self._generation)
            self._held = None

    @property
    def released(self) -> bool:
        return self._held is None


class Claims:
    """The copies this process is preparing or has handed out, one claim per mail."""

    def __init__(self) -> None:
        self._held = InFlight()

    def take(self, queue: str, enqueue_id: uuid.UUID, generation: int) -> Claim | None:
        """A claim on the mail for this copy; None when a copy at least as new holds it."""
        key = (queue, enqueue_id)
        if not self._held.claim(key, generation):
            return None
        return Claim(self._held, key, generation)

    def __len__(self) -> int:
        return len(self._held)
