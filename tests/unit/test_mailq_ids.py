"""mailq's enqueue ids: a full id or a unique prefix (mailq/ids.py), resolved against candidates."""

import pytest

from mailq.common import UsageError
from mailq.ids import SHOWN, resolve
from mailqueue.v1 import mail_pb2

A = "3f2a1b9c-0000-4000-8000-00000000000a"
B = "3f2a1b9d-0000-4000-8000-00000000000b"
C = "77aa0000-0000-4000-8000-00000000000c"


def mails(*ids: str) -> list[mail_pb2.QueuedMail]:
    return [mail_pb2.QueuedMail(enqueue_id=i, mail=mail_pb2.Mail(name="hi.eml", sender="a@example.com", recipients=["b@example.org"]))
            for i in ids]


def test_a_unique_prefix_is_the_full_id_and_a_full_id_is_taken_as_given():
    reads = []

    def candidates():
        reads.append(1)
        return mails(A, B, C)

    assert resolve(["3f2a1b9c", "77AA", "3F2A-1B9D"], candidates, "queue q") == [A, C, B]
    assert len(reads) == 1  # one read for every prefix
    assert resolve([A.upper(), A.replace("-", "")], lambda: pytest.fail("no prefix: nothing to read"), "queue q") == [A]


def test_an_ambiguous_prefix_is_refused_with_its_candidates():
    with pytest.raises(SystemExit) as e:
        resolve(["3f2a1b9"], lambda: mails(A, B, C), "queue q")
    message = str(e.value)
    assert "'3f2a1b9' is ambiguous: 2 mails of queue q match" in message and A in message and B in message and C not in message


def test_the_candidates_listed_are_bounded():
    many = [f"3f2a{i:04x}-0000-4000-8000-000000000000" for i in range(SHOWN + 5)]
    with pytest.raises(SystemExit) as e:
        resolve(["3f2a"], lambda: mails(*many), "queue q")
    assert f"{SHOWN + 5} mails of queue q match" in str(e.value) and "... and 5 more" in str(e.value)


def test_a_prefix_that_names_nothing_is_refused_with_what_to_do():
    with pytest.raises(SystemExit, match="no live mail of queue q has an enqueue id starting with 'deadbeef' "
                                         r"\(mailq browse lists them\)"):
        resolve(["deadbeef"], lambda: mails(A, B), "queue q")
    with pytest.raises(SystemExit, match=r"'deadbeef' \(give its full id\)"):
        resolve(["deadbeef"], lambda: mails(A, B), "queue q", "give its full id")


@pytest.mark.parametrize("given,message", [
    (["3f2"], "at least 4"),
    (["3f2a!"], "hexadecimal digits"),
    (["xyzw"], "hexadecimal digits"),
])
def test_a_text_that_is_no_prefix_is_a_usage_error(given, message):
    """Exit status 2, as for any wrong command line (mailq --help)."""
    with pytest.raises(UsageError, match=message):
        resolve(given, lambda: pytest.fail("a malformed id reads nothing"), "queue q")


def test_an_enum_value_this_mailq_does_not_know_is_shown_as_its_number_not_a_traceback():
    # A newer server's event type reached mailq events as EventType.Name(99): ValueError, a traceback mid-stream.
    from mailq.common import enum_text
    from mailqueue.v1 import events_pb2

    assert enum_text(events_pb2.EventType, events_pb2.EVENT_TYPE_DELIVERED, "EVENT_TYPE_") == "delivered"
    assert enum_text(events_pb2.EventType, 99, "EVENT_TYPE_") == "unknown(99)"


def test_json_output_has_every_field_and_numbers_as_numbers():
    # --json left out a zero (attempts 0, the null sender, an empty queue's size) and wrote int64 as
    # strings ("size": "12", which jq sorts above every number).
    from mailq.common import as_json
    from mailqueue.v1 import browse_pb2

    info = as_json(browse_pb2.QueueInfo(queue="q", size=12))
    assert info["size"] == 12 and info["delayed"] == 0 and info["ready"] == 0
