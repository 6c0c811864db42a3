"""The `aiptrain` command's entry point: a `jobs` command goes to the home's command server when
one runs (aiptrain.commandserver: no imports to pay for), else runs in this process. Nothing is
imported here for other commands: `aiptrain --help` starts as fast as click allows.

This is also the client half of the command server, so it imports only modules the interpreter
has built in: `socket`, `signal` and `json` (their enums and regular expressions), `pathlib`
and `hashlib` cost a served command about 20 ms before it could even connect, more than the
command itself when it is a `jobs describe`. What the two halves say to each other:

  client -> server  four bytes of length (big-endian), then a marshal'd dict: argv, cwd, env,
                    umask, the client's code version and Python; its stdin, stdout and stderr
                    ride along as SCM_RIGHTS (the first send)
  server -> client  `pid N` once the child runs the command, or `refused REASON`; then `exit N`
"""

from __future__ import annotations

import _signal
import _socket
import marshal
import os
import sys

from aiptrain.codeversion import code_version

DISABLE_VAR = "AIPTRAIN_COMMAND_SERVER"  # "0": every command runs in its own process
STD_FDS = (0, 1, 2)
FORWARDED_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)
MARSHAL_VERSION = 4  # what the server reads (the same Python: the server refuses another)
LENGTH_BYTES = 4
C_INT_BYTES = 4  # SCM_RIGHTS carries descriptors, and SO_PEERCRED pid, uid, gid, as C ints


def serves(argv: list[str]) -> bool:
    """Whether a command line is one the command server runs: the `jobs` commands (in any of
    gcloud's spellings). Long-running servers (`serve`, `controller run`) and `local train` (the
    user's trainer, in this very process's terminal session) always run in their own process."""
    words = argv[: argv.index("--")] if "--" in argv else argv
    return "jobs" in words


def submits(argv: list[str]) -> bool:
    """Whether a command line submits a job (not its help, not a dry run)."""
    words = argv[: argv.index("--")] if "--" in argv else argv
    return "jobs" in words and "submit" in words and not {"--dry-run", "--help", "-h"} & set(words)


def main() -> None:
    argv = sys.argv[1:]
    if serves(argv):
        status = forward(argv, home_directory())
        if status is not None:
            sys.exit(status)
        if submits(argv):
            start_controller()
    from aiptrain.cli import main as run_here

    run_here()


def start_controller() -> None:
    """A submit run in its own process, in a home in use (a controller ran there before), starts
    the home's controller first, so the controller's start-up (an interpreter and its imports)
    runs beside the submit's own instead of after it. A home never used gets its first
    controller once the submit has checked what it can without side effects (`Client.submit`):
    a refused first submit leaves nothing behind. Never an error here: the submit makes sure of
    the controller again, and says what is wrong."""
    try:
        from aiptrain.runner import control
        from aiptrain.settings import Settings

        settings = Settings()
        # In client mode the server's controller runs the jobs.
        if not settings.api_url and settings.controller_state_path.exists():
            control.ensure_running(settings)
    except Exception:  # noqa: BLE001 - see above
        pass


# -- what the server is found by ------------------------------------------------------------------


def home_directory() -> str:
    """The home a command works in, as aiptrain.settings.default_home finds it (a test keeps the
    two in step), without its imports: AIPTRAIN_HOME, else Linux's XDG rule that platformdirs
    applies there (the command server runs only on Linux, whose abstract sockets it uses)."""
    if os.environ.get("AIPTRAIN_HOME"):
        return os.path.realpath(os.path.expanduser(os.environ["AIPTRAIN_HOME"]))
    data = os.environ.get("XDG_DATA_HOME", "")
    if not data.strip():
        data = os.path.expanduser("~/.local/share")
    return os.path.join(data, "aiptrain")


def socket_name(home: str) -> bytes:
    """The abstract socket name of a home's server, for this user: the home directory's device
    and inode, which every spelling of its path shares. OSError when the home does not exist."""
    info = os.stat(home)
    return f"\0aiptrain-commands-{os.getuid()}-{info.st_dev:x}-{info.st_ino:x}".encode()


# -- the client -----------------------------------------------------------------------------------


def forward(argv: list[str], home: str) -> int | None:
    """Run `aiptrain ARGV` in a child of the home's server; its exit status, or None when the
    server cannot run it (the caller runs it itself, nothing having happened yet). With no
    server, it costs a failed connect: the code version is computed only for a server."""
    if os.environ.get(DISABLE_VAR) == "0" or sys.platform != "linux":
        return None
    try:
        for fd in STD_FDS:
            os.fstat(fd)
    except OSError:
        return None  # a closed stdin/stdout/stderr cannot be handed over
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.connect(socket_name(home))
        ours = peer_uid(conn) == os.getuid()
    except OSError:
        ours = False
    if not ours:
        conn.close()
        return None
    signals = _SignalsToChild()
    replies = _lines(conn)
    try:
        request = marshal.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": _umask(),
                                 "version": code_version(), "python": sys.executable}, MARSHAL_VERSION)
        fds = b"".join(fd.to_bytes(C_INT_BYTES, sys.byteorder) for fd in STD_FDS)
        conn.sendmsg([len(request).to_bytes(LENGTH_BYTES, "big")],
                     [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        conn.sendall(request)
        word, _, value = next(replies, b"").partition(b" ")
    except OSError:
        word = b""
    if word != b"pid":  # refused (another version), or the server went: nothing ran
        signals.restore()
        return None
    signals.send_to(int(value))
    for line in replies:
        word, _, value = line.partition(b" ")
        if word == b"exit":
            return int(value)
    # The server went away mid-command: the child's status went with it.
    print("ERROR: aiptrain's command server stopped before the command ended.", file=sys.stderr)
    return 4


def peer_uid(conn) -> int:
    """The user at the other end of a Unix socket (SO_PEERCRED: pid, uid, gid)."""
    credentials = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 3 * C_INT_BYTES)
    return int.from_bytes(credentials[C_INT_BYTES:2 * C_INT_BYTES], sys.byteorder, signed=True)


def _lines(conn):
    """The server's reply lines, as they come; none once it hangs up."""
    pending = b""
    while True:
        try:
            data = conn.recv(4096)
        except OSError:
            return
        if not data:
            return
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield line


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _SignalsToChild:
    """What a terminal or a supervisor sends the client goes on to the child that runs the
    command; one that arrives before the child exists is passed on once it does."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []
        self.before = {signum: _signal.signal(signum, self.pass_on) for signum in FORWARDED_SIGNALS}

    def pass_on(self, signum: int, _frame) -> None:
        if self.pid is None:
            self.pending.append(signum)
            return
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:
            pass

    def send_to(self, pid: int) -> None:
        self.pid = pid
        for signum in self.pending:
            self.pass_on(signum, None)

    def restore(self) -> None:
        for caught, handler in self.before.items():
            _signal.signal(caught, handler)
        for signum in self.pending:  # nothing ran: the signal is the client's own again
            os.kill(os.getpid(), signum)
