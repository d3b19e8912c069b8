"""mailq's streamed operations (drop, delete, move, redrive, purge) cut short say how to complete them."""

import grpc
import pytest

from mailq.common import follow
from mailqueue.v1 import admin_pb2

AGAIN = "mailq drop: the delete of q did not finish: run it again to complete it"


class Cut(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


def stream(then: BaseException, messages: int = 1, done: bool = False):
    for _ in range(messages):
        yield admin_pb2.DeleteQueueResponse(phase="done" if done else "waiting", done=done)
    raise then


@pytest.mark.parametrize("then", [KeyboardInterrupt(), Cut(grpc.StatusCode.UNAVAILABLE), Cut(grpc.StatusCode.DEADLINE_EXCEEDED)])
def test_a_stream_cut_after_it_began_says_to_run_it_again_and_keeps_its_error(then, capsys):
    with pytest.raises(type(then)):
        follow(stream(then), lambda r: r.phase, AGAIN)
    assert AGAIN in capsys.readouterr().err


@pytest.mark.parametrize("then,messages,done", [
    (Cut(grpc.StatusCode.NOT_FOUND), 0, False),  # refused before it began
    (Cut(grpc.StatusCode.UNAVAILABLE), 0, False),  # the service is down: the hint says so, nothing began
    (Cut(grpc.StatusCode.FAILED_PRECONDITION), 1, False),  # refused after its first message (mail came meanwhile)
    (Cut(grpc.StatusCode.ABORTED), 1, False),  # the queue was made again meanwhile: running it again would delete that one
    (Cut(grpc.StatusCode.UNAVAILABLE), 1, True),  # done, then the connection went
])
def test_a_refusal_or_a_finished_operation_does_not_say_to_run_it_again(then, messages, done, capsys):
    with pytest.raises(Cut):
        follow(stream(then, messages, done), lambda r: r.phase, AGAIN)
    assert AGAIN not in capsys.readouterr().err
