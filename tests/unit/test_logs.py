"""The services' JSON log lines: pika's warnings for the channel closes the RabbitMQ adapter
handles (403, 404) are left out; every other close stays a warning."""

import json
import logging

import pytest

from services.runtime import logs


@pytest.fixture
def configured(capsys):
    """configure() in the test itself (its handler writes to the stderr captured then); the
    logging state put back after."""
    root, channel = logging.getLogger(), logging.getLogger("pika.channel")
    saved = (root.handlers[:], root.level, channel.filters[:], logging.getLogger("pika").level)

    def lines() -> list[dict]:
        return [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]

    yield lines
    root.handlers[:], root.level, channel.filters[:] = saved[0], saved[1], saved[2]
    logging.getLogger("pika").setLevel(saved[3])


def test_handled_channel_closes_are_left_out_and_others_stay_warnings(configured):
    logs.configure("dequeue")
    pika_channel = logging.getLogger("pika.channel")
    # pika's own call (pika/channel.py _on_close_meta): code, reply text, the channel.
    pika_channel.warning("Received remote Channel.Close (%s): %r on %s", 404, "NOT_FOUND - no queue 'q'", "<Channel 1>")
    pika_channel.warning("Received remote Channel.Close (%s): %r on %s", 403, "ACCESS_REFUSED - access to exchange", "<Channel 1>")
    pika_channel.warning("Received remote Channel.Close (%s): %r on %s", 406, "PRECONDITION_FAILED - unknown delivery tag 7", "<Channel 2>")
    pika_channel.warning("Socket closed when connection was open")
    lines = configured()
    assert [(e["level"], e["logger"], e["msg"][:40]) for e in lines] == [
        ("warning", "pika.channel", "Received remote Channel.Close (406): 'PR"),
        ("warning", "pika.channel", "Socket closed when connection was open"),
    ]


def test_configured_twice_the_filter_is_there_once(configured):
    logs.configure("dequeue")
    logs.configure("dequeue")
    assert sum(isinstance(f, logs.HandledChannelCloses) for f in logging.getLogger("pika.channel").filters) == 1
