"""mailq end to end, as an operator runs it, against the in-process suite."""

import json
import subprocess
import sys
import uuid

from tests.harness import ROOT


def mailq(suite, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    targets = ["--enqueue", suite.enqueue.target, "--dequeue", suite.dequeue.target,
               "--browse", suite.browse.target, "--blob", suite.blob.target]
    r = subprocess.run([sys.executable, "-m", "mailq", *targets, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
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


def test_errors_say_what_to_do(suite):
    r = mailq(suite, "show", "no-such-queue", ok=False)
    assert "NOT_FOUND" in r.stderr and "mailq queues" in r.stderr
    r = mailq(suite, "delete", "x", ok=False)
    assert "exactly one of --sender, --recipient, --name" in r.stderr
    r = mailq(suite, "republish", "x", "--older-than", "soon", ok=False)
    assert "use a number and a unit" in r.stderr
