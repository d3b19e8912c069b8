"""stack/harness.py and stack/services.py without the stack: names, processes, the CLI's edges."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from stack import harness, services

# A stand-in service: a module ``fake_svc`` (run as ``python -m fake_svc``) from a folder on PYTHONPATH.
FAKE = """
import signal, sys, time
if len(sys.argv) > 1 or __import__("os").environ.get("FAKE_EXIT"):
    sys.stderr.write("fake: giving up\\n")
    sys.exit(3)
if __import__("os").environ.get("FAKE_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if __import__("os").environ.get("FAKE_READY"):
    open(__import__("os").environ["FAKE_READY"], "w").close()  # its handler is set
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def fake(tmp_path):
    (tmp_path / "fake_svc.py").write_text(FAKE)
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_a_mail_queue_has_a_work_queue_per_priority_class_and_a_dead_letter_queue():
    queues, exchanges = harness.mail_queue_objects("q1")
    assert queues == ["mailqueue.q1.work.high", "mailqueue.q1.work", "mailqueue.q1.work.low", "mailqueue.q1.dead-letter"]
    assert exchanges == ["mailqueue.q1", "mailqueue.q1.dead-letter"]


def test_alive_needs_the_service_name_and_a_process_that_is_no_zombie():
    proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()", "-m", "blob_svc"])
    try:
        # Until its exec: before, /proc shows this process's command line.
        harness.wait_until(lambda: harness.alive(proc.pid, "blob"), 10, what="the child's exec")
        assert harness.alive(proc.pid, "blob")
        assert not harness.alive(proc.pid, "browse")
        os.kill(proc.pid, signal.SIGKILL)
        harness.wait_until(lambda: not harness.alive(proc.pid, "blob"), 10, what="the killed child gone")
        assert not harness.alive(proc.pid, "blob")  # a zombie (not reaped yet) is gone
    finally:
        proc.kill()
        proc.wait()


def test_a_service_that_ends_before_serving_is_reported_with_its_log(fake, tmp_path):
    log = str(tmp_path / "logs" / "fake.log")
    service = harness.Service("fake", {**fake, "FAKE_EXIT": "1"}, harness.free_port(), log=log)
    with pytest.raises(harness.NotServing, match=f"fake_svc exited with 3 before SERVING: read {log}"):
        service.start(wait=True, deadline=30)
    assert "giving up" in open(log).read()


def test_a_service_not_serving_in_time_names_its_log(fake, tmp_path):
    log = str(tmp_path / "fake.log")
    service = harness.Service("fake", fake, harness.free_port(), log=log)
    try:
        with pytest.raises(harness.NotServing, match=f"not SERVING after 0.3 s: read {log}"):
            service.start(wait=True, deadline=0.3)
    finally:
        service.stop(grace=5)
    assert not service.running()


def test_stop_sends_sigterm_then_sigkill_after_the_grace(fake, tmp_path):
    polite = harness.Service("fake", fake, harness.free_port())
    polite.start(wait=False)
    polite.stop(grace=10)
    assert polite.proc.returncode == -signal.SIGTERM

    ready = tmp_path / "ready"
    stubborn = harness.Service("fake", {**fake, "FAKE_IGNORE_TERM": "1", "FAKE_READY": str(ready)}, harness.free_port())
    stubborn.start(wait=False)
    harness.wait_until(ready.exists, 10, what="the stand-in's SIGTERM handler set")
    assert ready.exists(), "the stand-in never set its SIGTERM handler"
    began = time.monotonic()
    stubborn.stop(grace=0.5)
    assert stubborn.proc.returncode == -signal.SIGKILL and time.monotonic() - began < 5


def test_health_of_a_port_nobody_serves_is_minus_one():
    target = f"127.0.0.1:{harness.free_port()}"
    assert harness.health(target, timeout=0.5) == -1
    assert not harness.is_serving(target, timeout=0.5)


def test_the_services_command_rejects_others_with_exit_2(capsys):
    assert services.main(["restart"]) == 2
    assert services.main([]) == 2
    assert "start|stop|status" in capsys.readouterr().err


def test_status_of_a_stack_dir_with_nothing_running(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MAILQUEUE_STACK_DIR", str(tmp_path))  # no pid files, no CA: no call is made
    assert services.main(["status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["SERVICE", "GRPC", "PID", "METRICS", "HEALTH"]
    assert lines[1] == f"{'blob':<10} {'127.0.0.1:50054':<18} {'-':<8} {':51054':<10} DOWN"
    assert [line.split()[0] for line in lines[1:]] == ["blob", "enqueue", "dequeue", "browse", "webhook"]
