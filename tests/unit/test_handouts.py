"""Hand-out events held to be written with their answer's (services/app/handouts.py): answered in
time, one write carries both; unanswered, written on its own after the delay; a failed write is
carried by the answer or tried again; what is held is written when the stream closes."""

import asyncio
import datetime as dt
import uuid

from services.app.handouts import HandOuts
from services.domain import events as mail_events
from services.domain import model
from services.domain.errors import BackendUnavailable
from tests.unit.aio import run

UTC = dt.timezone.utc


class Log:
    """The event log as HandOuts uses it: each record kept; ``fail`` makes records fail."""

    def __init__(self) -> None:
        self.records: list[list] = []
        self.fail: Exception | None = None
        self.recorded = asyncio.Event()
        self.hold: asyncio.Event | None = None
        self.started = asyncio.Event()

    async def record(self, events) -> None:
        self.started.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            self.recorded.set()
            raise self.fail
        self.records.append(list(events))
        self.recorded.set()

    async def next_record(self) -> None:
        await asyncio.wait_for(self.recorded.wait(), 5)
        self.recorded.clear()


def handed_out(tag: int):
    t = dt.datetime(2026, 1, 1, tzinfo=UTC)
    mail = model.QueuedMail("spool", uuid.uuid4(), t, model.Mail(f"m{tag}.eml", "a@b.c", ("d@e.f",)), ("a" * 64,), 10, t, 0)
    return tag, mail_events.handed_out(mail, 1)


def test_an_answer_within_the_delay_carries_its_hand_out_and_nothing_is_written_alone():
    async def go():
        log = Log()
        h = HandOuts(log, 30.0)
        tags = [handed_out(1), handed_out(2)]
        await h.handed(tags)
        assert await h.answered(1) == [tags[0][1]]
        assert await h.answered(1) == []  # taken once
        assert await h.answered(2) == [tags[1][1]]
        await h.close()
        return log.records

    assert run(go()) == []


def test_a_hand_out_unanswered_past_the_delay_is_written_alone_and_its_answer_carries_none():
    async def go():
        log = Log()
        h = HandOuts(log, 0.05)
        first = handed_out(1)
        await h.handed([first])
        await log.next_record()
        late = await h.answered(1)
        await h.close()
        return log.records, late, first[1]

    records, late, event = run(go())
    assert records == [[event]] and late == []


def test_delay_zero_writes_before_returning_and_a_failure_is_raised():
    async def go():
        log = Log()
        h = HandOuts(log, 0)
        one = handed_out(1)
        await h.handed([one])
        written = list(log.records)
        log.fail = BackendUnavailable("cassandra", "down")
        try:
            await h.handed([handed_out(2)])
        except BackendUnavailable:
            raised = True
        else:
            raised = False
        return written, one[1], raised, await h.answered(1)

    written, event, raised, answered = run(go())
    assert written == [[event]] and raised and answered == []


async def failing_write_under_way() -> tuple[Log, HandOuts, tuple]:
    """One hand-out whose timed write has begun and is held at the log, set to fail once released."""
    log = Log()
    h = HandOuts(log, 0.01)
    one = handed_out(1)
    log.hold = asyncio.Event()
    log.fail = BackendUnavailable("cassandra", "down")
    await h.handed([one])
    await asyncio.wait_for(log.started.wait(), 5)
    return log, h, one


def test_an_answer_meeting_a_write_under_way_waits_for_it_and_carries_the_event_when_it_failed():
    async def go():
        log, h, one = await failing_write_under_way()
        asyncio.get_running_loop().call_soon(log.hold.set)  # released once the answer waits for it
        carried = await h.answered(1)
        log.fail = None
        await h.close()
        return carried, one[1], log.records

    carried, event, records = run(go())
    assert carried == [event]
    assert records == []  # carried by the answer: not held again, not written alone


def test_a_failed_timed_write_is_tried_again_and_what_is_held_at_close_is_written():
    async def go():
        log = Log()
        h = HandOuts(log, 0.02)
        one, two = handed_out(1), handed_out(2)
        log.fail = BackendUnavailable("cassandra", "down")
        await h.handed([one])
        await log.next_record()  # the first try, failed
        log.fail = None
        await log.next_record()  # tried again
        await h.handed([two])
        await h.close()  # two still held: written now
        return log.records, one[1], two[1]

    records, first, second = run(go())
    assert records == [[first], [second]]


def test_a_failed_answer_holds_its_hand_out_again():
    async def go():
        log = Log()
        h = HandOuts(log, 30.0)
        one = handed_out(1)
        await h.handed([one])
        carried = await h.answered(1)
        h.unanswered(1, carried)  # the answer's record failed
        await h.close()
        return log.records, one[1]

    records, event = run(go())
    assert records == [[event]]


def test_an_answer_right_after_the_timer_fired_waits_for_the_hand_out_write_it_began():
    async def go():
        log = Log()
        h = HandOuts(log, 30.0)
        one = handed_out(1)
        await h.handed([one])
        h._flush([1])  # the timer's step: the write task has not run yet
        carried = await h.answered(1)  # the next step: the answer
        written_before_the_answer = list(log.records)
        await h.close()
        return carried, written_before_the_answer, one[1]

    carried, written, event = run(go())
    assert carried == [] and written == [[event]]  # the hand-out first, then (by the caller) the answer


def test_an_answer_whose_record_was_written_does_not_hold_its_hand_out_again():
    from services.app import settlement

    class Side:
        def __init__(self, fail):
            self.events = Log()
            self.events.fail = fail

    async def go():
        ok, failing = Side(None), Side(BackendUnavailable("cassandra", "down"))
        written, unwritten = [handed_out(1)[1]], [handed_out(2)[1]]
        await settlement._record(ok, written, handed_out(1)[1])
        try:
            await settlement._record(failing, unwritten, handed_out(2)[1])
        except BackendUnavailable:
            pass
        return written, len(unwritten)

    written, unwritten = run(go())
    assert written == [] and unwritten == 1  # a step failing after the record holds nothing again


def test_an_answer_cancelled_while_it_waits_for_a_failing_write_leaves_the_event_held_again():
    async def go():
        log, h, one = await failing_write_under_way()
        answer = h.answered(1)
        shielded = answer.send(None)  # run to its wait on that write: the event taken, not carried yet
        try:  # its caller leaves there (the stream ends, the server stops), as a task's cancel does
            answer.throw(asyncio.CancelledError())
        except asyncio.CancelledError:
            shielded.cancel()
        log.hold.set()  # the write fails
        await log.next_record()
        log.fail = None
        await h.close()  # still held: written now, not lost with the answer that left
        return log.records, one[1]

    records, event = run(go())
    assert records == [[event]]
