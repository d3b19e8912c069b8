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


def test_a_library_message_repeated_during_an_outage_passes_once_a_window_and_says_how_many_were_left_out(configured):
    # Given the filter with a clock the test moves, behind a handler as configure() puts it
    now = [0.0]
    repeats = logs.Repeats(window_s=30, clock=lambda: now[0])
    connector = logging.getLogger("pika.adapters.utils.connection_workflow")

    def passes(logger: logging.Logger, msg: str, *args: object, level: int = logging.ERROR) -> bool:
        return repeats.filter(logger.makeRecord(logger.name, level, __file__, 1, msg, args, None))

    # When pika says the same failure 400 times in 29 s, with other arguments each time
    said = [passes(connector, "AMQPConnector - reporting failure: %r", f"attempt {i}") for i in range(400)]
    # Then the first passes, the rest are left out; another message, and the services' own lines, still pass
    assert said[0] and not any(said[1:])
    assert passes(connector, "Socket failed to connect: %r", "refused")
    assert all(passes(logging.getLogger("services.app.settlement"), "delivery limit reached") for _ in range(3))
    # And once the window has passed, the next one passes, saying how many were left out
    now[0] = 31
    record = connector.makeRecord(connector.name, logging.ERROR, __file__, 1, "AMQPConnector - reporting failure: %r", ("x",), None)
    assert repeats.filter(record) and record.suppressed == 399


def test_configure_collapses_library_repeats_unless_debugging(configured):
    logs.configure("enqueue")
    for _ in range(50):
        logging.getLogger("cassandra.cluster").warning("Host %s has been marked down", "127.0.0.1:9042")
    assert len(configured()) == 1
    logs.configure("enqueue", "DEBUG")
    for _ in range(5):
        logging.getLogger("cassandra.cluster").warning("Host %s has been marked down", "127.0.0.1:9042")
    assert len(configured()) == 5
