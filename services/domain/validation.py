"""Input rules, checked before anything is written (pure functions, unit-tested).

Each rule raises InvalidArgument or ResourceExhausted with a message that names the field and
the limit, so a producer knows what to fix.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid

from services.domain.delays import MAX_DELAY
from services.domain.durations import human
from services.domain.errors import InvalidArgument, ResourceExhausted
from services.domain.model import NULL_SENDER, Mail
from services.domain.settings import LimitSettings

QUEUE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
#: A quoted local part holds printable ASCII only (RFC 5321 qtextSMTP and quoted-pairSMTP): no
#: control character (a terminal escape in ``mailq``'s output, a NUL in a relay's), no DEL.
_LOCAL = rf"(?:{_ATOM}(?:\.{_ATOM})*|\"(?:[ !#-\[\]-~]|\\[ -~])+\")"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\]|\[IPv6:[0-9A-Fa-f:.]+\])"
ADDRESS = re.compile(rf"{_LOCAL}@{_DOMAIN}")
DOMAIN = re.compile(_DOMAIN)
BLOB_ID = re.compile(r"[0-9a-f]{64}")
#: Longest mail name, in UTF-8 bytes: a name is a term of the view's index on names (Cassandra
#: refuses a term over 8 KiB) and a key of the history's name index, what GetMailHistory and
#: ``mailq trace --name`` look up.
MAX_NAME_BYTES = 4096
#: Most blobs one mail's content may be made of (Enqueue's ``blob_refs``).
MAX_BLOB_REFS = 1000
#: Longest piece of a client's value echoed in an error message (gRPC metadata is limited to 8 KiB).
SHOWN_CHARS = 80


def shown(value: object) -> str:
    """``repr`` of a client's value for an error message, truncated: never echo unbounded input."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}...({len(text)} characters)"


def queue_name(name: str) -> str:
    if not QUEUE_NAME.fullmatch(name or ""):
        raise InvalidArgument(
            f"queue name {shown(name)} is invalid: 1 to 100 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"
        )
    return name


#: Names a new queue may not take: its exchange (``mailqueue.<name>``, services/domain/names.py)
#: would be one the suite declares already, with another type: another queue's dead-letter
#: exchange, a level of the delay ladder, or the alarm probe.
RESERVED_QUEUE_NAME = re.compile(r".*\.dead-letter|delay\.(?:[0-9]+|deliver|unroutable)|alarm-probe")


def new_queue_name(name: str) -> str:
    """A name a queue may be created under: a queue name (``queue_name``), not reserved."""
    queue_name(name)
    if RESERVED_QUEUE_NAME.fullmatch(name):
        raise InvalidArgument(
            f"queue name {shown(name)} is reserved: a name ending in .dead-letter, delay.<level>, delay.deliver, "
            "delay.unroutable and alarm-probe name the broker's own exchanges; pick another name"
        )
    return name


def address(value: str, field: str) -> str:
    if len(value) > 320 or not ADDRESS.fullmatch(value) or len(value.rsplit("@", 1)[0]) > 64:
        raise InvalidArgument(f"{field} {shown(value)} is not a valid mail address (local@domain, at most 320 characters)")
    return value


def domain(value: str, field: str) -> str:
    """A mail domain as recipients' addresses have it (an address literal too), lower-cased."""
    if len(value) > 255 or not DOMAIN.fullmatch(value):
        raise InvalidArgument(f"{field} {shown(value)} is not a domain name (letters, digits, '-' and '.', "
                              "or an address literal: [192.0.2.1])")
    return value.lower()


def blob_id(value: str) -> str:
    if not BLOB_ID.fullmatch(value or ""):
        raise InvalidArgument(f"blob id {shown(value)} is invalid: expected 64 lowercase hex characters (SHA-256)")
    return value


def blob_refs(ids: tuple[str, ...] | list[str]) -> None:
    """The blob ids a mail's content is made of: at most MAX_BLOB_REFS, each a blob id."""
    if len(ids) > MAX_BLOB_REFS:
        raise InvalidArgument(f"blob_refs names {len(ids)} blobs, over the limit of {MAX_BLOB_REFS}: "
                              "put the content as fewer, larger blobs (or stream it with EnqueueStream)")
    for b in ids:
        blob_id(b)


def enqueue_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError):
        raise InvalidArgument(f"enqueue id {shown(value)} is not a UUID") from None


def mail(m: Mail, limits: LimitSettings) -> Mail:
    """Check a producer's mail against the rules and limits; return it unchanged."""
    if len(m.name.encode()) > MAX_NAME_BYTES:
        raise InvalidArgument(f"mail name is {len(m.name.encode())} bytes, over the limit of {MAX_NAME_BYTES}")
    if m.sender != NULL_SENDER:
        address(m.sender, "sender")
    if not m.recipients:
        raise InvalidArgument("a mail needs at least one recipient")
    if len(m.recipients) > limits.max_recipients:
        raise ResourceExhausted(f"{len(m.recipients)} recipients exceed the limit of {limits.max_recipients}")
    for i, r in enumerate(m.recipients):
        address(r, f"recipients[{i}]")
    if len(m.attributes) > limits.max_attributes:
        raise ResourceExhausted(f"{len(m.attributes)} attributes exceed the limit of {limits.max_attributes}")
    for k, v in m.attributes.items():
        if not k:
            raise InvalidArgument("attribute names must not be empty")
        if _controls(k):
            raise InvalidArgument(f"attribute name {shown(k)} has a control character")
        size = len(k.encode()) + len(v.encode())
        if size > limits.max_attribute_bytes:
            raise ResourceExhausted(
                f"attribute {shown(k)} is {size} bytes, over the limit of {limits.max_attribute_bytes}"
            )
    recipients = set(m.recipients)
    for prh in m.per_recipient_headers:
        if prh.recipient not in recipients:
            raise InvalidArgument(f"per-recipient headers name {shown(prh.recipient)}, which is not a recipient")
        for h in prh.headers:
            if not h.name or any(not 33 <= ord(c) <= 126 or c == ":" for c in h.name):  # RFC 5322 field names
                raise InvalidArgument(f"header name {shown(h.name)} is invalid: printable ASCII without ':' or spaces")
            if "\r" in h.value or "\n" in h.value:
                raise InvalidArgument(f"header {shown(h.name)} has a line break in its value (send it unfolded)")
            if _controls(h.value, tab=True):
                raise InvalidArgument(f"header {shown(h.name)} has a control character in its value (NUL, ESC, ...)")
    if _controls(m.name):  # it is printed by mailq, matched by rules and shown in logs
        raise InvalidArgument(f"mail name {shown(m.name)} has a control character")
    metadata = metadata_bytes(m)
    if metadata > limits.max_metadata_bytes:
        raise ResourceExhausted(f"mail metadata is {metadata} bytes, over the limit of {limits.max_metadata_bytes}")
    return m


def metadata_bytes(m: Mail) -> int:
    """A mail's metadata, in bytes as stored (its envelope's addresses aside): what
    ``max_metadata_bytes`` bounds. A per-recipient header's row holds its recipient too (each
    header of a long address, counted by its name and value alone, made a row many times the limit)."""
    metadata = sum(len(s.encode()) for s in (m.name, m.state, m.error_message, m.remote_host, m.remote_addr))
    metadata += sum(len(k.encode()) + len(v.encode()) for k, v in m.attributes.items())
    return metadata + sum(len(p.recipient.encode()) + len(h.name.encode()) + len(h.value.encode())
                          for p in m.per_recipient_headers for h in p.headers)


def _controls(text: str, tab: bool = False) -> bool:
    """Whether ``text`` holds a C0 control character or DEL (a TAB allowed where ``tab``, as in a
    header's value)."""
    return any((ord(c) < 32 and not (tab and c == "\t")) or ord(c) == 127 for c in text)


def deliver_at(now: dt.datetime, at: dt.datetime | None = None, delay: dt.timedelta | None = None) -> dt.datetime | None:
    """A producer's schedule (deliver_at or delay, at most one set): None for now (unset, past or
    negative), else the instant. InvalidArgument beyond MAX_DELAY."""
    if delay is not None:
        at = now + delay
    if at is None or at <= now:
        return None
    if at - now > MAX_DELAY:
        raise InvalidArgument(f"deliver_at / delay is more than {human(MAX_DELAY)} ahead")
    return at
