"""What webhook delivery needs (services/app/webhook_delivery.py).

Contracts:
- ``Checkpoints.load`` returns the cursor of the last event an endpoint took (None: none yet);
  ``save`` stores it durably (BackendUnavailable otherwise). One row per endpoint.
- ``Poster.post`` sends one request and returns the HTTP status; None when no answer came (a
  timeout, a refused or reset connection). It never raises for the endpoint's failures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Checkpoints(Protocol):
    async def load(self, endpoint: str) -> str | None: ...

    async def save(self, endpoint: str, cursor: str) -> None: ...


class Poster(Protocol):
    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> int | None: ...
