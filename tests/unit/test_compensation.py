"""Which failed claims an enqueue gives back (services/app/compensation.py ``abandon``): every
attempt whose claim may have landed, whatever its error; never one that claimed nothing."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import pytest

from services.app.compensation import Compensation
from services.domain.errors import Aborted, BackendUnavailable

STARTED = dt.datetime(2026, 12, 7, 12, 0, tzinfo=dt.UTC)


class Claims:
    """The part of KeyClaims compensation calls: what it was told."""

    def __init__(self) -> None:
        self.failed_claims: list[tuple[str, str, dt.datetime]] = []
        self.released: list[tuple[str, str, uuid.UUID, dt.datetime]] = []

    def failed(self, queue: str, key: str, started: dt.datetime) -> None:
        self.failed_claims.append((queue, key, started))

    async def release(self, queue: str, key: str, enqueue_id: uuid.UUID, started: dt.datetime) -> None:
        self.released.append((queue, key, enqueue_id, started))


def abandoned(error: BaseException, storing: bool = False, key: str = "k1") -> Claims:
    claims, enqueue_id = Claims(), uuid.uuid4()

    async def scenario() -> None:
        c = Compensation(view=None, claims=claims)  # type: ignore[arg-type] # an attempt that wrote nothing
        await c.abandon("q", key, enqueue_id, STARTED, error, storing)
        for _ in range(5):  # the background undo's turns
            await asyncio.sleep(0)

    asyncio.run(scenario())
    for released in claims.released:
        assert released == ("q", key, enqueue_id, STARTED)
    return claims


@pytest.mark.parametrize("error", [
    BackendUnavailable("cassandra", "timed out"),
    asyncio.CancelledError(),
    RuntimeError("a driver error nobody mapped"),
], ids=["unavailable", "caller-left", "unexpected"])
def test_a_claim_that_may_have_landed_is_known_failed_and_released(error):
    claims = abandoned(error)
    assert set(claims.failed_claims) == {("q", "k1", STARTED)}
    assert len(claims.released) == 1


def test_a_failure_while_storing_the_content_releases_the_claim_whatever_the_error():
    claims = abandoned(ValueError("the blob store refused it"), storing=True)
    assert set(claims.failed_claims) == {("q", "k1", STARTED)} and len(claims.released) == 1


def test_a_claim_refused_because_another_attempt_holds_the_key_gives_nothing_back():
    claims = abandoned(Aborted("an enqueue with idempotency key k1 is in progress"))
    assert claims.failed_claims == [] and claims.released == []


def test_a_mail_without_a_key_has_nothing_to_give_back():
    claims = abandoned(RuntimeError("x"), key="")
    assert claims.failed_claims == [] and claims.released == []
