"""Which keyspaces and RabbitMQ queues bench/leftovers.py takes for what earlier runs left (by name)."""

import pytest

from bench.leftovers import exchanges_of, throwaway_broker_queue, throwaway_keyspace


@pytest.mark.parametrize("name", ["mq_bench_1a2b3c4d", "mq_test_0123456789ab"])
def test_bench_and_test_keyspaces_are_throwaway(name):
    assert throwaway_keyspace(name)


@pytest.mark.parametrize("name", ["mailqueue", "mq_prod", "system_schema"])
def test_other_keyspaces_are_not(name):
    assert not throwaway_keyspace(name)


@pytest.mark.parametrize("name", [
    "mailqueue.contract-go-0df596a5.work", "mailqueue.contract-go-0df596a5.work.high", "mailqueue.q-0123456789.work.low",
    "mailqueue.enqueue-1a2b3c4d.dead-letter", "mailqueue._events.mq_bench_1a2b3c4d", "mailqueue.dead-letter-marks.mq_test_0123456789ab",
])
def test_queues_of_throwaway_mail_queues_and_keyspaces(name):
    assert throwaway_broker_queue(name)


@pytest.mark.parametrize("name", [
    "mailqueue.default.work", "mailqueue.outbound.dead-letter", "mailqueue.delay.3", "mailqueue._events.mailqueue",
    "mailqueue.dead-letter-marks.mailqueue", "other.x-12345678.work", "mailqueue.x-12345678.unknown",
])
def test_an_operators_queues_the_delay_ladder_and_foreign_queues_are_kept(name):
    assert not throwaway_broker_queue(name)


def test_a_queue_of_a_kept_keyspace_named_like_a_runs_is_kept():
    assert not throwaway_broker_queue("mailqueue.daily-2026120701.work", frozenset({"daily-2026120701"}))
    assert throwaway_broker_queue("mailqueue.daily-2026120701.work", frozenset({"other"}))


def test_each_queue_goes_with_its_exchanges():
    assert exchanges_of("mailqueue.q-0123456789.work.high") == ["mailqueue.q-0123456789", "mailqueue.q-0123456789.dead-letter"]
    assert exchanges_of("mailqueue._events.mq_test_0123456789ab") == ["mailqueue._events.mq_test_0123456789ab"]
    assert exchanges_of("mailqueue.dead-letter-marks.mq_test_0123456789ab") == []
