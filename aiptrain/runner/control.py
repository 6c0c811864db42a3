"""Finding, starting, waking and stopping the home's controller, from any command.

Imports nothing heavy: `submit`, `describe`, `list` and `cancel` call this on every run.

Whoever holds `controller.lock` (flock) is the controller; the kernel lets it go when the
process dies, so there are no PIDs to trust. A command that finds the lock free takes it and
hands the very same open file to the controller it starts (as submit once handed a job's lock to
its supervisor): there is no moment when two controllers could both believe they own the home.
A controller of another aiptrain version is asked to stop and replaced.

Commands wake the controller through a FIFO in the home (a line per wake): it never blocks a
writer, needs no socket path short enough for AF_UNIX, and a wake with no controller reading is
simply dropped (the next controller looks at every active job when it starts).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aiptrain.codeversion import code_version
from aiptrain.ownership import JobLock
from aiptrain.settings import Settings

WAKE, QUIT = b"wake", b"quit"  # one word per line; a wake may name the job it is about
LOG_KEEP_BYTES = 8 * 1024 * 1024  # the controller's log, before it is set aside at a controller's start
REPLACE_PATIENCE_SECONDS = 60  # how long an outdated controller may take to finish its steps
# Variables naming files or directories that the controller (or a library it calls) reads. It
# runs in "/", so a relative value is made absolute against the starting command's working
# directory, where it meant something.
PATH_VARIABLES = ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "DOCKER_CERT_PATH", "AIPTRAIN_API_TOKEN_FILE")
PATH_LIST_VARIABLES = ("AIPTRAIN_SWARM_SHARED_DIRS",)  # colon-separated


@dataclass(frozen=True)
class ControllerInfo:
    pid: int
    version: str
    started: str  # RFC 3339


def running(settings: Settings) -> ControllerInfo | None:
    """The home's controller, if one runs (its lock is held)."""
    lock = JobLock.try_acquire(settings.controller_lock_path)
    if lock is not None:
        lock.release()
        return None
    try:
        data = json.loads(settings.controller_state_path.read_text())
        return ControllerInfo(int(data["pid"]), str(data["version"]), str(data["started"]))
    except (OSError, ValueError, KeyError):
        return ControllerInfo(0, "", "")  # it holds the lock and has not written its record yet


def ensure_running(settings: Settings) -> None:
    """Start the home's controller unless one runs; replace one of another version."""
    settings.ensure_dirs()
    lock = JobLock.try_acquire(settings.controller_lock_path)
    if lock is None:
        info = running(settings)
        if info is None or not info.version or info.version == code_version():
            if info is None:  # it ended between the two looks
                ensure_running(settings)
            return
        lock = _replace(settings)
        if lock is None:
            return  # another command replaced it first
    try:
        start(settings, lock)
    finally:
        lock.release()


def _replace(settings: Settings) -> JobLock | None:
    """Ask an outdated controller to stop and take its lock once it has."""
    deadline = time.monotonic() + REPLACE_PATIENCE_SECONDS
    asked = False
    while time.monotonic() < deadline:
        lock = JobLock.try_acquire(settings.controller_lock_path)
        if lock is not None:
            return lock
        info = running(settings)
        if info is not None and info.version == code_version():
            return None
        asked = asked or send(settings, QUIT)  # one still starting does not read its FIFO yet
        time.sleep(0.05)
    return None


def start(settings: Settings, lock: JobLock) -> int:
    """Start a detached controller that inherits `lock`; its PID."""
    make_fifo(settings.controller_wake_path)
    keep_log_small(settings.controller_log_path)
    with open(settings.controller_log_path, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "aiptrain.runner.controller", str(lock.fd)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, pass_fds=(lock.fd,),
            start_new_session=True,  # Ctrl-C in the terminal stops a stream, never the jobs
            # `python -m` looks for modules in its working directory first: one with an `aiptrain`
            # folder (a checkout of another version) would have the controller run that code.
            cwd="/",
            env=controller_environment(os.environ, os.getcwd(), settings.home),
        )
    return process.pid


def controller_environment(environ: Mapping[str, str], cwd: str, home: Path) -> dict[str, str]:
    """The starting command's environment for the controller: its home, and the relative paths
    of PATH_VARIABLES and PATH_LIST_VARIABLES made absolute against `cwd`."""
    env = {**environ, "AIPTRAIN_HOME": str(home)}
    for name in PATH_VARIABLES:
        if env.get(name):
            env[name] = os.path.join(cwd, os.path.expanduser(env[name]))
    for name in PATH_LIST_VARIABLES:
        if env.get(name):
            env[name] = ":".join(os.path.join(cwd, os.path.expanduser(p)) if p else p for p in env[name].split(":"))
    return env


def keep_log_small(path: Path) -> None:
    """A controller starts again after every quiet spell, appending to the home's one log: past
    LOG_KEEP_BYTES it becomes `controller.log.1` (the one before that goes), so a home used for
    years keeps two logs' worth."""
    try:
        if path.stat().st_size > LOG_KEEP_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass


def make_fifo(path: Path) -> None:
    try:
        os.mkfifo(path, 0o600)
    except FileExistsError:
        pass


def send(settings: Settings, word: bytes = WAKE, job_id: str = "") -> bool:
    """A word to the controller (about `job_id`: it looks at that job at once); False when no
    controller reads (the FIFO has no reader)."""
    try:
        fd = os.open(settings.controller_wake_path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ENOENT):
            return False
        raise
    try:
        os.write(fd, word + (b" " + job_id.encode() if job_id else b"") + b"\n")  # atomic: under PIPE_BUF
    except BlockingIOError:
        pass  # the FIFO is full of wakes already: the controller will look
    finally:
        os.close(fd)
    return True


def wake(settings: Settings, job_id: str = "") -> None:
    """Tell the controller there is news about a job (recorded, cancelled), starting it if absent."""
    ensure_running(settings)
    send(settings, WAKE, job_id)


def stop(settings: Settings, timeout: float = 60) -> bool:
    """Ask the controller to stop (it finishes the steps in hand; jobs keep running and the next
    command's controller drives them on); True once it has."""
    deadline = time.monotonic() + timeout
    asked = False
    while time.monotonic() < deadline:
        if running(settings) is None:
            return True
        # One that is still starting does not read its FIFO yet: ask until it hears.
        asked = asked or send(settings, QUIT)
        time.sleep(0.05)
    return False
