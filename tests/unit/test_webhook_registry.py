"""Webhook registrations: the rules a registration meets, its protobuf round trip, and how
webhook_svc's fleet follows the registrations (pure: no server)."""

from __future__ import annotations

import asyncio

import pytest

from services.app.webhook_fleet import EndpointFleet
from services.contract.webhooks_serde import webhook_from_proto, webhook_to_proto
from services.domain import webhook_registry
from services.domain.errors import InvalidArgument
from services.domain.events import EventType
from services.domain.webhook_registry import Registration, validate
from services.domain.webhooks import Endpoint

OK = Registration("billing", "https://billing.example/hooks", "/secrets/billing")


@pytest.mark.parametrize(("field", "value", "says"), [
    ("name", "", "empty"), ("name", "a b", "invalid"), ("name", "x" * 65, "invalid"),
    ("url", "ftp://h/", "http"), ("url", "https://", "http"), ("url", "billing.example", "http"),
    ("secret_file", "secrets/x", "absolute"), ("max_age_s", -1.0, "negative"), ("max_age_s", 1e-9, "under 1 s"),
    ("max_age_s", 0.5, "under 1 s"), ("queues", ("",), "empty queue"),
    # found by a hostile client: each was taken, then failed at every POST, or never matched
    ("url", "http://[::1/x", "not a URL"), ("url", "http://h:99999/x", "not a URL"),
    ("url", "http://user:pw@h/x", "user or password"), ("url", "http://h/x#frag", "fragment"),
    ("url", "http://h/x\r\nX: y", "control character"), ("url", "http://a b/", "space"),
    ("url", "http://h/" + "x" * 2000, "at most 2000"),
    ("url", "http://169.254.169.254/latest/meta-data/", "link-local"), ("url", "http://[fe80::1]/x", "link-local"),
    ("url", "http://[::ffff:169.254.169.254]/", "link-local"), ("url", "http://2852039166/", "link-local"),
    ("url", "http://0xa9fea9fe/", "link-local"), ("url", "http://169.254.43518/", "link-local"),
    ("url", "http://0251.0376.0251.0376/", "link-local"),
    ("url", "https://x.example/hoöks", "not ASCII"), ("url", "https://bücher.example/", "xn--"),  # a restart loop at every POST
    ("secret_file", "/s\x00x", "printable"), ("secret_file", "/" + "s" * 4096, "at most 4096"),
    ("queues", ("!!bad",), "queue name"), ("queues", ("q" * 101,), "queue name"),
])
def test_a_bad_registration_is_refused_naming_the_field(field, value, says):
    with pytest.raises(InvalidArgument, match=says):
        validate(Registration(**{**OK.__dict__, field: value}))


def test_defaults_apply_and_the_proto_round_trips():
    # Given a registration without a maximum age, with a type twice
    r = validate(Registration("b-1.x_y", "http://h:8080/p", "/s", (EventType.DELIVERED, EventType.DELIVERED), ("q",), 0.0, True))
    # Then it gets the default age and each type once, and survives protobuf both ways
    assert r.max_age_s == 86400 and r.types == (EventType.DELIVERED,)
    assert webhook_from_proto(webhook_to_proto(r)) == r
    assert "secret" not in "".join(r.settings().values()).replace("secret_file", "")  # only the path is recorded


def fleet_of(wanted: dict[str, tuple[Endpoint, bool]], log: list[str], ending_turns: int = 0) -> EndpointFleet:
    """A fleet whose endpoints run until cancelled, noting their starts and stops in ``log``;
    each stop takes ``ending_turns`` event-loop turns (a shielded last write)."""
    async def run(e: Endpoint, oldest: bool) -> None:
        log.append(f"start {e.name}")
        try:
            await asyncio.Event().wait()
        finally:
            for _ in range(ending_turns):
                await asyncio.shield(asyncio.sleep(0))
            log.append(f"stop {e.name}")

    async def load() -> dict[str, tuple[Endpoint, bool]]:
        return dict(wanted)

    return EndpointFleet(load, run)


def test_the_fleet_starts_stops_and_restarts_endpoints_as_the_registrations_change():
    async def scenario() -> list[str]:
        wanted: dict[str, tuple[Endpoint, bool]] = {}
        log: list[str] = []
        fleet = fleet_of(wanted, log)
        wanted["a"] = (Endpoint("a", "http://a", b"s"), False)
        wanted["b"] = (Endpoint("b", "http://b", b"s"), False)
        await fleet.reload()
        await asyncio.sleep(0)
        await fleet.reload()  # nothing changed: nothing restarted
        del wanted["a"]
        wanted["b"] = (Endpoint("b", "http://b", b"rotated"), False)  # its secret changed: restarted
        await fleet.reload()
        await asyncio.sleep(0)
        assert fleet.names == ["b"]
        await fleet.close()
        return log

    assert asyncio.run(scenario()) == ["start a", "start b", "stop a", "stop b", "start b", "stop b"]


def test_a_reload_cancelled_while_it_stops_an_endpoint_starts_none_after():
    """The service stops while a reload waits for a removed endpoint's task to end (its last
    batch going out): the reload is cancelled there, starts no endpoint after, and the fleet's
    close waits for that task's end."""
    async def scenario() -> tuple[list[str], list[str]]:
        wanted: dict[str, tuple[Endpoint, bool]] = {"a": (Endpoint("a", "http://a", b"s"), False)}
        log: list[str] = []
        fleet = fleet_of(wanted, log, ending_turns=3)
        await fleet.reload()
        await asyncio.sleep(0)
        wanted.clear()
        wanted["b"] = (Endpoint("b", "http://b", b"s"), False)  # a removed, b added
        reload = asyncio.ensure_future(fleet.reload())
        await asyncio.sleep(0)  # the reload waits for a's end
        reload.cancel()
        await asyncio.wait([reload])
        await fleet.close()  # waits for a's end too
        return log, fleet.names

    log, names = asyncio.run(scenario())
    assert (log, names) == (["start a", "stop a"], [])


def test_an_invalid_name_is_echoed_cut_to_its_first_characters():
    from services.domain.webhook_registry import name_of

    with pytest.raises(InvalidArgument) as e:
        name_of("!" * 2000)
    assert len(str(e.value)) < 300 and "(2002 characters)" in str(e.value)


@pytest.mark.parametrize("url,shown", [
    ("https://h.example/in?token=s3cret&v=1#x", "https://h.example/in?token=…&v=…#x"),
    ("https://h.example/in?s3cret", "https://h.example/in?…"),  # a bare value is masked too
    ("https://user:pw@h.example/in", "https://…@h.example/in"),
    ("http://h.example:8080/a/b", "http://h.example:8080/a/b"),
])
def test_a_url_is_shown_with_its_query_values_and_user_masked(url, shown):
    assert webhook_registry.shown_url(url) == shown


def test_the_event_of_a_registration_and_a_refusal_hold_no_query_value():
    r = Registration("b", "https://h.example/in?token=s3cret", "/s/b")
    assert "s3cret" not in str(r.settings())
    with pytest.raises(InvalidArgument) as e:
        webhook_registry.url_of("https://h.example/in?token=s3cret#frag")
    assert "s3cret" not in str(e.value)
