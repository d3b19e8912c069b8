"""Enqueue ids of a group share a history key (services/domain/events.py)."""

import uuid

from services.domain.events import PER_KEY, history_key, new_ids


def test_a_group_of_ids_is_unique_and_shares_one_key_per_PER_KEY_mails():
    ids = new_ids(2 * PER_KEY + 3)
    assert len(set(ids)) == len(ids)
    keys = [history_key(i) for i in ids]
    assert [len(set(keys[s:s + PER_KEY])) for s in range(0, len(ids), PER_KEY)] == [1, 1, 1]
    assert len(set(keys)) == 3


def test_the_ids_stay_random_version_4_uuids():
    ids = new_ids(PER_KEY)
    assert {i.version for i in ids} == {4} and {i.variant for i in ids} == {uuid.RFC_4122}
    assert history_key(ids[0]) != history_key(new_ids(1)[0])  # two groups, two keys
    assert sorted(ids) != ids or len(ids) < 2  # the low bits are drawn, not counted


def test_the_ids_of_a_group_differ_in_their_first_characters():
    # mailq prints and accepts 8-character prefixes: a group's mails keep distinct ones
    ids = new_ids(PER_KEY)
    assert len({str(i)[:8] for i in ids}) == len(ids)
    assert len({str(i)[9:] for i in ids}) == 1  # the rest is the group's


def test_any_id_has_a_key_and_a_key_is_its_own():
    lone = uuid.uuid4()
    assert history_key(lone).int == lone.int & ((1 << 96) - 1)
    assert history_key(history_key(lone)) == history_key(lone)
    assert new_ids(0) == []
