"""A channel closed by the broker as a call is made (issue 47, item 7: seen by the soak when
RabbitMQ stopped): the caller gets BackendUnavailable (UNAVAILABLE), not pika's error (INTERNAL),
and no future is left failed with nobody awaiting it ("Future exception was never retrieved").

pika's channel objects need a connection; the stand-in below is a channel as pika leaves it once
the broker closed it: every method raises ChannelWrongStateError."""

import gc

import pika
import pytest

from services.adapters.rabbitmq import message_format
from services.adapters.rabbitmq.channels import Waiters
from services.adapters.rabbitmq.publishing import Publisher
from services.domain.errors import BackendUnavailable
from tests.unit.aio import run


class Closed:
    """A channel whose close pika has not reported yet, but whose methods already refuse."""

    is_open = False

    def add_on_close_callback(self, _callback) -> None: ...

    def add_on_return_callback(self, _callback) -> None: ...

    def basic_consume(self, *_args, **_kwargs) -> None:
        raise pika.exceptions.ChannelWrongStateError("Channel is closed.")

    basic_publish = basic_consume


def test_a_call_on_a_channel_that_closed_fails_unavailable_and_leaves_nothing_unretrieved(caplog):
    async def scenario() -> None:
        channel = Closed()
        waiters = Waiters(channel)
        with pytest.raises(BackendUnavailable, match="Channel is closed"):
            await waiters.call(lambda callback: channel.basic_consume("q", print, callback=callback))
        publisher = Publisher(channel, Waiters(channel))
        with pytest.raises(BackendUnavailable, match="Channel is closed"):
            await publisher.publish("x", "k", message_format.Encoded(b"", {}, "id"))

    run(scenario())
    gc.collect()  # a failed future nobody awaited reports itself when collected
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_a_consumer_closed_by_the_brokers_consumer_timeout_says_what_to_do():
    from services.adapters.rabbitmq.channels import consumer_closed
    from services.domain.errors import BackendUnavailable, FailedPrecondition

    # As RabbitMQ 3.10 closes the channel (reply 406) of a consumer that held a delivery too long.
    late = consumer_closed("(406, 'PRECONDITION_FAILED - delivery acknowledgement on channel 3 timed out. "
                           "Timeout value used: 1800000 ms. This timeout value can be configured, see consumers doc guide')")
    assert isinstance(late, FailedPrecondition) and "answer each delivery sooner" in str(late)
    gone = consumer_closed("(320, 'CONNECTION_FORCED - broker forced connection closure')")
    assert isinstance(gone, BackendUnavailable) and "CONNECTION_FORCED" in str(gone)
    assert isinstance(consumer_closed(None), BackendUnavailable)
