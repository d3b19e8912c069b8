"""dequeue_svc: a Dequeuer over the view, the broker and the blob store, the dead-letter recorder and
the traffic shaping refresh."""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any

from dequeue_svc.servicer import DequeueServicer
from mailqueue.v1 import dequeue_pb2_grpc
from services.app import dead_letter_recorder
from services.app.dequeuer import Dequeuer
from services.runtime.backends import Backends
from services.runtime.queue_app import QueueApp

log = logging.getLogger(__name__)

#: Seconds the streams cancelled at shutdown have to give back what they hold and write their
#: held hand-out events, before the backends close under them.
DRAIN_S = 10.0


class DequeueApp(QueueApp[Dequeuer]):
    name = "dequeue"

    def servicers(self) -> list[tuple[Any, Any, str]]:
        return [(dequeue_pb2_grpc.add_DequeueServiceServicer_to_server, DequeueServicer(self.service), "mailqueue.v1.DequeueService")]

    def build(self, b: Backends) -> Dequeuer:
        self._dequeuer = Dequeuer(b.view, b.broker, b.blobs, self.settings.limits, b.state, b.events,
                                  self.settings.events.handout_delay_ms / 1000)
        return self._dequeuer

    def background(self, b: Backends) -> list[Coroutine[Any, Any, None]]:
        # The dead-letter recorder, and the shaping state read (and heartbeat) every second.
        return [dead_letter_recorder.mark_forever(b.view, b.broker, b.events), self._dequeuer.shaper.run_forever()]

    #: A consumer's stream lives past its connection's maximum age (the connection then takes no new
    #: call, and closes once its streams end): cut there, every delivery it held would come back.
    connection_age_grace_s = None

    async def finish(self, grace_s: float) -> None:
        """Each open stream hands out nothing more and ends ("subscribe again") once its client
        answered what it holds, within the server's grace: a rolling update sends no mail twice."""
        if self._service is not None:
            left = await self._dequeuer.finish(grace_s)
            if left:
                log.warning("streams whose clients did not answer within the grace", extra={"streams": left, "grace_s": grace_s})

    async def close(self) -> None:
        if self._service is not None:
            left = await self._dequeuer.drain(DRAIN_S)
            if left:
                log.warning("streams still closing when the backends close", extra={"streams": left, "waited_s": DRAIN_S})
        await super().close()
