"""stack/prerequisites.sh, the first step of `make install`: a machine without a tool the project
builds with is told which, and how to get it, before anything is installed."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from stack.harness import ROOT

SCRIPT = Path(ROOT) / "stack" / "prerequisites.sh"


def run(path: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MAILQUEUE_JAVA"} | {"PATH": path}
    return subprocess.run([shutil.which("bash") or "/bin/bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=60)


def test_this_machine_has_every_prerequisite():
    assert run(os.environ["PATH"]).returncode == 0


def test_a_machine_without_go_maven_and_node_is_told_what_to_install(tmp_path):
    for tool in ("sort", "head", "sed"):  # what the script itself runs, and a Python, and nothing else
        os.symlink(shutil.which(tool), tmp_path / tool)
    os.symlink(os.path.realpath(sys.executable), tmp_path / "python3")
    result = run(str(tmp_path))
    assert result.returncode == 1
    assert "Go >= 1.24" in result.stderr
    assert "apt-get install maven" in result.stderr
    assert "apt-get install nodejs npm" in result.stderr
