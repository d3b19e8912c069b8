"""What webhook delivery needs (services/app/webhook_delivery.py).

Contracts:
- ``Checkpoints.load`` returns the cursor of the last event an endpoint took (None: none yet);
  ``save`` stores it durably (BackendUnavailable otherwise). One row per endpoint.
- ``Poster.post`` sends one request and returns the HTTP status; None when no answer came (a
  timeout, a refused or reset connection). It never raises for the endpoint's failures.
- ``Registry`` stores the registered endpoints (WebhookAdminService): ``add`` returns False, and
  writes nothing, when the name is taken; ``remove`` returns the endpoint removed, None (nothing
  written) when there was none; ``all`` lists them by name. BackendUnavailable when the store fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from services.domain.webhook_registry import Registration
from services.domain.webhooks import Answer


class Checkpoints(Protocol):
    async def load(self, endpoint: str) -> str | None: ...

    async def save(self, endpoint: str, cursor: str) -> None: ...


class Poster(Protocol):
    async def post(self, lane: str, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> Answer:
        """POST ``body``; the endpoint's answer (status None: no answer in time, or no connection,
        or the lane, one per endpoint, still holds an earlier request)."""


class Registry(Protocol):
    async def add(self, r: Registration) -> bool: ...

    async def get(self, name: str) -> Registration | None: ...

    async def remove(self, name: str) -> Registration | None: ...

    async def all(self) -> list[Registration]: ...
