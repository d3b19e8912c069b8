"""enqueue_svc: an Enqueuer over the view, the broker and the blob store."""

from __future__ import annotations

from typing import Any

from enqueue_svc.servicer import EnqueueServicer
from mailqueue.v1 import enqueue_pb2_grpc
from services.app.enqueuer import Enqueuer
from services.runtime.backends import Backends
from services.runtime.queue_app import QueueApp


class EnqueueApp(QueueApp[Enqueuer]):
    name = "enqueue"

    def servicers(self) -> list[tuple[Any, Any, str]]:
        return [(enqueue_pb2_grpc.add_EnqueueServiceServicer_to_server, EnqueueServicer(self.service), "mailqueue.v1.EnqueueService")]

    def build(self, b: Backends) -> Enqueuer:
        return Enqueuer(b.view, b.broker, b.blobs, self.settings.limits, b.state)
