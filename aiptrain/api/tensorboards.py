"""TensorBoard on a job's output directory, started when the console asks for it
(`POST /v1/projects/P/jobs/J:tensorboard`, an aiptrain method: the service had no such call)
and stopped when no page has asked for IDLE_SECONDS.

Only a server on loopback without tokens starts one: TensorBoard has no authentication of its
own, so it listens on 127.0.0.1 and anyone who can reach the server's port could read it.
TensorBoard is the optional `tensorboard` extra (`pip install 'aiptrain[tensorboard]'`).
"""

from __future__ import annotations

import importlib.util
import logging
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiptrain.api.calls import ApiError
from aiptrain.storage import local_gcs_path

log = logging.getLogger("aiptrain.api")

IDLE_SECONDS = 600  # a console page asks again every minute while it is open
READY_SECONDS = 60  # how long a request waits for a new TensorBoard to listen
STOP_SECONDS = 10


@dataclass
class Board:
    process: subprocess.Popen
    port: int
    logdir: Path
    used: float = field(default_factory=time.monotonic)


class TensorBoards:
    """The TensorBoards this server started, one per job."""

    def __init__(self, idle_seconds: float = IDLE_SECONDS):
        self.idle_seconds = idle_seconds
        self._boards: dict[str, Board] = {}
        self._lock = threading.Lock()
        self._reaper: threading.Thread | None = None
        self._closed = threading.Event()

    def open(self, job_id: str, logdir: Path) -> int:
        """The port of the job's TensorBoard, started now if none runs; ApiError when it cannot run."""
        if importlib.util.find_spec("tensorboard") is None:
            raise ApiError(400, "TensorBoard is not installed here: pip install 'aiptrain[tensorboard]' on the "
                           "server and restart it.", "FAILED_PRECONDITION")
        with self._lock:
            board = self._boards.get(job_id)
            if board and board.process.poll() is None and board.logdir == logdir:
                board.used = time.monotonic()
                return board.port
            if board:
                _stop(board)
            board = self._boards[job_id] = _start(logdir)
            self._start_reaper()
        _wait_until_listening(board)
        return board.port

    def close(self) -> None:
        """Stop every TensorBoard (the server is stopping)."""
        self._closed.set()
        with self._lock:
            for board in self._boards.values():
                _stop(board)
            self._boards.clear()

    def stop_idle(self) -> None:
        with self._lock:
            now = time.monotonic()
            for job_id, board in list(self._boards.items()):
                if now - board.used > self.idle_seconds or board.process.poll() is not None:
                    log.info("stopping the idle TensorBoard of %s", job_id)
                    _stop(board)
                    del self._boards[job_id]

    def _start_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap, name="tensorboard-reaper", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        while not self._closed.wait(min(30.0, self.idle_seconds / 2)):
            self.stop_idle()


def _start(logdir: Path) -> Board:
    port = _free_port()
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
               "--port", str(port)]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    log.info("started TensorBoard on 127.0.0.1:%s for %s (pid %s)", port, logdir, process.pid)
    return Board(process, port, logdir)


def _wait_until_listening(board: Board) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if board.process.poll() is not None:
            raise ApiError(500, f"TensorBoard exited with status {board.process.returncode} at start: run "
                           f"`tensorboard --logdir {board.logdir}` by hand to see why.")
        try:
            with socket.create_connection(("127.0.0.1", board.port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise ApiError(503, f"TensorBoard did not listen within {READY_SECONDS} s: try again.")


def _stop(board: Board) -> None:
    if board.process.poll() is None:
        board.process.terminate()
        try:
            board.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            board.process.kill()
            board.process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def logdir_of(job_dir: str | None, gcs_root: Path | None) -> Path:
    """Where TensorBoard reads the job's output: its job directory on this machine; ApiError otherwise."""
    if not job_dir:
        raise ApiError(400, "The job has no jobDir: TensorBoard needs the directory its trainer writes "
                       "summaries to.", "FAILED_PRECONDITION")
    if job_dir.startswith("gs://"):
        if gcs_root is None:
            raise ApiError(400, f"The job's jobDir [{job_dir}] is on Cloud Storage: run `tensorboard --logdir "
                           f"{job_dir}` where Google credentials are set.", "FAILED_PRECONDITION")

        return local_gcs_path(gcs_root, job_dir)
    return Path(job_dir)
