"""Closing a subscription (stream ended, client gone): nothing it held is lost or left claimed.

- The broker is first told to deliver no more (basic.cancel): then deliveries it received but
  never handed to the client are published again, then acked: a client that subscribes and
  leaves spends no delivery attempt.
- Handed-out, unanswered deliveries go back to the queue (one attempt each), except those on the
  last delivery the broker allows: returned, the broker would dead-letter them with their view
  rows still live, so they are marked and dead-lettered here.
- Every claim and every room at a destination is given back, whether or not the broker can still
  be told: a claim left behind would make this process drop the broker's redelivery of the mail
  as a second copy (a channel that died with its node fails every return).
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

from services.app.actions import finish_hold
from services.app.delivery import Delivery, Stream
from services.app.settlement import dead_letter_at_limit, retries_exhausted
from services.app.verdict import carried
from services.domain.errors import BackendUnavailable

log = logging.getLogger(__name__)

RETURNED_UNSENT = Counter(
    "mailqueue_returned_unsent_total", "Deliveries a closing stream never handed out, published again without spending an attempt", ["queue"],
)


async def close(s: Stream, prepared: list[Delivery], unanswered: list[Delivery]) -> None:
    """``prepared``: deliveries ready but never handed out (their messages are in ``s.unsent``);
    ``unanswered``: handed out, not answered. The preparations still running were cancelled."""
    for d in prepared:
        d.end(s.side.shaper)
    s.side.shaper.consuming(-1)
    channel_open = True
    try:
        # First: each ack below frees room the broker would fill with a new delivery, sent back by
        # the channel's close with an attempt spent (and, for a delayed arrival, its count kept).
        # Not while the broker blocks the connection (an alarm): it reads no frame of it, and the
        # stream's end would wait the cancel's whole bound (the give-back is refused then anyway).
        if s.side.broker.blocked() is None:
            await s.consumer.stop()
    except BackendUnavailable as e:  # the channel is gone: the broker returns everything by itself
        log.info("could not stop the consumer before giving back: %s", e, extra={"queue": s.queue})
        channel_open = False
    for message in s.consumer.drain():
        s.unsent[message.delivery_tag] = message
    for d in unanswered:
        d.end(s.side.shaper)
        if retries_exhausted(d.delivery_count, s.side.broker.delivery_limit):
            try:
                await dead_letter_at_limit(s, d, ", last delivery unanswered")
            except BackendUnavailable as e:
                log.warning("could not dead-letter a delivery on its last attempt: %s", e, extra={"queue": s.queue})
    if not channel_open:  # published again, a copy would sit beside the one the broker gave back
        log.info("unsent deliveries left to the broker (their channel is gone)", extra={"queue": s.queue, "unsent": len(s.unsent)})
        return
    try:
        await return_unsent(s)
    except BackendUnavailable as e:  # the channel is gone: the broker returns them by itself
        log.warning("unsent deliveries left to the broker: %s", e, extra={"queue": s.queue, "unsent": len(s.unsent)})


async def return_unsent(s: Stream) -> None:
    """Publish again, then ack, every delivery the client never saw (in broker order)."""
    for tag in sorted(s.unsent):
        message = s.unsent[tag]
        if tag in s.held:  # its held copy is out (a newer generation): that copy is the mail now
            try:
                await finish_hold(s, tag, s.held[tag])  # its schedule and counts, as its preparation would
            except BackendUnavailable:
                await s.ack(tag, "held")  # the copy is out: never a second one (its count left to a reconcile)
            continue
        try:
            mail = message.mail()
        except Exception:  # noqa: BLE001 - poison: as the preparation would
            await s.dead_letter(tag)
            continue
        # Its delay stays counted until the copy arrives, unless this arrival counted it already.
        await s.side.broker.publish(mail, counted=message.delayed and tag not in s.arrived, content=carried(message, mail))
        await s.ack(tag)
        RETURNED_UNSENT.labels(s.queue).inc()
