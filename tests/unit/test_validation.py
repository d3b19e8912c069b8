import dataclasses
import datetime as dt

import pytest

from services.domain import validation
from services.domain.errors import InvalidArgument, ResourceExhausted
from services.domain.model import Header, Mail, PerRecipientHeaders
from services.domain.settings import LimitSettings

LIMITS = LimitSettings()
OK = Mail(name="m", sender="alice@example.com", recipients=("bob@example.org",))


@pytest.mark.parametrize("name", ["spool", "outgoing.retry-1", "A_b", "9", "q" * 100])
def test_valid_queue_names(name):
    assert validation.queue_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", ".x", "a b", "a/b", "é", "q" * 101])
def test_invalid_queue_names(name):
    with pytest.raises(InvalidArgument, match="queue name"):
        validation.queue_name(name)


@pytest.mark.parametrize("name", ["orders.dead-letter", "delay.0", "delay.27", "delay.deliver", "delay.unroutable", "alarm-probe"])
def test_names_of_the_brokers_own_exchanges_are_no_new_queues(name):
    assert validation.queue_name(name) == name  # an existing queue of that name is still served
    with pytest.raises(InvalidArgument, match="reserved"):
        validation.new_queue_name(name)


@pytest.mark.parametrize("name", ["dead-letter", "orders.dead-letters", "delay", "delay.x", "delay.1a", "alarm-probes", "my.delay.1"])
def test_names_beside_the_reserved_ones_are_new_queues(name):
    assert validation.new_queue_name(name) == name


@pytest.mark.parametrize(
    "address",
    ["a@b.c", "first.last+tag@sub.example.com", '"quoted local"@example.com', "x@[127.0.0.1]", "postmaster@localhost"],
)
def test_valid_addresses(address):
    assert validation.address(address, "sender") == address


@pytest.mark.parametrize(
    "address", ["", "plain", "@example.com", "a@", "a@@b", "a b@c.d", "a@b..c", "a@-b.c", "a.@b.c", ("x" * 65) + "@b.c",
                '"\x1b]0;x\x07"@example.com', '"a\x00b"@example.com', '"a\x7fb"@example.com', '"a\\\x01"@example.com',
                '"\u00e9"@example.com', '"a\nb"@example.com']
)
def test_invalid_addresses(address):
    with pytest.raises(InvalidArgument, match="not a valid mail address"):
        validation.address(address, "sender")


def test_null_sender_is_allowed():
    assert validation.mail(dataclasses.replace(OK, sender=""), LIMITS)


def test_a_mail_needs_a_recipient():
    with pytest.raises(InvalidArgument, match="at least one recipient"):
        validation.mail(dataclasses.replace(OK, recipients=()), LIMITS)


def test_every_recipient_is_checked():
    with pytest.raises(InvalidArgument, match=r"recipients\[1\]"):
        validation.mail(dataclasses.replace(OK, recipients=("a@b.c", "nope")), LIMITS)


def test_attribute_limits():
    small = dataclasses.replace(LIMITS, max_attributes=2, max_attribute_bytes=10)
    with pytest.raises(ResourceExhausted, match="attributes exceed"):
        validation.mail(dataclasses.replace(OK, attributes={"a": "1", "b": "2", "c": "3"}), small)
    with pytest.raises(ResourceExhausted, match="over the limit of 10"):
        validation.mail(dataclasses.replace(OK, attributes={"a": "x" * 10}), small)
    assert validation.mail(dataclasses.replace(OK, attributes={"a": "1", "b": "2"}), small)


def test_recipient_count_limit():
    with pytest.raises(ResourceExhausted):
        validation.mail(
            dataclasses.replace(OK, recipients=tuple(f"r{i}@x.y" for i in range(3))),
            dataclasses.replace(LIMITS, max_recipients=2),
        )


def test_per_recipient_headers_must_name_a_recipient_and_be_well_formed():
    stranger = PerRecipientHeaders("eve@example.net", (Header("X-A", "1"),))
    with pytest.raises(InvalidArgument, match="not a recipient"):
        validation.mail(dataclasses.replace(OK, per_recipient_headers=(stranger,)), LIMITS)
    bad_name = PerRecipientHeaders("bob@example.org", (Header("X:A", "1"),))
    with pytest.raises(InvalidArgument, match="header name"):
        validation.mail(dataclasses.replace(OK, per_recipient_headers=(bad_name,)), LIMITS)
    folded = PerRecipientHeaders("bob@example.org", (Header("X-A", "1\r\n 2"),))
    with pytest.raises(InvalidArgument, match="line break"):
        validation.mail(dataclasses.replace(OK, per_recipient_headers=(folded,)), LIMITS)


@pytest.mark.parametrize("name", ["X\tA", "X\x00A", "Ünïcode", "X A"])
def test_header_names_are_printable_ascii(name):
    h = PerRecipientHeaders("bob@example.org", (Header(name, "1"),))
    with pytest.raises(InvalidArgument, match="header name"):
        validation.mail(dataclasses.replace(OK, per_recipient_headers=(h,)), LIMITS)


def test_per_recipient_headers_count_their_recipient_in_the_metadata_bytes():
    # 2,000 one-letter headers of one 312-character recipient: 2 KB of names and values, and a row
    # of 640 KB (the recipient is stored with each header). Counted as stored, over the 512 KiB limit.
    long = "r" * 60 + "@" + ".".join(["d" * 60] * 4) + ".example"  # 312 characters, a valid address
    mail = dataclasses.replace(OK, recipients=(long,), per_recipient_headers=(
        PerRecipientHeaders(long, tuple(Header("a", "") for _ in range(2000))),))
    with pytest.raises(ResourceExhausted, match="metadata"):
        validation.mail(mail, LIMITS)


def test_blob_ids_are_sha256_hex():
    assert validation.blob_id("a" * 64)
    for bad in ("A" * 64, "a" * 63, "g" * 64, ""):
        with pytest.raises(InvalidArgument):
            validation.blob_id(bad)


@pytest.mark.parametrize("check,value", [
    (validation.queue_name, "demo\n"), (lambda v: validation.address(v, "sender"), "a@example.org\n"),
    (validation.blob_id, "a" * 64 + "\n"),
])
def test_a_trailing_newline_is_refused(check, value):
    with pytest.raises(InvalidArgument):
        check(value)


def test_echoed_values_are_truncated():
    with pytest.raises(InvalidArgument) as e:
        validation.queue_name("q" * 10240)
    assert len(str(e.value)) < 300 and "(10242 characters)" in str(e.value)


T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
S = dt.timedelta(seconds=1)


def test_a_producer_schedule_in_the_past_is_now_and_beyond_a_year_is_refused():
    assert validation.deliver_at(T0, T0 - S) is None
    assert validation.deliver_at(T0, delay=-S) is None
    assert validation.deliver_at(T0, delay=10 * S) == T0 + 10 * S
    with pytest.raises(InvalidArgument, match="ahead"):
        validation.deliver_at(T0, T0 + dt.timedelta(days=367))


def test_a_mail_name_is_at_most_4096_bytes_of_utf8():
    validation.mail(dataclasses.replace(OK, name="x" * 4096), LIMITS)
    with pytest.raises(InvalidArgument, match="mail name is 4098 bytes"):
        validation.mail(dataclasses.replace(OK, name="é" * 2049), LIMITS)


def test_blob_refs_are_at_most_1000_each_a_blob_id():
    validation.blob_refs(["a" * 64] * 1000)
    with pytest.raises(InvalidArgument, match="1001 blobs"):
        validation.blob_refs(["a" * 64] * 1001)
    with pytest.raises(InvalidArgument, match="blob id"):
        validation.blob_refs(["A" * 64])
