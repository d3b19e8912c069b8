"""mailq end to end, as an operator runs it (the installed entry point, from another directory),
against the in-process suite."""

import json
import pathlib
import subprocess
import sys
import tempfile
import uuid

#: The console script `pip install` made, as an operator calls it.
MAILQ = pathlib.Path(sys.executable).parent / "mailq"


def mailq(suite, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    targets = ["--enqueue", suite.enqueue.target, "--dequeue", suite.dequeue.target,
               "--browse", suite.browse.target, "--blob", suite.blob.target]
    r = subprocess.run([str(MAILQ), *targets, *args], cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=60)
    assert (r.returncode == 0) is ok, r.stderr
    return r


def test_an_operator_session(suite, tmp_path):
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    eml = tmp_path / "m.eml"
    eml.write_bytes(b"Subject: hi\r\n\r\nhello\r\n")
    assert "created" in mailq(suite, "create", queue).stdout
    first = mailq(suite, "enqueue", queue, str(eml), "--from", "a@example.com", "--to", "b@example.org",
                  "--to", "c@example.org").stdout.split()[0]
    mailq(suite, "enqueue", queue, str(eml), "--to", "bounce@example.org", "--name", "bounce")
    assert queue in mailq(suite, "queues").stdout.split()
    assert mailq(suite, "size", queue).stdout.strip() == "2"
    shown = mailq(suite, "show", queue).stdout
    assert "size             2" in shown
    table = mailq(suite, "browse", queue).stdout
    assert "a@example.com" in table and "<>" in table and "bounce" in table
    rows = [json.loads(line) for line in mailq(suite, "browse", queue, "--json").stdout.splitlines()]
    assert [r["enqueue_id"] for r in rows][0] == first
    assert [json.loads(line)["enqueue_id"] for line in mailq(suite, "browse", queue, "--json", "--id", first).stdout.splitlines()] == [first]
    deleted = mailq(suite, "delete", queue, "--recipient", "bounce@example.org")
    assert "1 mail(s) deleted" in deleted.stdout and "scanned" in deleted.stderr  # progress on stderr
    out = tmp_path / "out"
    got = mailq(suite, "dequeue", queue, "-n", "1", "--out", str(out)).stdout
    assert first in got
    assert (out / f"{first}.eml").read_bytes() == eml.read_bytes()
    assert mailq(suite, "size", queue).stdout.strip() == "0"
    assert "0 mail(s) flushed" in mailq(suite, "flush", queue).stdout
    assert "republished" in mailq(suite, "republish", queue, "--older-than", "1h").stdout
    assert "deleted" in mailq(suite, "clear", queue).stdout
    assert "bucket_count" in mailq(suite, "config", "get").stdout


def test_delays_flush_and_retry_policy_from_the_command_line(suite, tmp_path):
    queue = f"cli-{uuid.uuid4().hex[:8]}"
    eml = tmp_path / "m.eml"
    eml.write_bytes(b"Subject: later\r\n\r\nhello\r\n")
    assert "created" in mailq(suite, "create", queue, "--initial-backoff", "30s", "--max-attempts", "3").stdout
    assert "backoff 30s x2 up to 1h; expires after 3 attempts or 5d" in mailq(suite, "show", queue).stdout
    eid = mailq(suite, "enqueue", queue, str(eml), "--from", "a@example.com", "--to", "b@Example.ORG", "--delay", "10m").stdout.split()[0]
    mailq(suite, "enqueue", queue, str(eml), "--to", "c@example.net", "--delay", "10m")
    assert "(0 ready, 2 delayed, 0 held)" in mailq(suite, "show", queue).stdout
    assert eid[:8] in mailq(suite, "browse", queue, "--delayed").stdout
    assert eid[:8] not in mailq(suite, "browse", queue, "--ready").stdout
    assert "1 mail(s) flushed" in mailq(suite, "flush", queue, "--domain", "example.org").stdout
    got = mailq(suite, "dequeue", queue, "--ack", "retry", "--retry-after", "5m").stdout
    assert eid in got and "attempts 0" in got
    row = json.loads(mailq(suite, "browse", queue, "--json", "--id", eid[:8]).stdout)  # the 8 characters browse prints
    assert row["enqueue_id"] == eid and row["attempts"] == 1 and "deliver_at" in row
    assert "name" not in row["mail"]  # no --name: no name (not the file's, which every mail of it would share)
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


def test_hold_rules_and_release_from_the_command_line(suite):
    queue = f"cli-{uuid.uuid4().hex[:8]}"
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
