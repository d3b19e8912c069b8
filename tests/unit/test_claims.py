"""Claims: one owner per delivery, released once, never another copy's hold."""

import uuid

from services.app.claims import Claims


def test_a_second_copy_not_newer_is_refused_until_the_claim_is_released():
    claims, mail = Claims(), uuid.uuid4()
    first = claims.take("q", mail, 0)
    assert first is not None and claims.take("q", mail, 0) is None
    assert claims.take("other", mail, 0) is not None  # another queue's mail is another mail
    first.release()
    assert first.released and claims.take("q", mail, 0) is not None


def test_a_release_is_idempotent_and_an_older_claim_never_releases_a_newer_one():
    claims, mail = Claims(), uuid.uuid4()
    old = claims.take("q", mail, 1)
    newer = claims.take("q", mail, 2)  # a RETRY's newer copy replaces the holder
    assert old is not None and newer is not None
    old.release()
    old.release()
    assert claims.take("q", mail, 2) is None  # still held by the newer copy
    newer.release()
    assert len(claims) == 0
