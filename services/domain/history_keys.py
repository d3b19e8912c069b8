"""Enqueue ids, and the history partition each one names (docs/pages/concepts/events.md).

The mails of one enqueue group get ids that share their last 96 bits: a random tail, drawn once
per at most ``PER_KEY`` mails, and 32 random bits of their own in front (distinct within the
group). The tail, with the first 32 bits zeroed, is the mail's *history key*: the partition of
``mail_history_groups_v1`` that holds the events of every mail of the group. So the events of a
change to many mails (a group enqueued, a batch handed out and answered) are a few rows, one per
key, rather than one row per event; and a mail's history is still one partition read, found from
its id alone, at any depth and any history size.

The part a mail has of its own comes first, so ids still differ in their first characters: the
8-character prefixes ``mailq`` prints and accepts tell the mails of a group apart as before. Any
UUID has a key: an id made elsewhere (a moved copy's, a keyed mail's claimed id) is a group of
one. The ids stay version-4 UUIDs (the version and variant bits are in the shared tail), so
nothing in the contract changes.
"""

from __future__ import annotations

import random
import uuid

#: Mails whose ids share one tail, at most: bounds a history partition (a few events each).
PER_KEY = 256
_OWN_BITS = 32
_TAIL = (1 << (128 - _OWN_BITS)) - 1
_random = random.SystemRandom()


def new_ids(n: int) -> list[uuid.UUID]:
    """``n`` new enqueue ids, in groups of at most PER_KEY sharing a history key."""
    out: list[uuid.UUID] = []
    for start in range(0, n, PER_KEY):
        tail = uuid.uuid4().int & _TAIL
        out.extend(uuid.UUID(int=own << (128 - _OWN_BITS) | tail)
                   for own in _random.sample(range(1 << _OWN_BITS), min(PER_KEY, n - start)))
    return out


def history_key(enqueue_id: uuid.UUID) -> uuid.UUID:
    """The history partition of a mail: its id with its own (first) 32 bits zeroed."""
    return uuid.UUID(int=history_key_int(enqueue_id))


def history_key_int(enqueue_id: uuid.UUID) -> int:
    """``history_key`` as its integer: what a writer groups by, making the UUID once per key."""
    return enqueue_id.int & _TAIL
