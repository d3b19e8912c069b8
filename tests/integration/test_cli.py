"""mailq end to end, as an operator runs it (the installed entry point, from another directory),
against the in-process suite."""

import json
import os
import pathlib
import pty
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from stack.harness import wait_until
from tests.conftest import own_queue
from tests.integration.helpers import delivered, enqueue_names, message_count

#: The console script `pip install` made, as an operator calls it.
MAILQ = pathlib.Path(sys.executable).parent / "mailq"


def mailq(suite, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    targets = ["--enqueue", suite.enqueue.target, "--dequeue", suite.dequeue.target,
               "--browse", suite.browse.target, "--blob", suite.blob.target]
    r = subprocess.run([str(MAILQ), *targets, *args], cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=60)
    assert (r.returncode == 0) is ok, r.stderr
    return r


def test_an_operator_session(suite, tmp_path):
    queue = own_queue("cli")
    eml = tmp_path / "m.eml"
    eml.write_bytes(b"Subject: hi\r\n\r\nhello\r\n")
    assert "created" in mailq(suite, "create", queue).stdout
    first = mailq(suite, "enqueue", queue, str(eml), "--from", "a@example.com", "--to", "b@example.org",
                  "--to", "c@example.org").stdout.split()[0]
    mailq(suite, "enqueue", queue, str(eml), "--to", "bounce@example.org", "--name", "bounce")
    # The null sender as mailq prints it and its help names the default: it was refused as an address
    mailq(suite, "enqueue", queue, str(eml), "--from", "<>", "--to", "bounce@example.org", "--name", "bounce")
    assert queue in mailq(suite, "queues").stdout.split()
    assert mailq(suite, "size", queue).stdout.strip() == "3"
    shown = mailq(suite, "show", queue).stdout
    assert "size             3" in shown
    table = mailq(suite, "browse", queue).stdout
    assert "a@example.com" in table and "<>" in table and "bounce" in table
    rows = [json.loads(line) for line in mailq(suite, "browse", queue, "--json").stdout.splitlines()]
    assert [r["enqueue_id"] for r in rows][0] == first
    assert [json.loads(line)["enqueue_id"] for line in mailq(suite, "browse", queue, "--json", "--id", first).stdout.splitlines()] == [first]
    deleted = mailq(suite, "delete", queue, "--recipient", "bounce@example.org")
    assert "2 mail(s) deleted" in deleted.stdout and "scanned" not in deleted.stderr  # progress on a terminal only
    out = tmp_path / "out"
    got = mailq(suite, "dequeue", queue, "-n", "1", "--out", str(out)).stdout
    assert first in got
    assert (out / f"{first}.eml").read_bytes() == eml.read_bytes()
    assert mailq(suite, "size", queue).stdout.strip() == "0"
    assert "0 mail(s) flushed" in mailq(suite, "flush", queue).stdout
    assert "republished" in mailq(suite, "republish", queue, "--older-than", "1h").stdout
    assert "deleted" in mailq(suite, "clear", queue, "--force").stdout
    assert "bucket_count" in mailq(suite, "config", "get").stdout


def test_delays_flush_and_retry_policy_from_the_command_line(suite, tmp_path):
    queue = own_queue("cli")
    eml = tmp_path / "m.eml"
    eml.write_bytes(b"Subject: later\r\n\r\nhello\r\n")
    assert "created" in mailq(suite, "create", queue, "--initial-backoff", "30s", "--max-attempts", "3").stdout
    assert "backoff 30s x2 up to 1h; expires after 3 attempts or 5d" in mailq(suite, "show", queue).stdout
    # Created again: the same policy is fine; another one is said, left as it is, and exits 1 (it was
    # "already exists", exit 0, the policy silently not applied)
    assert "with that retry policy" in mailq(suite, "create", queue, "--max-attempts", "3").stdout
    other = mailq(suite, "create", queue, "--max-attempts", "10", "--initial-backoff", "30s", ok=False)
    assert other.returncode == 1 and "max_attempts differ" in other.stderr and f"mailq retry-policy {queue}" in other.stderr
    assert "expires after 3 attempts" in mailq(suite, "show", queue).stdout
    eid = mailq(suite, "enqueue", queue, str(eml), "--from", "a@example.com", "--to", "b@Example.ORG", "--delay", "10m").stdout.split()[0]
    mailq(suite, "enqueue", queue, str(eml), "--to", "c@example.net", "--delay", "10m")
    assert "(0 ready, 2 delayed, 0 held)" in mailq(suite, "show", queue).stdout
    assert eid[:8] in mailq(suite, "browse", queue, "--delayed").stdout
    assert eid[:8] not in mailq(suite, "browse", queue, "--ready").stdout
    assert "1 mail(s) flushed" in mailq(suite, "flush", queue, "--domain", "example.org").stdout
    got = mailq(suite, "dequeue", queue, "--ack", "retry", "--retry-after", "5m").stdout
    assert eid in got and "attempt 1" in got
    row = json.loads(mailq(suite, "browse", queue, "--json", "--id", eid[:8]).stdout)  # the 8 characters browse prints
    assert row["enqueue_id"] == eid and row["attempts"] == 1 and "deliver_at" in row
    assert row["mail"]["name"] == ""  # no --name: no name (not the file's, which every mail of it would share)
    assert "(0 ready, 2 delayed, 0 held)" in mailq(suite, "show", queue).stdout
    assert "expires after 3 attempts or 1d" in mailq(suite, "retry-policy", queue, "--max-age", "1d").stdout
    r = mailq(suite, "flush", queue, "--domain", "x.org", "--name", "n", ok=False)
    assert "at most one of --sender, --recipient, --domain, --name" in r.stderr


def test_errors_say_what_to_do(suite):
    r = mailq(suite, "show", "no-such-queue", ok=False)
    assert "NOT_FOUND" in r.stderr and "mailq queues" in r.stderr
    r = mailq(suite, "delete", "x", ok=False)
    assert "exactly one of --sender, --recipient, --name" in r.stderr
    r = mailq(suite, "republish", "x", "--older-than", "soon", ok=False)
    assert "use a number and a unit" in r.stderr


def test_mailq_events_against_a_service_that_is_not_there_exits_1_with_the_hint(suite):
    # It waited for ever (--count), or exited 0 after --for, taking the refusal for a cut stream.
    from stack.harness import free_port

    nobody = f"127.0.0.1:{free_port()}"
    for args in (("events", "--count", "1"), ("events", "--for", "3")):
        began = time.monotonic()
        r = subprocess.run([str(MAILQ), "--browse", nobody, *args], cwd=tempfile.gettempdir(), capture_output=True,
                           text=True, timeout=60)
        assert (r.returncode, "is the service up and reachable?" in r.stderr) == (1, True), (args, r.returncode, r.stderr)
        assert time.monotonic() - began < 10 and "resuming" not in r.stderr


def test_a_token_is_never_sent_in_plaintext_to_another_machine(suite):
    # mq.example.invalid is never dialled: refused before any connection (exit 2, a usage error).
    r = subprocess.run([str(MAILQ), "--host", "mq.example.invalid", "--token", "t0ken", "queues"], cwd=tempfile.gettempdir(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "never sent in plaintext to mq.example.invalid" in r.stderr and "--tls-ca" in r.stderr, r.stderr
    r = run(suite, "--token", "t0ken", "queues")  # the suite's services: on this machine, plaintext is fine
    assert r.returncode == 0, r.stderr


def test_a_call_that_gets_no_answer_ends_after_the_timeout_with_the_hint(tmp_path):
    # A browse_svc whose handlers hang (a stuck event loop): mailq waited for ever.
    import concurrent.futures
    import threading

    import grpc

    release = threading.Event()

    class Hanging(grpc.GenericRpcHandler):
        def service(self, details):  # noqa: ANN001
            if details.method.endswith(("/Browse", "/BrowseDeadLetters")):  # streams, bounded too (they waited for ever)
                return grpc.unary_stream_rpc_method_handler(lambda request, context: iter([b""] if release.wait(60) else []))
            return grpc.unary_unary_rpc_method_handler(lambda request, context: release.wait(60) and b"")

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((Hanging(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        for command in (["queues"], ["browse", "q"], ["dead", "list", "q"]):
            began = time.monotonic()
            r = subprocess.run([str(MAILQ), "--browse", f"127.0.0.1:{port}", "--timeout", "2", *command], cwd=tempfile.gettempdir(),
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 1 and "DEADLINE_EXCEEDED" in r.stderr and "no answer within --timeout" in r.stderr, (command, r.stderr)
            assert 2 <= time.monotonic() - began < 20
    finally:
        release.set()
        server.stop(0)


def test_hold_rules_and_release_from_the_command_line(suite):
    queue = own_queue("cli")
    mailq(suite, "create", queue)
    out = mailq(suite, "hold", "--queue", queue, "--domain", "slow.example", "--for", "2h", "--reason", "their MX is down").stdout
    rule_id = out.split()[0]
    assert " hold until " in out
    table = mailq(suite, "rules").stdout
    assert rule_id in table and f"queue={queue} domain=slow.example" in table and "their MX is down" in table
    assert "0 held mail(s) released" in mailq(suite, "release", rule_id).stdout
    assert rule_id not in mailq(suite, "rules").stdout
    r = mailq(suite, "release", rule_id, ok=False)
    assert "NOT_FOUND" in r.stderr
    r = mailq(suite, "bounce", ok=False)
    assert "needs a condition" in r.stderr



def run(suite, *args: str, **options) -> subprocess.CompletedProcess:
    """mailq as a shell runs it, whatever its exit status; ``options`` for subprocess.run."""
    targets = ["--enqueue", suite.enqueue.target, "--dequeue", suite.dequeue.target,
               "--browse", suite.browse.target, "--blob", suite.blob.target]
    options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **options}
    return subprocess.run([str(MAILQ), *targets, *args], cwd=tempfile.gettempdir(), text=True, timeout=60, **options)


@pytest.mark.parametrize("n, ack", [(3, "success"), (5, "retry"), (70, "success")])
def test_dequeue_of_n_mails_from_a_deeper_queue_hands_out_n_and_no_more(suite, tmp_path, n, ack):
    """Each answer frees a delivery's credit: answered one by one, the server handed out more mails
    before it read the half-close, and mailq left them unanswered (each an attempt of the broker's
    delivery limit spent, and a hand-out recorded that nobody saw)."""
    queue = suite.new_queue()
    enqueue_names(suite, queue, [f"m{i}" for i in range(n + 20)])
    handed = suite.metric("dequeue", "mailqueue_delivered_total", queue=queue)
    extra = ("--retry-after", "1h") if ack == "retry" else ()
    r = run(suite, "dequeue", queue, "-n", str(n), "--ack", ack, *extra)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == n, r.stderr
    wait_until(lambda: message_count(queue) == 20, 10, what="the other 20 back in the queue, ready")
    assert suite.metric("dequeue", "mailqueue_delivered_total", queue=queue) - handed == n
    assert suite.size(queue) == (n + 20 if ack == "retry" else 20)


def test_dequeue_ends_with_status_3_when_no_mail_comes(suite):
    """Given an empty queue, when mailq dequeue waits 1 s, then it says so and exits 3 (no
    CANCELLED, no traceback); given one mail and -n 2, it answers that one, says no more came, exits 0."""
    queue = suite.new_queue()
    r = run(suite, "dequeue", queue, "--wait", "1")
    assert r.returncode == 3, r.stderr
    assert r.stderr == f"mailq dequeue: no mail from {queue} within 1 s (empty, or its mails are delayed, held or throttled: mailq show lists them)\n"
    eid = suite.enqueue_mail(queue, "m").enqueue_id
    r = run(suite, "dequeue", queue, "-n", "2", "--wait", "2")
    assert r.returncode == 0 and eid in r.stdout, r.stderr
    assert r.stderr == "1 mail(s) dequeued (no more within 2 s)\n"
    assert suite.size(queue, exact=True) == 0  # the answer sent before the half-close was settled


def test_a_closed_pipe_ends_mailq_quietly_with_status_141(suite):
    """Given stdout a pipe nobody reads any more (mailq show Q | head, once head has ended), mailq
    ends with status 141, like any Unix tool, without a traceback or an [Errno 32]."""
    queue = suite.new_queue()
    suite.enqueue_mail(queue, "m")
    for command in ("show", "browse"):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            r = run(suite, command, queue, stdout=write_end)
        finally:
            os.close(write_end)
        assert r.returncode == 141 and "Errno" not in r.stderr and "Traceback" not in r.stderr, (command, r.stderr)


def test_progress_is_shown_on_a_terminal_only(suite):
    """``mailq clear`` without --force deletes nothing. Given stderr a terminal, a long operation
    shows its progress on one line rewritten in place and ends it; given stderr a pipe (test_an_operator_session), none: only the result, on stdout."""
    queue = suite.new_queue()
    suite.enqueue_mail(queue, "m")
    refused = run(suite, "clear", queue)  # one word from `throttle clear`: without --force, nothing deleted
    assert refused.returncode == 2 and "add --force" in refused.stderr and refused.stdout == ""
    master, terminal = pty.openpty()
    try:
        r = run(suite, "clear", queue, "--force", stderr=terminal)
        os.close(terminal)
        shown = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other end is closed and read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(master)
    assert r.returncode == 0 and r.stdout == "1 mail(s) deleted\n"
    assert shown.startswith(b"\rclearing: ") and b"1 deleted" in shown and shown.endswith(b"\r\n"), shown


def test_usage_errors_exit_2(suite):
    """A command line that cannot be right exits 2 with what to give; config set without an
    option changes nothing (it never reads its input)."""
    r = run(suite, "config", "set", input="slice_window 30m\nbucket_count 4\n")
    assert r.returncode == 2 and "give --slice-window, --buckets or --pace" in r.stderr
    r = run(suite, "flush", "x", "--domain", "a.org", "--name", "n")
    assert r.returncode == 2 and "at most one of" in r.stderr
    r = run(suite, "dead", "purge", "x")  # like delete and flush, before any call
    assert r.returncode == 2 and "give a condition" in r.stderr
    r = run(suite, "--browse", "127.0.0.1:99999", "queues")  # it dialled port 34463 (99999 mod 65536)
    assert r.returncode == 2 and "port 1 to 65535" in r.stderr
    r = run(suite, "dequeue", "x", "--retry-after", "5m")  # went out with a SUCCESS: the mail gone, not retried
    assert r.returncode == 2 and "--retry-after goes with --ack retry" in r.stderr
    r = run(suite, "config", "set", "--slice-window", "0s", "--buckets", "4")  # 0s was "not given": the window unchanged
    assert r.returncode == 2 and "above 0s" in r.stderr and r.stdout == ""
    r = run(suite, "events", "--type", "swept")  # offered by --help, then refused by the server (exit 1)
    assert r.returncode == 2 and "mail history only" in r.stderr
    for option in ("--max-attempts", "--multiplier"):  # 0 went out as "unset": the policy unchanged, exit 0
        for command in ("create", "retry-policy"):
            r = run(suite, command, "x", option, "0")
            assert r.returncode == 2 and "out of range" in r.stderr and r.stdout == "", (command, option, r.stderr)


def test_a_retry_after_the_api_refuses_is_a_usage_error_before_a_mail_is_taken(suite, tmp_path):
    """Past the longest delay (366 days) the server refuses the RETRY: the mail went back with an
    attempt spent, and mailq had printed it retried."""
    queue = own_queue("cli")
    eml = tmp_path / "m.eml"
    eml.write_bytes(b"Subject: hi\r\n\r\nhello\r\n")
    mailq(suite, "create", queue)
    mailq(suite, "enqueue", queue, str(eml), "--to", "b@example.org")
    for args in (("dequeue", queue, "--ack", "retry", "--retry-after", "400d"), ("enqueue", queue, str(eml), "--to", "b@example.org",
                                                                                "--delay", "367d")):
        r = run(suite, *args)
        assert r.returncode == 2 and "longer than 366d" in r.stderr and r.stdout == "", (args, r.stderr)
    assert delivered(suite, queue) == 0 and message_count(queue) == 1  # nothing taken, nothing added
    assert "[success] attempt 1" in mailq(suite, "dequeue", queue).stdout  # the mail, on its first attempt


def test_an_empty_condition_is_a_usage_error_and_changes_nothing(suite, tmp_path):
    # "$NAME" of an unset variable: delete would take every unnamed mail, move every mail.
    queue, other = own_queue("cli"), own_queue("cli")
    eml = tmp_path / "m.eml"
    eml.write_bytes(b"Subject: hi\r\n\r\nhello\r\n")
    for q in (queue, other):
        mailq(suite, "create", q)
    mailq(suite, "enqueue", queue, str(eml), "--to", "b@example.org")  # no --name: an unnamed mail
    for args in (("delete", queue, "--name", ""), ("move", queue, other, "--sender", " "),
                 ("flush", queue, "--domain", ""), ("dead", "purge", queue, "--recipient", ""), ("browse", queue, "--name", "")):
        r = run(suite, *args)
        assert r.returncode == 2 and "an empty value selects nothing you meant" in r.stderr and "'<>'" in r.stderr, (args, r.stderr)
    assert suite.size(queue, exact=True) == 1 and suite.size(other, exact=True) == 0


def test_what_mailq_cannot_use_is_named_with_what_to_do(suite, tmp_path):
    """An unreadable file, a malformed id, a relative secret file, a CA that is no certificate: each
    named, with what to give, before any call; the usage ones exit 2. A NOT_FOUND hints where the
    command's own names are listed."""
    queue = own_queue("cli")
    mailq(suite, "create", queue)
    for missing in (str(tmp_path / "nofile.eml"), str(tmp_path)):
        r = mailq(suite, "enqueue", queue, missing, "--to", "b@example.org", ok=False)
        assert r.returncode == 1 and missing in r.stderr and "Exception iterating" not in r.stderr, r.stderr
    assert "(0 ready, 0 delayed, 0 held)" in mailq(suite, "show", queue).stdout  # nothing was sent
    r = run(suite, "trace", "nonsense")
    assert r.returncode == 2 and "hexadecimal digits" in r.stderr
    r = run(suite, "trace", "deadbeef")
    assert r.returncode == 1 and "for a delivered or removed mail give its full id, or --name" in r.stderr
    r = run(suite, "webhook", "add", "rel", "http://127.0.0.1:9/hooks", "--secret-file", "secret")
    assert r.returncode == 2 and "'secret' is relative: give the absolute path as webhook_svc sees it" in r.stderr
    assert "rel" not in mailq(suite, "webhook", "list").stdout
    not_pem = tmp_path / "not-a-ca.pem"
    not_pem.write_text("localhost\n")
    r = run(suite, "--tls-ca", str(not_pem), "queues")
    assert r.returncode == 2 and "holds no PEM certificate" in r.stderr, r.stderr
    r = mailq(suite, "webhook", "remove", "no-such-hook", ok=False)
    assert "NOT_FOUND" in r.stderr and "mailq webhook list" in r.stderr and "mailq queues" not in r.stderr


OUT_OF_RANGE = [
    ("browse", "Q", "--limit", "-1"), ("browse", "Q", "--limit", "99999999999"), ("dead", "redrive", "Q", "--rate", "-1"),
    ("create", "Q", "--max-attempts", "-1"), ("create", "Q", "--max-age", "99999999999d"),
    ("hold", "--queue", "Q", "--for", "999999999d"), ("dequeue", "Q", "-n", "0"), ("dequeue", "Q", "--wait", "inf"),
    ("dequeue", "Q", "--wait", "-1"), ("shape", "Q", "--top", "-1"), ("quota", "set", "tenant", "acme", "--mails-per-s", "nan"),
    ("throttle", "set", "a.example", "--concurrency", "0"), ("events", "--for", "inf"),
]


def test_numbers_and_durations_out_of_range_are_usage_errors_not_tracebacks(suite):
    """Each was a traceback from the protobuf field it fills, a timer that could not be set, or
    (--top -1) a silently shorter table; now argparse refuses it, exit 2, naming the range."""
    queue = suite.new_queue()
    for argv in OUT_OF_RANGE:
        r = run(suite, *(queue if a == "Q" else a for a in argv))
        assert r.returncode == 2 and "Traceback" not in r.stderr, (argv, r.stderr)
        assert "out of range" in r.stderr or "longer than 36500d" in r.stderr, (argv, r.stderr)


def test_ctrl_c_ends_a_waiting_dequeue_quietly_with_130(suite):
    """Ctrl-C while mailq dequeue waits: no traceback (it drained a stream it had cancelled), exit
    130, and its stream is gone from the broker at once (cancelled, not half-closed)."""
    from stack.harness import wait_until
    from tests.integration.helpers import consumer_count

    queue = suite.new_queue()
    targets = ["--enqueue", suite.enqueue.target, "--dequeue", suite.dequeue.target,
               "--browse", suite.browse.target, "--blob", suite.blob.target]
    # As from a terminal: SIGINT not ignored (a job a shell starts in the background, as a CI runner
    # may run the tests, inherits SIGINT ignored, and mailq then rightly stays: the test said nothing).
    p = subprocess.Popen([str(MAILQ), *targets, "dequeue", queue, "--wait", "60"], cwd=tempfile.gettempdir(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: consumer_count(queue) == 1, 30, what="mailq's stream subscribed")
        p.send_signal(signal.SIGINT)  # as Ctrl-C
        out, err = p.communicate(timeout=10)
    finally:
        p.kill()
    assert p.returncode == 130 and "Traceback" not in err and out == "", err
    wait_until(lambda: consumer_count(queue) == 0, 10, what="the stream gone")


def test_a_consumers_error_text_never_reaches_the_terminal_raw(suite):
    """A REJECT's error text is the consumer's (a remote server's reply): with an escape sequence
    in it, `mailq dead list` and `mailq trace` wrote it to the operator's terminal as is (a title
    rewritten, the screen cleared) and a multi-line reply broke the table. Shown now as escapes;
    the JSON output keeps the text as it is."""
    from stack.harness import wait_until
    from tests.integration.helpers import StreamConsumer

    queue = suite.new_queue()
    enqueue_id = suite.enqueue_mail(queue, "rejected").enqueue_id
    hostile = "550 5.1.1 no such user\r\n\x1b]0;pwned\x07\x1b[2J"
    consumer = StreamConsumer(suite.dequeue_stub, queue, prefetch=1)
    consumer.answer(consumer.next(), "REJECT", error_message=hostile)
    consumer.close()
    wait_until(lambda: "rejected" in mailq(suite, "dead", "list", queue).stdout, 30, what="the dead letter listed")
    for args in (("dead", "list", queue), ("trace", enqueue_id)):
        out = mailq(suite, *args).stdout
        assert "\x1b" not in out and "\x07" not in out and "\\x1b]0;pwned\\x07" in out, (args, out)
        assert len([line for line in out.splitlines() if "pwned" in line]) >= 1 and "\r" not in out
    listed = [json.loads(line) for line in mailq(suite, "dead", "list", queue, "--json").stdout.splitlines()]
    assert hostile in listed[0]["reason_text"]


def test_mailq_dequeue_from_a_stuck_dequeue_svc_ends_after_its_wait_and_timeout(suite, tmp_path):
    """Dequeue is a bidirectional stream, which --timeout's interceptor did not bound: against a
    dequeue_svc that accepted the connection and then stopped (SIGSTOP: a blocked event loop),
    `mailq dequeue --wait 1` waited for ever. It ends after --wait plus --timeout, exit 1."""
    from stack.harness import ServiceProcess

    queue = own_queue("cli")
    mailq(suite, "create", queue)
    stuck = ServiceProcess("dequeue", suite.env)
    try:
        os.kill(stuck.pid, signal.SIGSTOP)
        begun = time.monotonic()
        r = subprocess.run([str(MAILQ), "--dequeue", stuck.target, "--timeout", "2", "dequeue", queue, "--wait", "1"],
                           cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=60)
        took = time.monotonic() - begun
        assert r.returncode == 1 and "DEADLINE_EXCEEDED" in r.stderr, r.stderr
        assert took < 30, took  # --wait 1 + --timeout 2, and mailq's own start
    finally:
        os.kill(stuck.pid, signal.SIGCONT)
        stuck.stop()
