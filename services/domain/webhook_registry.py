"""A registered webhook endpoint (WebhookAdminService) and the rules it must meet (pure).

The registration keeps the PATH of the HMAC secret's file, never the secret: the secret crosses
no API and sits in no table or event, only in the file webhook_svc reads (in Kubernetes, a mounted
Secret). Whoever may register an endpoint can thus not read another endpoint's secret back, and
rotating a secret is a file (Secret) change that needs no API call.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
import re
import socket
import urllib.parse

from services.domain.errors import InvalidArgument
from services.domain.events import EventType
from services.domain.validation import queue_name, shown

#: An endpoint's name: it keys its checkpoint (webhook_checkpoints_v1) and its metrics' label.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: The shortest max_age taken: events reach an endpoint after their history write, within a second.
MIN_MAX_AGE_S = 1.0
#: An endpoint's maximum event age when the registration names none.
DEFAULT_MAX_AGE_S = 24 * 3600.0
#: The longest URL taken (browsers and proxies keep to about 2,000; it is in every CONFIG_CHANGED event).
MAX_URL = 2000
#: The longest secret file path taken (Linux's PATH_MAX).
MAX_PATH = 4096


@dataclasses.dataclass(frozen=True)
class Registration:
    name: str
    url: str
    secret_file: str
    types: tuple[EventType, ...] = ()
    queues: tuple[str, ...] = ()
    max_age_s: float = DEFAULT_MAX_AGE_S
    from_oldest: bool = False
    created_at: dt.datetime | None = None

    def settings(self) -> dict[str, str]:
        """What the admin event records of it (no secret: only its file's path, and its URL with
        the query's values masked)."""
        return {"url": shown_url(self.url), "secret_file": self.secret_file, "types": ",".join(t.value for t in self.types),
                "queues": ",".join(self.queues), "max_age_s": f"{self.max_age_s:g}", "from_oldest": str(self.from_oldest).lower()}


def name_of(name: str) -> str:
    """``name`` if it is a valid endpoint name; InvalidArgument saying what is wrong otherwise."""
    if not name:
        raise InvalidArgument("webhook name is empty: give 1 to 64 letters, digits, '-', '_' or '.'")
    if not NAME.fullmatch(name):
        raise InvalidArgument(f"webhook name {shown(name)} is invalid: 1 to 64 letters, digits, '-', '_' or '.', starting with a letter or digit")
    return name


def shown_url(url: str) -> str:
    """``url`` as events, logs and listings show it: each query value masked (``?token=…``: a
    receiver's token is often put there), and a user or password an older version took. Only the
    POST itself uses the URL as registered."""
    masked = re.sub(r"//[^/?#]*@", "//…@", url)
    head, mark, query = masked.partition("?")
    if not mark:
        return masked
    query, hash_, fragment = query.partition("#")
    parts = [(k + "=…" if sep else "…") for k, sep, _ in (q.partition("=") for q in query.split("&"))]
    return head + "?" + "&".join(parts) + hash_ + fragment


def url_of(text: str) -> str:
    """``text`` if webhook_svc can POST to it: http or https, a host (not a link-local address), a
    port in range, no user or password (the endpoint authenticates batches by their signature; a
    token in the query is masked wherever the URL is shown: ``shown_url``), no fragment
    (never sent), no space or control character, ASCII only, at most MAX_URL characters;
    InvalidArgument saying what is wrong."""
    wrong = f"webhook url {shown(shown_url(text))}"  # never the password or token it may carry
    if len(text) > MAX_URL:
        raise InvalidArgument(f"{wrong} is {len(text)} characters long: at most {MAX_URL}")
    if not text.isprintable() or " " in text:
        raise InvalidArgument(f"{wrong} holds a space or a control character: percent-encode them")
    if not text.isascii():  # an HTTP request line is ASCII: it could never be sent
        raise InvalidArgument(f"{wrong} holds a character that is not ASCII: percent-encode it (and write an "
                              "international host name in its xn-- form)")
    try:
        url = urllib.parse.urlsplit(text)
        url.port  # noqa: B018 - raises ValueError outside 0-65535
    except ValueError as e:
        raise InvalidArgument(f"{wrong} is not a URL: {e}") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise InvalidArgument(f"{wrong} is not an http:// or https:// URL with a host")
    if url.username is not None or url.password is not None:
        raise InvalidArgument(f"{wrong} carries a user or password: it would be shown in every listing and event; "
                              "the endpoint authenticates the batches by their signature")
    if url.fragment or text.endswith("#"):
        raise InvalidArgument(f"{wrong} has a fragment (#...), which is never sent: leave it out")
    if _link_local(url.hostname):
        raise InvalidArgument(f"{wrong} names a link-local address (169.254.0.0/16, fe80::/10): a cloud's instance "
                              "metadata service answers there with the node's credentials; give the endpoint's own address")
    return text


def _link_local(host: str) -> bool:
    """Whether ``host`` is a literal link-local address (a name is resolved only when POSTing: the
    Kubernetes NetworkPolicy of webhook_svc refuses those addresses too, k8s/base/webhook.yaml)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:  # the forms the resolver also takes: 2852039166, 0xa9fea9fe, 169.254.43518, octal parts
            address = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_link_local or (mapped is not None and mapped.is_link_local)


def validate(r: Registration) -> Registration:
    """``r`` with its defaults applied, or InvalidArgument naming the first field that is wrong."""
    name_of(r.name)
    url_of(r.url)
    if not r.secret_file.startswith("/"):
        raise InvalidArgument(f"webhook secret_file {shown(r.secret_file)} is not an absolute path (the secret's file as "
                              "webhook_svc sees it, e.g. a mounted Secret: /var/run/secrets/webhooks/NAME)")
    if len(r.secret_file) > MAX_PATH or not r.secret_file.isprintable():
        raise InvalidArgument(f"webhook secret_file {shown(r.secret_file)} is not a path webhook_svc can open: "
                              f"at most {MAX_PATH} printable characters")
    if r.max_age_s < 0:
        raise InvalidArgument(f"webhook max_age {r.max_age_s:g} s is negative")
    if 0 < r.max_age_s < MIN_MAX_AGE_S:  # a max_age of 1 ns used to become the 1-day default
        raise InvalidArgument(f"webhook max_age {r.max_age_s:g} s is under {MIN_MAX_AGE_S:g} s: every event would be "
                              "dropped as too old; leave it unset (or 0) for the default of 1 day")
    if any(not q for q in r.queues):
        raise InvalidArgument("webhook queues: an empty queue name")
    for q in r.queues:
        queue_name(q)  # a name no queue can have would match nothing, silently
    return dataclasses.replace(r, max_age_s=r.max_age_s or DEFAULT_MAX_AGE_S, types=tuple(dict.fromkeys(r.types)),
                               queues=tuple(dict.fromkeys(r.queues)))
