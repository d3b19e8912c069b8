"""A stream's delivery tags (services/domain/delivery_tags.py): pure logic."""

from services.domain import delivery_tags as t


def test_a_tag_goes_out_and_back_with_its_streams_prefix_only():
    p, q = 1, t.PREFIXES
    for broker_tag in (1, 2, 1 << 20, (1 << t.BROKER_BITS) - 1):
        assert t.inward(p, t.outward(p, broker_tag)) == broker_tag
        assert t.inward(q, t.outward(p, broker_tag)) is None  # another stream's
    assert t.inward(p, 1) is None  # a bare broker tag was never given out
    assert t.outward(q, (1 << t.BROKER_BITS) - 1) < 2**52  # exact as a JavaScript number


def test_prefixes_are_never_0():
    assert all(1 <= t.new_prefix() <= t.PREFIXES for _ in range(1000))
