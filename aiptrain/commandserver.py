"""The command server: `aiptrain jobs ...` without paying for Python's imports each time.

A `jobs` command spends most of its time importing (pydantic, the Job model, docker-py, rich):
0.15 to 0.25 s of a BASIC resubmit's 0.6 s. While a home's controller runs, it keeps one more
process beside it, this server, which has imported all that once and forks a child per command,
as Mercurial's chg and Python's multiprocessing forkserver do:

  client (aiptrain.launcher)                  server (started by the controller)
  connect to the home's socket  ------------>  checks the peer is the same user
  send argv, cwd, env, umask, its code version,
  and its stdin/stdout/stderr (SCM_RIGHTS) ->  fork; the child takes the client's descriptors,
                                               cwd, environment and umask and runs aiptrain.cli
  forward SIGINT/SIGTERM/SIGHUP to the child   <-- {"pid": child}
  exit with the child's status                 <-- {"exit": status} when the child ends

The child writes to the client's own terminal or pipes, so what it prints, how it detects a
terminal and what a Ctrl-C does are what they are in-process. Anything unusual makes the client
run the command itself: no server (no controller: readers start nothing), another code version
or Python environment, another user at either end, a closed standard descriptor, AIPTRAIN_COMMAND_SERVER=0.

The socket is in Linux's abstract namespace (no path, so no AF_UNIX length limit for deep homes);
both ends check the other's user with SO_PEERCRED, since any local user may connect to, or
squat, an abstract name. The client half is aiptrain.launcher, which is on every command's
start-up path and imports only what the interpreter has built in; it says what goes over the socket.
"""

from __future__ import annotations

import importlib
import io
import marshal
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

from aiptrain import cli, settings
from aiptrain.codeversion import code_version
from aiptrain.launcher import DISABLE_VAR, LENGTH_BYTES, STD_FDS, peer_uid, socket_name

REQUEST_SECONDS = 5.0  # a client has this long to send its request once connected
PARENT_LOOK_SECONDS = 1.0  # how often the server looks whether its controller still runs
BIND_PATIENCE_SECONDS = 5.0  # a predecessor whose controller just went still holds the name
# What the children of the server need, imported once in the server, before any fork. A module
# missing from here is imported by the child that needs it: slower, never wrong.
PRELOADED = (
    "aiptrain.cli", "aiptrain.cli.jobs", "aiptrain.cli.gcloud", "aiptrain.cli.formats", "aiptrain.cli.live",
    "aiptrain.cli.output", "aiptrain.client", "aiptrain.backends.docker", "aiptrain.packaging",
    "aiptrain.staging", "aiptrain.wheelhouse", "aiptrain.installs", "aiptrain.runtimes", "aiptrain.dependencies",
    "aiptrain.gcloud_properties", "aiptrain.storage.gcs", "docker", "yaml", "rich.console", "rich.live",
    # A submit's dependency check (50 ms of imports), and what requests reads at its first request.
    "packaging.requirements", "packaging.tags", "packaging.utils", "netrc",
)


# -- the server ---------------------------------------------------------------------------------


class Server:
    """One process, one thread: accept, fork, report exits. Never runs a command itself."""

    def __init__(self, home: Path, controller_pid: int, version: str):
        self.home, self.controller_pid, self.version = home, controller_pid, version
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}  # child pid -> its client's connection
        self.listener: socket.socket | None = None
        self.signals_r, self.signals_w = os.pipe()
        self.debug = settings.debug()  # says each command it forks, in its log

    def bind(self) -> bool:
        deadline = time.monotonic() + BIND_PATIENCE_SECONDS
        while True:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                listener.bind(socket_name(str(self.home)))
            except OSError:
                listener.close()
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.1)
                continue
            listener.listen(64)
            self.listener = listener
            return True

    def run(self) -> None:
        os.set_blocking(self.signals_w, False)
        signal.set_wakeup_fd(self.signals_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the pipe
        signal.signal(signal.SIGTERM, lambda *_: self.stop_accepting())
        assert self.listener is not None
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.signals_r, selectors.EVENT_READ, "signal")
        while self.listener is not None or self.children:
            try:
                self.serve_once()
            except Exception as exc:  # noqa: BLE001 - one request's trouble never stops the server
                print(f"command server: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def serve_once(self) -> None:
        for key, _ in self.selector.select(PARENT_LOOK_SECONDS):
            if key.data == "accept" and self.listener is not None:
                self.accept()
            elif key.data == "signal":
                os.read(self.signals_r, 4096)
            elif isinstance(key.data, int):  # a client hung up before its command ended
                self.client_gone(key.data)
        self.reap()
        if self.listener is not None and os.getppid() != self.controller_pid:
            self.stop_accepting()  # the controller went: its children finish, none start

    def stop_accepting(self) -> None:
        if self.listener is not None:
            self.selector.unregister(self.listener)
            self.listener.close()
            self.listener = None

    def accept(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        fds: list[int] = []
        try:
            conn.settimeout(REQUEST_SECONDS)
            if peer_uid(conn) != os.getuid():
                conn.close()
                return
            header, fds, _, _ = socket.recv_fds(conn, LENGTH_BYTES, len(STD_FDS))
            request = marshal.loads(_read_exactly(conn, int.from_bytes(header, "big")))  # the same user's bytes
            # Another aiptrain, or the same one in another environment (its own packages): not ours to run.
            if not isinstance(request, dict) or len(fds) != len(STD_FDS) \
                    or (request.get("version"), request.get("python")) != (self.version, sys.executable):
                conn.sendall(b"refused version\n")
                conn.close()
                return
            pid = os.fork()
            if pid == 0:
                self.child(conn, fds, request)  # never returns
            conn.sendall(f"pid {pid}\n".encode())
            if self.debug:
                print(f"command server: {pid} runs aiptrain {' '.join(request['argv'])}", file=sys.stderr, flush=True)
        except (OSError, ValueError, EOFError, TypeError) as exc:  # marshal's refusals among them
            print(f"command server: a request failed: {exc}", file=sys.stderr, flush=True)
            conn.close()
            return
        finally:
            for fd in fds:
                os.close(fd)
        self.children[pid] = conn

        self.selector.register(conn, selectors.EVENT_READ, pid)

    def child(self, conn: socket.socket, fds: list[int], request: dict) -> None:
        """In the forked child: become the client's command, then exit with its status."""
        status = 4
        try:
            signal.set_wakeup_fd(-1)
            for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for sock in (conn, self.listener, *self.children.values()):
                if sock is not None:
                    sock.close()
            os.close(self.signals_r)
            os.close(self.signals_w)
            for fd, std in zip(fds, STD_FDS, strict=True):
                os.dup2(fd, std)
                os.close(fd)
            os.chdir(request["cwd"])
            os.umask(int(request["umask"]))
            os.environ.clear()
            os.environ.update(request["env"])
            _reopen_std_streams()
            sys.argv = ["aiptrain", *request["argv"]]
            try:
                cli.main(request["argv"])
                status = 0
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except KeyboardInterrupt:
            status = 130
        except BaseException:  # noqa: BLE001 - said on the client's stderr, never back in the server loop

            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 - a closed pipe: nothing more to say
                    pass
            os._exit(status)

    def reap(self) -> None:
        while self.children:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            self.stop_watching(conn)
            code = os.waitstatus_to_exitcode(wait_status)
            try:
                conn.sendall(f"exit {code if code >= 0 else 128 - code}\n".encode())
            except OSError:
                pass
            conn.close()

    def client_gone(self, pid: int) -> None:
        """The client's connection closed mid-command: a client killed outright takes its
        command with it, as it would have in-process. A client that sends anything after its
        request breaks the protocol: it is no longer watched (its command runs on)."""
        conn = self.children.get(pid)
        if conn is None:
            return
        self.stop_watching(conn)
        try:
            if conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop_watching(self, conn: socket.socket) -> None:
        try:
            self.selector.unregister(conn)
        except KeyError:
            pass  # already: its client hung up


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(min(size - len(data), 1 << 16))
        if not chunk:
            raise ValueError("the request ended early")
        data += chunk
    return bytes(data)


def _reopen_std_streams() -> None:
    """sys.stdin/stdout/stderr as Python would have opened them for the client's descriptors:
    line-buffered on a terminal, write-through with PYTHONUNBUFFERED."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    encoding = os.environ.get("PYTHONIOENCODING", "").split(":")[0] or "utf-8"

    def text(fd: int, mode: str, errors: str) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        tty = raw.isatty()
        buffered = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
        return io.TextIOWrapper(buffered, encoding=encoding, errors=errors, line_buffering=tty,
                                write_through=unbuffered and mode == "w")

    sys.stdin = text(0, "r", "strict")
    sys.stdout = text(1, "w", "strict")
    sys.stderr = text(2, "w", "backslashreplace")


def main(argv: list[str]) -> int:
    """`python -m aiptrain.commandserver HOME CONTROLLER_PID`, started by the controller (which
    names this module and never imports it); none when the controller's environment turns the
    server off."""
    if os.environ.get(DISABLE_VAR) == "0":
        return 0
    home, controller_pid = Path(argv[0]), int(argv[1])
    for module in PRELOADED:
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    server = Server(home, controller_pid, code_version())
    if not server.bind():
        print(f"command server: {home}'s socket stayed taken; commands run in their own processes",
              file=sys.stderr, flush=True)
        return 0
    print(f"command server {os.getpid()} serves {home}", file=sys.stderr, flush=True)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
