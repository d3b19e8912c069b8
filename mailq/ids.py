"""Enqueue ids as an operator types them: the full UUID, or a unique prefix of it, like git's short
hashes (`mailq browse` prints the first 8 characters).

A full id goes to the server as given: one index read there, whatever the queue's depth. A prefix
is resolved here, by browsing the queue's live mails once for every prefix of the command: a
prefix that matches no mail, or several, is refused before anything is asked of the server
(SystemExit: the message on stderr, exit code 1), and an ambiguous one lists its candidates.
A text that is no id at all is a usage error (UsageError: exit code 2).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable

from mailq.common import Client, UsageError
from mailqueue.v1 import browse_pb2, mail_pb2

#: The shortest prefix taken (git's minimum too): a shorter one matches too much to be meant.
MIN_PREFIX = 4
#: At most this many candidates are listed for an ambiguous prefix.
SHOWN = 10

_PREFIX = re.compile(r"[0-9a-f-]+")


def _hex(text: str) -> str:
    return text.replace("-", "")


def _full(text: str) -> str | None:
    """The canonical form of a whole UUID (with or without dashes), else None."""
    if len(_hex(text)) != 32:
        return None
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


def _describe(m: mail_pb2.QueuedMail) -> str:
    at = m.enqueued_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")
    name = f"  name {m.mail.name}" if m.mail.name else ""
    return f"  {m.enqueue_id}  {at}  {m.mail.sender or '<>'} -> {','.join(m.mail.recipients)}{name}"


def resolve(given: Iterable[str], candidates: Callable[[], Iterable[mail_pb2.QueuedMail]], where: str,
            unmatched: str = "mailq browse lists them") -> list[str]:
    """The full enqueue ids meant by ``given`` (full ids or unique prefixes, dashes optional), in
    the order given, each once. ``candidates`` reads the mails a prefix may name (called once, and
    only if a prefix was given); ``where`` names them in messages ("queue spool"); ``unmatched``
    says what to do about a prefix that matches none."""
    wanted = [t.strip().lower() for t in given]
    errors = [f"mailq: enqueue id {t!r}: use hexadecimal digits (and dashes), at least {MIN_PREFIX} of them"
              for t in wanted if not _PREFIX.fullmatch(t) or len(_hex(t)) < MIN_PREFIX]
    if errors:
        raise UsageError("\n".join(errors))
    prefixes = [t for t in wanted if _full(t) is None]
    mails = list(candidates()) if prefixes else []
    resolved: dict[str, str] = {}
    for t in wanted:
        full = _full(t)
        if full is not None:
            resolved.setdefault(full, t)
            continue
        matches = [m for m in mails if _hex(m.enqueue_id).startswith(_hex(t))]
        if not matches:
            errors.append(f"mailq: no live mail of {where} has an enqueue id starting with {t!r} ({unmatched})")
        elif len(matches) > 1:
            more = f"\n  ... and {len(matches) - SHOWN} more" if len(matches) > SHOWN else ""
            errors.append(f"mailq: enqueue id prefix {t!r} is ambiguous: {len(matches)} mails of {where} match; "
                          f"give more characters of one of them:\n" + "\n".join(_describe(m) for m in matches[:SHOWN]) + more)
        else:
            resolved.setdefault(matches[0].enqueue_id, t)
    if errors:
        raise SystemExit("\n".join(errors))
    return list(resolved)


def in_queue(c: Client, queue: str, given: Iterable[str]) -> list[str]:
    """``given`` resolved against the queue's live mails (one Browse of the queue if a prefix is given)."""
    return resolve(given, lambda: (r.mail for r in c.browse.Browse(browse_pb2.BrowseRequest(queue=queue))), f"queue {queue}")
