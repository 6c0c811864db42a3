"""stream-logs of a real job escapes a trainer's control characters on a terminal and pipes its
bytes unchanged."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import uuid
from pathlib import Path

NASTY_TRAINER = '''
import sys
print("colour \\x1b[31mred\\x1b[0m and a title \\x1b]0;pwned\\x07", flush=True)
print("carriage\\rreturn", flush=True)
'''


def nasty_package(tmp_path: Path) -> Path:
    package = tmp_path / "nasty" / "trainer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "task.py").write_text(NASTY_TRAINER)
    return package


def run_on_a_tty(args: list[str], **env: str) -> str:
    """Run `python -m aiptrain ARGS` with stdout on a pseudo-terminal; return what it printed."""
    leader, follower = pty.openpty()
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", "NO_COLOR")}
    process = subprocess.Popen([sys.executable, "-m", "aiptrain", *args], stdout=follower,
                               stderr=subprocess.DEVNULL, env={**environment, **env})
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    process.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode()


def test_stream_logs_escapes_on_a_tty_and_pipes_bytes_unchanged(cli, home, docker_api, minimal_runtime, tmp_path):
    job_id = f"nasty_{uuid.uuid4().hex[:8]}"
    cli("jobs", "submit", "training", job_id, "--package-path", str(nasty_package(tmp_path)),
        "--module-name", "trainer.task", "--region", "us-central1", "--runtime-version", minimal_runtime,
        "--stream-logs", check_code=0)
    piped = subprocess.run([sys.executable, "-m", "aiptrain", "jobs", "stream-logs", job_id, "--task-name",
                            "master-replica-0"], capture_output=True, check=True).stdout  # bytes, as written
    assert b"colour \x1b[31mred\x1b[0m and a title \x1b]0;pwned\x07\n" in piped
    assert b"carriage\rreturn\n" in piped
    # The plain lines on a terminal (NO_COLOR): the trainer's control bytes shown, none sent.
    on_tty = run_on_a_tty(["jobs", "stream-logs", job_id, "--task-name", "master-replica-0"], NO_COLOR="1")
    assert "colour \\x1b[31mred\\x1b[0m and a title \\x1b]0;pwned\\x07" in on_tty
    assert "carriage\\x0dreturn" in on_tty
    assert "\x1b" not in on_tty and "\x07" not in on_tty
    # The live view colours its own columns, and shows the trainer's bytes escaped all the same.
    live = run_on_a_tty(["jobs", "stream-logs", job_id, "--task-name", "master-replica-0"])
    assert "\\x1b]0;pwned\\x07" in live and "\x1b]0;pwned" not in live and "\x07" not in live
