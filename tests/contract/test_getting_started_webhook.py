"""The getting-started page's webhook receiver, run as pasted, gets the events of `make run`.

Given the services `make run` starts (webhook_svc among them) and the receiver of
docs/pages/getting-started/first-mail.md written to a file as it is on the page,
when an endpoint is registered with `mailq webhook add` (the page's command, from another
directory) and mails are enqueued and delivered with `mailq`,
then the receiver prints each delivered mail's event (its signature checked by the receiver's own
code: a bad one would be answered 401 and printed nothing), and answers 204.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pytest_codeblocks import extract_from_file

from stack.harness import ROOT, wait_until
from tests.conftest import own_queue
from tests.contract.conftest import CA

PAGE = Path(ROOT) / "docs" / "pages" / "getting-started" / "first-mail.md"
#: The receiver's address, as the page has it.
HOOK = "http://127.0.0.1:8099/hooks"
#: webhook_svc reads the registrations again every 5 s; a new endpoint starts at the next event.
DEADLINE_S = 90


def receiver_code() -> str:
    blocks = [b.code for b in extract_from_file(PAGE) if b.syntax == "python" and "webhook receiver" in b.code]
    assert len(blocks) == 1, f"{PAGE}: one python block holds the webhook receiver, found {len(blocks)}"
    return blocks[0]


def mailq(*args: str, cwd: Path) -> str:
    env = {**os.environ, "MAILQ_TLS_CA": CA, "PATH": os.path.join(ROOT, ".venv", "bin") + os.pathsep + os.environ["PATH"]}
    r = subprocess.run(["mailq", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"mailq {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def printed_within(out: Path, ids: list[str], seconds: float) -> list[str]:
    """The ids the receiver printed, once it printed any of them within ``seconds``; else none."""
    try:
        return wait_until(lambda: [i for i in ids if i in out.read_text()], seconds, 0.2, what="an event at the receiver")
    except AssertionError:
        return []


def test_the_pages_receiver_gets_each_delivered_mails_event_signed(services, tmp_path):
    (tmp_path / "receiver.py").write_text(receiver_code())
    secret = tmp_path / "secret"
    secret.write_text(secrets.token_hex(32))
    out = tmp_path / "receiver.out"
    with open(out, "w") as log:
        receiver = subprocess.Popen([sys.executable, "receiver.py", str(secret)], cwd=tmp_path, stdout=log,
                                    stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    queue = own_queue("gs")  # its broker queues removed after the test, whatever `mailq drop` did
    hook = queue
    mail = tmp_path / "hi.eml"
    mail.write_bytes(b"Subject: hi\r\n\r\nhello\r\n")
    try:
        mailq("create", queue, cwd=tmp_path)
        added = mailq("webhook", "add", hook, HOOK, "--secret-file", str(secret), "--events", "delivered", "rejected", "expired",
                      "dead_lettered", cwd=tmp_path)
        assert added.strip() == (f"added webhook {hook}: {HOOK} (delivered,rejected,expired,dead_lettered of every queue; "
                                 "events older than 86400 s dropped)"), added
        delivered: list[str] = []
        deadline = time.monotonic() + DEADLINE_S
        seen: list[str] = []
        while not seen:
            assert receiver.poll() is None, f"the receiver exited: {out.read_text()}"
            assert time.monotonic() < deadline, (
                f"no event of {len(delivered)} delivered mails reached the receiver in {DEADLINE_S} s: "
                f"{out.read_text()[-2000:]}")
            enqueued = mailq("enqueue", queue, str(mail), "--from", "a@example.com", "--to", "b@example.org", cwd=tmp_path)
            delivered.append(enqueued.split()[0])
            mailq("dequeue", queue, "-n", "1", "--ack", "success", "--out", str(tmp_path / "mails"), cwd=tmp_path)
            # A new endpoint starts at the next event: the first mails may be before it.
            seen = printed_within(out, delivered, 3)
        printed = out.read_text()
        line = next(li for li in printed.splitlines() if seen[0] in li)
        assert re.search(rf"io\.mailqueue\.event\.delivered {queue} {seen[0]}$", line), line
        assert '"POST /hooks HTTP/1.1" 204' in printed and " 401 " not in printed, printed
        # Every mail delivered after the first one seen reaches it too (at least once, in order).
        rest = delivered[delivered.index(seen[0]):]
        wait_until(lambda: all(i in out.read_text() for i in rest), 30, 0.2, what=f"every mail from {seen[0]} at the receiver")
        # A mail its consumer rejects is a dead letter: its REJECTED event is the one the page's
        # filter must take (a reject writes no DEAD_LETTERED; the page's filter missed it).
        rejected = mailq("enqueue", queue, str(mail), "--to", "b@example.org", cwd=tmp_path).split()[0]
        mailq("dequeue", queue, "-n", "1", "--ack", "reject", cwd=tmp_path)
        wait_until(lambda: re.search(rf"io\.mailqueue\.event\.rejected {queue} {rejected}$", out.read_text(), re.M), 30, 0.2,
                   what="the rejected mail's event at the receiver")
        # A forged request is refused 401, whatever its headers: a signature that is not ASCII and a
        # timestamp that is no number crashed the handler (no answer: webhook_svc would retry it).
        import http.client

        for headers in ({"Mailqueue-Timestamp": str(int(time.time())), "Mailqueue-Signature": "sha256=é"},
                        {"Mailqueue-Timestamp": "soon", "Mailqueue-Signature": "sha256=00"}):
            conn = http.client.HTTPConnection("127.0.0.1", 8099, timeout=10)
            conn.request("POST", "/hooks", body=b"[]", headers={**headers, "Content-Length": "2"})
            assert conn.getresponse().status == 401, headers
            conn.close()
    finally:
        subprocess.run([os.path.join(ROOT, ".venv", "bin", "mailq"), "webhook", "remove", hook],
                       env={**os.environ, "MAILQ_TLS_CA": CA}, capture_output=True, timeout=60)
        subprocess.run([os.path.join(ROOT, ".venv", "bin", "mailq"), "drop", queue],
                       env={**os.environ, "MAILQ_TLS_CA": CA}, capture_output=True, timeout=60)
        receiver.kill()
        receiver.wait()
    if receiver.returncode not in (-9, 0):
        pytest.fail(f"the receiver failed: {out.read_text()}")
