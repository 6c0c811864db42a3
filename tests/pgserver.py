"""A throwaway PostgreSQL server for the store tests: Debian's postgresql binaries (scripts/
install-postgresql.sh), `initdb` on a temporary directory, a free loopback port, password
authentication over TCP; stopped and removed at the end. As root, the server runs as the
`postgres` user (PostgreSQL refuses to run as root)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER = "aiptrain"
PASSWORD = "s3cret-Pw_for-tests"  # tests check it never appears in what aiptrain prints


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL's programs (Debian keeps them off PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, programs: Path):
        self.programs = programs
        self.dir = Path(tempfile.mkdtemp(prefix="aiptrain-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self._databases = 0

    def _run(self, *argv: str) -> None:
        command = [str(self.programs / argv[0]), *argv[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log = self.dir / "server.log"
            raise RuntimeError(f"{argv[0]} failed: {result.stderr}{log.read_text() if log.exists() else ''}")

    def start(self) -> Server:
        pwfile = self.dir / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._as_postgres:
            shutil.chown(pwfile, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", USER, f"--pwfile={pwfile}", "--auth-local=trust",
                  "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync")
        self._pg_ctl("start")
        return self

    def _pg_ctl(self, action: str) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run("pg_ctl", action, "-m", "fast", "-w", "-t", "60", "-D", str(self.data),
                  "-l", str(self.dir / "server.log"), "-o", options)

    def restart(self) -> None:
        """Stop and start again: every client's connection is dropped."""
        self._pg_ctl("restart")

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", str(self.data))
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A URL of a database of its own (each test gets an empty store)."""
        import psycopg

        self._databases += 1
        name = f"store_{self._databases}"
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return self.url(name)
