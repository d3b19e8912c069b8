"""Event ids: the same change, the same id, in the form uuid5 gives (ids written before and after
the faster derivation must match, or a change carried out again would be kept twice)."""

import random
import string
import uuid

from services.domain import events as mail_events
from services.domain import model
from services.domain.events import EVENT_IDS, EventType, event_id, uuid5_text


def test_uuid5_text_is_uuid5_for_any_name():
    rng = random.Random(7)
    alphabet = string.printable + "éß漢|"
    names = ["", "|", "delivered|q|" + str(uuid.UUID(int=0)) + "|1|"]
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120))) for _ in range(2000)]
    for name in names:
        assert uuid5_text(name) == str(uuid.uuid5(EVENT_IDS, name)), name


def test_an_ids_inputs_are_kind_queue_mail_step_and_discriminator():
    mail_id = uuid.UUID("7d0f6c1e-3c1a-4b8e-9a51-0d9e3f1f2a10")
    assert event_id(EventType.DELIVERED, "q", mail_id, 2) == str(uuid.uuid5(EVENT_IDS, f"delivered|q|{mail_id}|2|"))
    assert event_id(EventType.DELIVERED, "q", mail_id, 2) != event_id(EventType.DELIVERED, "q", mail_id, 3)
    assert event_id(EventType.HANDED_OUT, "q", mail_id, 1, "2") != event_id(EventType.HANDED_OUT, "q", mail_id, 1, "1")


def test_a_deliverys_events_carry_the_attempt_under_way():
    now = model.utcnow()
    mail = model.QueuedMail("q", uuid.uuid4(), now, model.Mail(name="n", sender="a@example.com", recipients=("b@example.org",)),
                            ("a" * 64,), 10, now, 0, attempts=2)  # two RETRYs so far: the third attempt
    for e in (mail_events.handed_out(mail, 1), mail_events.delivered(mail), mail_events.rejected(mail, "550"),
              mail_events.retry_scheduled(mail, "451", now), mail_events.dead_lettered(mail, "x"), mail_events.expired(mail, "y")):
        assert e.attempt == 3, e.type
        assert e.id == event_id(e.type, "q", mail.enqueue_id, 3, "1" if e.type is EventType.HANDED_OUT else "")
    assert mail_events.enqueued(mail).attempt == 2  # not a delivery's: the mail's count as it is


def test_now_is_utc_at_whole_milliseconds_and_follows_the_clock():
    import datetime as dt
    import time

    from services.domain.model import utcnow

    # Given the clock read around a call
    before = time.time()
    now = utcnow()
    after = time.time()
    # Then it is UTC, at Cassandra's millisecond precision, and within that millisecond of the clock
    assert now.tzinfo is dt.timezone.utc and now.microsecond % 1000 == 0
    assert before - 0.001 <= now.timestamp() <= after
    # And whole milliseconds survive the float they pass through, over a range of instants
    for ms in (0, 1, 999, 1_796_555_063_744, 1_796_555_063_999, 4_102_444_800_001):
        assert dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).microsecond == ms % 1000 * 1000
