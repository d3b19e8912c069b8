"""The operator rules in force as this process sees them: read at most every ``REFRESH_S``, a
matching rule read again before it is applied (the rules themselves: services/domain/rules.py)."""

from __future__ import annotations

import time

from services.app.shared_reads import SharedReads
from services.domain import model, rules
from services.ports.view import Rules


class RuleBook:
    """The rules in force, as this process last read them (at most ``REFRESH_S`` old)."""

    def __init__(self, rules: Rules, refresh_s: float = rules.REFRESH_S) -> None:
        self._store = rules
        self._refresh_s = refresh_s
        self._read_at = -1e9
        self._rules: list[model.Rule] = []
        #: The read under way: callers that find the rules stale meanwhile wait for it, rather than
        #: each reading them (a stream's first deliveries, prepared at once, were a read each).
        self._reads = SharedReads()
        #: Bumped by ``forget``: a read begun before it neither answers later callers nor is kept.
        self._generation = 0

    async def current(self) -> list[model.Rule]:
        found = self._rules
        if time.monotonic() - self._read_at > self._refresh_s:
            found = await self._reads.get("rules", lambda: self._read(self._generation))
        now = model.utcnow()
        return [r for r in found if r.expires_at > now]

    async def first_match(self, q: model.QueuedMail) -> model.Rule | None:
        """The bounce rule matching the mail, else the hold rule matching it, else None.

        A cached rule that matches is read again before it is applied: a rule lifted a moment
        ago (whose released mails are on their way) never holds or bounces anything.
        """
        for _ in range(2):
            matching = [r for r in await self.current() if rules.matches(r, q)]
            found = next((r for kind in ("bounce", "hold") for r in matching if r.kind == kind), None)
            if found is None or await self._store.get(found.rule_id) is not None:
                return found
            self.forget()  # lifted since this process read it
        return None

    async def _read(self, generation: int) -> list[model.Rule]:
        found = await self._store.all()
        if generation == self._generation:  # not forgotten meanwhile: kept
            self._rules, self._read_at = found, time.monotonic()
        return found

    def forget(self) -> None:
        """Read the rules again at the next ask: a read under way now may predate a change."""
        self._read_at = -1e9
        self._generation += 1
        self._reads.forget("rules")
