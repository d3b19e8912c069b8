"""mailq webhook: the HTTP endpoints webhook_svc delivers events to (WebhookAdminService)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
from typing import Any

from mailq.common import UsageError, enum_text, print_table, real
from mailqueue.v1 import events_pb2, webhooks_pb2
from services.domain.events import EventType


def _event_type(text: str) -> int:
    try:
        return events_pb2.EventType.Value("EVENT_TYPE_" + EventType(text.lower()).name)
    except ValueError:
        raise UsageError(f"mailq webhook add: unknown event type {text!r}; one of: {', '.join(t.value for t in EventType)}") from None


def _type_name(value: int) -> str:
    return enum_text(events_pb2.EventType, value, "EVENT_TYPE_")


def cmd_add(c: Any, a: argparse.Namespace) -> None:
    # The path is webhook_svc's, on its machine or in its pod: a relative one would be made absolute
    # against this shell's folder, which webhook_svc does not share (the API refuses one too).
    if not os.path.isabs(a.secret_file):
        raise UsageError(f"mailq webhook add: --secret-file {a.secret_file!r} is relative: give the absolute path "
                         "as webhook_svc sees it (Kubernetes: where the Secret is mounted)")
    w = webhooks_pb2.Webhook(name=a.name, url=a.url, secret_file=a.secret_file,
                             event_types=[_event_type(t) for t in a.events or ()], queues=a.queues or [], from_oldest=a.from_oldest)
    if a.max_age_s is not None:
        w.max_age.FromTimedelta(dt.timedelta(seconds=a.max_age_s))
    r = c.webhooks.AddWebhook(webhooks_pb2.AddWebhookRequest(webhook=w)).webhook
    print(f"added webhook {r.name}: {r.url} ({_filters(r)}; events older than {r.max_age.ToTimedelta().total_seconds():g} s dropped)")


def _filters(r: webhooks_pb2.Webhook) -> str:
    types = ",".join(_type_name(t) for t in r.event_types) or "every event type"
    return f"{types} of {','.join(r.queues) or 'every queue'}"


def cmd_list(c: Any, a: argparse.Namespace) -> None:
    r = c.webhooks.ListWebhooks(webhooks_pb2.ListWebhooksRequest())
    print_table([[w.name, w.url, ",".join(_type_name(t) for t in w.event_types) or "*", ",".join(w.queues) or "*",
                  f"{w.max_age.ToTimedelta().total_seconds():g}", "oldest" if w.from_oldest else "next", w.secret_file,
                  w.created_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")] for w in r.webhooks],
                ["NAME", "URL", "EVENTS", "QUEUES", "MAX AGE (S)", "STARTS AT", "SECRET FILE", "ADDED (UTC)"])


def cmd_remove(c: Any, a: argparse.Namespace) -> None:
    r = c.webhooks.RemoveWebhook(webhooks_pb2.RemoveWebhookRequest(name=a.name)).webhook
    print(f"removed webhook {r.name} ({r.url}); its checkpoint is kept: adding {r.name} again resumes after it")


def register(sub: Any) -> None:
    w = sub.add_parser("webhook", help="the HTTP endpoints webhook_svc delivers events to").add_subparsers(dest="action", required=True)
    s = w.add_parser("add", help="register an endpoint (webhook_svc starts delivering to it within MAILQUEUE_WEBHOOK_RELOAD_S)")
    s.add_argument("name", help="its name (letters, digits, '-', '_', '.'): it keys its checkpoint")
    s.add_argument("url", help="http:// or https:// URL the batches are POSTed to")
    s.add_argument("--secret-file", required=True, metavar="PATH",
                   help="absolute path of the file holding the HMAC secret, as webhook_svc sees it (Kubernetes: a mounted Secret); "
                   "the secret never crosses the API")
    s.add_argument("--events", nargs="+", metavar="TYPE", help="only these event types (delivered, dead_lettered, ...; default: every one)")
    s.add_argument("--queues", nargs="+", metavar="Q", help="only these queues' events (default: every queue)")
    s.add_argument("--max-age-s", type=real(maximum=1e10, above=True), metavar="N",
                   help="drop (count, log) events older than N seconds when sent (default 86400)")
    s.add_argument("--from-oldest", action="store_true", help="start at the oldest event kept (default: at the next one)")
    s.set_defaults(fn=cmd_add)
    s = w.add_parser("list", help="the registered endpoints")
    s.set_defaults(fn=cmd_list)
    s = w.add_parser("remove", help="unregister an endpoint (its checkpoint is kept)")
    s.add_argument("name")
    s.set_defaults(fn=cmd_remove)
