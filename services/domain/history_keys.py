"""Enqueue ids, and the history partition each one names (docs/pages/concepts/events.md).

The mails of one enqueue group get ids that share their first 96 bits: a random prefix, drawn
once per at most ``PER_KEY`` mails, and 32 random bits of their own (distinct within the
prefix). The prefix, with the low 32 bits zeroed, is the mail's *history key*: the partition of
``mail_history_groups_v1`` that holds the events of every mail of the group. So the events of a
change to many mails (a group enqueued, a batch handed out and answered) are a few rows, one per
key, rather than one row per event; and a mail's history is still one partition read, found from
its id alone, at any depth and any history size.

Any UUID has a key: an id made elsewhere (a moved copy's, a keyed mail's claimed id) is a group
of one. The ids stay version-4 UUIDs, 90 random bits of prefix (unique across groups) and 32
per mail, so nothing in the contract changes.
"""

from __future__ import annotations

import random
import uuid

#: Mails whose ids share one prefix, at most: bounds a history partition (a few events each).
PER_KEY = 256
_LOW = (1 << 32) - 1
_random = random.SystemRandom()


def new_ids(n: int) -> list[uuid.UUID]:
    """``n`` new enqueue ids, in groups of at most PER_KEY sharing a history key."""
    out: list[uuid.UUID] = []
    for start in range(0, n, PER_KEY):
        prefix = uuid.uuid4().int & ~_LOW
        out.extend(uuid.UUID(int=prefix | low) for low in _random.sample(range(1 << 32), min(PER_KEY, n - start)))
    return out


def history_key(enqueue_id: uuid.UUID) -> uuid.UUID:
    """The history partition of a mail: its id with the low 32 bits zeroed."""
    return uuid.UUID(int=enqueue_id.int & ~_LOW)
