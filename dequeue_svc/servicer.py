"""DequeueService: not implemented yet (answers UNIMPLEMENTED)."""

from __future__ import annotations

from typing import Any

from mailqueue.v1 import dequeue_pb2_grpc


class DequeueServicer(dequeue_pb2_grpc.DequeueServiceServicer):
    def __init__(self, app: Any) -> None:
        self._app = app
