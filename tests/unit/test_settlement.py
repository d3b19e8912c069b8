"""Which redelivered mail has its DELIVERED event written again when it is skipped: a mail marked
delivered, arriving in the copy its consumer answered (services/app/settlement.py ``delivered``
writes the event and the mark at once, so the mark may be there without the event)."""

import datetime as dt
import uuid

import pytest

from services.app.settlement import DEQUEUED, redelivered_after_success
from services.domain import model

NOW = dt.datetime(2026, 11, 29, 12, tzinfo=dt.timezone.utc)


def mail(generation: int) -> model.QueuedMail:
    return model.QueuedMail("q", uuid.uuid4(), NOW, model.Mail("n", "a@example.com", ("b@example.org",)), ("blob",), 10,
                            NOW, 0, generation=generation)


@pytest.mark.parametrize(("state", "generation", "again"), [
    # (every case a redelivered message: the broker gave it back)
    (None, 0, False),  # live: delivered as usual
    (model.MailState(reason=DEQUEUED, generation=0), 0, True),  # the copy answered SUCCESS
    (model.MailState(reason=DEQUEUED, generation=2), 1, False),  # an older copy (the mail was retried since)
    (model.MailState(reason="moved to other", generation=0), 0, False),  # moved, deleted by an operator: no DELIVERED
    (model.MailState(reason="dead-lettered: 550", generation=0), 0, False),
    (model.MailState(generation=1), 1, False),  # rescheduled, not gone
])
def test_only_the_copy_a_success_marked_writes_its_event_again(state, generation, again):
    assert redelivered_after_success(True, state, mail(generation)) is again


def test_a_message_that_never_went_back_writes_nothing_again():
    """A fresh copy (a republish, a duplicate): not the answered message given back."""
    assert not redelivered_after_success(False, model.MailState(reason=DEQUEUED), mail(0))
