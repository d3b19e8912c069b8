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


def stream(then: BaseException, messages: int = 1):
    for _ in range(messages):
        yield admin_pb2.DeleteQueueResponse(phase="waiting")
    raise then


@pytest.mark.parametrize("then", [KeyboardInterrupt(), Cut(grpc.StatusCode.UNAVAILABLE), Cut(grpc.StatusCode.INTERNAL)])
def test_a_stream_cut_after_it_began_says_to_run_it_again_and_keeps_its_error(then, capsys):
    with pytest.raises(type(then)):
        follow(stream(then), lambda r: r.phase, AGAIN)
    assert AGAIN in capsys.readouterr().err


def test_a_refusal_before_any_progress_does_not_say_to_run_it_again(capsys):
    with pytest.raises(Cut):
        follow(stream(Cut(grpc.StatusCode.NOT_FOUND), messages=0), lambda r: r.phase, AGAIN)
    assert AGAIN not in capsys.readouterr().err
    # A cut before any progress may have begun all the same (the queue is unlisted first)
    with pytest.raises(Cut):
        follow(stream(Cut(grpc.StatusCode.UNAVAILABLE), messages=0), lambda r: r.phase, AGAIN)
    assert AGAIN in capsys.readouterr().err
