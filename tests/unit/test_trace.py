"""W3C traceparent validation (services/domain/trace.py): only version 00's exact form is kept."""

from __future__ import annotations

import pytest

from services.domain import trace
from services.domain.errors import InvalidArgument

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_is_kept_and_none_is_empty():
    assert trace.parse(GOOD) == GOOD
    assert trace.from_metadata((("authorization", "Bearer x"), ("traceparent", GOOD))) == GOOD
    assert trace.from_metadata((("traceparent", GOOD.encode()),)) == GOOD
    assert trace.from_metadata(()) == "" and trace.from_metadata(None) == ""


@pytest.mark.parametrize("bad", [
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    " " + GOOD,
])
def test_anything_else_is_invalid_argument(bad):
    with pytest.raises(InvalidArgument, match="traceparent"):
        trace.parse(bad)


def test_two_traceparents_are_ambiguous():
    with pytest.raises(InvalidArgument, match="more than once"):
        trace.from_metadata((("traceparent", GOOD), ("traceparent", GOOD)))


def test_a_mail_built_inside_carrying_takes_the_calls_traceparent():
    assert trace.current_traceparent.get() == ""
    with trace.carrying(GOOD):
        assert trace.current_traceparent.get() == GOOD
    assert trace.current_traceparent.get() == ""
