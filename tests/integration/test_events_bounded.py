"""History and the event stream stay bounded by their retention (#49): counted, not timed.

- History: every row is written with a TTL of at most the history retention (here 60 s), so the
  rows a mail's history holds are the events of the last retention, no more; the tables' own
  default TTL is the backstop. Counted with ``TTL()`` on each row.
- Stream: with a 1 MiB cap (``MAILQUEUE_EVENT_STREAM_MAX_BYTES``, segments of 1 MiB), 5 MiB of
  events published leave at most two segments on disk and fewer messages than published; the
  oldest kept event is no longer the first one (a watcher ``from_oldest`` starts later).
"""

from __future__ import annotations

import glob
import os
import re
import uuid

import pytest

from services.adapters.cassandra.schema import HISTORY_TTL_S, MAIL_HISTORY, MAIL_HISTORY_GROUPS
from services.domain import model
from services.domain.events import Actor, Event, EventType, event_id, history_key, new_ids
from stack.harness import new_keyspace, service_env, stack_dir
from tests.inprocess import RunningApp

pytestmark = pytest.mark.integration

RETENTION_S = 60
CAP = 1024**2
PAD = "x" * 2000


@pytest.fixture(scope="module")
def browse(aio_loop, keyspace):
    """browse_svc on the session's keyspace, its history kept 60 s."""
    from browse_svc.app import BrowseApp

    app = RunningApp(aio_loop, BrowseApp, "browse", dict(service_env(keyspace), MAILQUEUE_HISTORY_RETENTION_S=str(RETENTION_S)))
    yield app
    app.stop()


@pytest.fixture
def capped_stream(aio_loop, running_stack):
    """The event stream of a view of its own (no Cassandra keyspace needed), declared with a 1 MiB
    cap as enqueue_svc or browse_svc would with MAILQUEUE_EVENT_STREAM_MAX_BYTES=1048576."""
    from services.adapters.rabbitmq.broker import RabbitMQBroker
    from services.adapters.rabbitmq.event_stream import RabbitMQEventStream
    from services.runtime.settings import rabbitmq_from_env
    from stack.harness import as_service, drop_event_stream

    view = new_keyspace()
    settings = rabbitmq_from_env(as_service("browse", dict(os.environ, MAILQUEUE_EVENT_STREAM_MAX_BYTES=str(CAP))))
    broker = RabbitMQBroker(settings, view)
    try:
        yield RabbitMQEventStream(broker, view, settings)
    finally:
        aio_loop.run(broker.close())
        drop_event_stream(view)


def mail_events(queue: str, n: int, start: int = 0, pad: str = "") -> list[Event]:
    actor = Actor.component("test")
    ids = new_ids(n)
    return [Event(id=event_id(EventType.DELIVERED, queue, ids[i - start], i), time=model.utcnow(), type=EventType.DELIVERED,
                  queue=queue, enqueue_id=ids[i - start], actor=actor, attempt=1, details={"pad": pad} if pad else {})
            for i in range(start, start + n)]


def test_history_rows_expire_within_the_retention(browse):
    queue = f"ev-{uuid.uuid4().hex[:8]}"
    sent = mail_events(queue, 40)
    backends = browse.app.backends()
    browse.loop.run(backends.events.record(sent))
    session, ks = backends.view.session, browse.app.settings.cassandra.keyspace
    (key,) = {history_key(e.enqueue_id) for e in sent if e.enqueue_id}
    ttls = [r[0] for r in session.execute(f"SELECT TTL(events) FROM {ks}.{MAIL_HISTORY_GROUPS} WHERE history_key = %s", (key,))]
    # The 40 events of one group's write: one row, gone within the retention. Rows = writes of the last 60 s.
    assert len(ttls) == 1 and all(0 < t <= RETENTION_S for t in ttls), ttls
    for table_name in (MAIL_HISTORY_GROUPS, MAIL_HISTORY):  # the per-event table holds the sweep's events
        (table,) = session.execute("SELECT default_time_to_live, compaction FROM system_schema.tables "
                                   "WHERE keyspace_name = %s AND table_name = %s", (ks, table_name))
        assert table.default_time_to_live == HISTORY_TTL_S and "TimeWindowCompactionStrategy" in table.compaction["class"]
    assert [e.id for e in browse.loop.run(backends.events.history(sent[7].enqueue_id))] == [sent[7].id]


def segments(stream: str) -> list[int]:
    """Sizes of the stream's segment files in the local stack's RabbitMQ data directory."""
    mangled = re.sub(r"[^A-Za-z0-9]", "_", stream)
    dirs = glob.glob(os.path.join(stack_dir(), "rabbitmq", "mnesia", "*", "stream", f"*{mangled}_*"))
    assert len(dirs) == 1, (mangled, dirs)
    return [os.path.getsize(f) for f in glob.glob(os.path.join(dirs[0], "*.segment"))]


def test_the_stream_keeps_at_most_its_size_cap_in_whole_segments(aio_loop, capped_stream):
    queue = f"ev-{uuid.uuid4().hex[:8]}"
    published = 0
    while published * len(PAD) < 5 * CAP:  # 5 MiB: five times the cap
        aio_loop.run(capped_stream.publish(mail_events(queue, 100, published, PAD)))
        published += 100
    sizes = segments(capped_stream.name)
    # RabbitMQ drops whole segments, oldest first, when one fills: at most the cap plus the segment
    # being written (each can exceed 1 MiB by its last chunk).
    assert 1 <= len(sizes) <= 2 and sum(sizes) <= 2.2 * CAP, sizes

