"""The command server (aiptrain.commandserver): a `jobs` command forked from a process that
imported aiptrain once behaves as the same command run in its own process: its status, its
output, the client's environment, working directory and stdin, and Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiptrain import commandserver, launcher
from aiptrain.launcher import serves

from conftest import wait_for


@pytest.fixture
def server(home, tmp_path):
    """The home's command server, as its controller starts it (this test is its controller);
    its log, which names each command it forks, is returned."""
    home.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "aiptrain.commandserver", str(home), str(os.getpid())],
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                   env={**os.environ, "AIPTRAIN_DEBUG": "1"})
    wait_for(lambda: b"serves" in log.read_bytes() or process.poll() is not None, timeout=60, what="the server")
    assert process.poll() is None, log.read_text()
    yield log
    process.send_signal(signal.SIGTERM)  # stops taking commands; exits once its children have
    process.wait(timeout=30)


def aiptrain(*argv: str, env: dict | None = None, cwd: Path | None = None,
             stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aiptrain", *argv], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, stdin=stdin, timeout=60)


def forked(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if " runs aiptrain " in line]


def test_a_served_command_says_and_exits_what_it_says_and_exits_in_its_own_process(server):
    for argv in (["jobs", "describe", "nope"], ["jobs", "list"], ["ai-platform", "jobs", "list", "--format", "json"],
                 ["jobs", "submit", "training", "bad id", "--module-name", "t.task", "--package-path", "."]):
        served = aiptrain(*argv)
        alone = aiptrain(*argv, env={commandserver.DISABLE_VAR: "0"})
        assert (served.returncode, served.stdout, served.stderr) == (alone.returncode, alone.stdout, alone.stderr)
    assert len(forked(server)) == 4  # the served ones, not those run with the server turned off


def test_the_child_has_the_clients_environment_and_working_directory(server, tmp_path):
    bad_store = aiptrain("jobs", "list", env={"AIPTRAIN_STORE": "mysql://x"})
    assert bad_store.returncode == 2 and "AIPTRAIN_STORE [mysql://x] is not a PostgreSQL URL" in bad_store.stderr
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.yaml").write_text("trainingInput:\n  scaleTier: NO_SUCH_TIER\n")
    config = aiptrain("jobs", "submit", "training", "j1", "--config", "job.yaml", "--module-name", "t.task",
                      "--package-path", ".", cwd=work)
    assert config.returncode == 2 and "[job.yaml]: trainingInput.scaleTier" in config.stderr  # read in the client's cwd
    assert len(forked(server)) == 2


def test_ctrl_c_reaches_the_command_and_a_client_killed_outright_takes_its_command_along(server, tmp_path):
    """A command blocked reading the client's stdin (a config from a pipe that stays open)."""
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("")
    for signum, status in ((signal.SIGINT, 130), (signal.SIGKILL, -signal.SIGKILL)):
        before = len(forked(server))
        client = subprocess.Popen(
            [sys.executable, "-m", "aiptrain", "jobs", "submit", "training", "j1", "--config", "/dev/stdin",
             "--module-name", "trainer.task", "--package-path", str(tmp_path / "trainer")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        wait_for(lambda before=before: len(forked(server)) > before, timeout=30, what="the command to start")
        child = int(forked(server)[-1].split()[2])
        time.sleep(0.3)  # reading its stdin by now
        client.send_signal(signum)
        _, err = client.communicate(timeout=30)
        assert client.returncode == status, err
        if signum == signal.SIGINT:
            assert "Interrupted." in err or "Aborted." in err
        wait_for(lambda child=child: not Path(f"/proc/{child}").exists() or _zombie(child), timeout=10,
                 what="the command to end")
        client.stdin.close()
    assert aiptrain("jobs", "describe", "nope").returncode == 2  # the server serves on
    assert forked(server)[-1].endswith("runs aiptrain jobs describe nope")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


def test_a_client_of_another_version_runs_its_command_itself(server, home, monkeypatch):
    with monkeypatch.context() as patched:
        patched.setattr(launcher, "code_version", lambda: "0.0.0+other")
        assert launcher.forward(["jobs", "list"], str(home)) is None
    with monkeypatch.context() as patched:
        patched.setattr(sys, "executable", "/another/venv/bin/python")  # the same code, other packages
        assert launcher.forward(["jobs", "list"], str(home)) is None
    assert forked(server) == []


def test_without_a_server_the_command_runs_in_its_own_process(home):
    result = aiptrain("jobs", "describe", "nope")
    assert result.returncode == 2 and "Job [nope] not found" in result.stderr


@pytest.mark.parametrize(("argv", "served"), [
    (["jobs", "list"], True),
    (["beta", "ml-engine", "jobs", "describe", "x"], True),
    (["local", "train", "--", "jobs"], False),
    (["controller", "run"], False),
    (["serve"], False),
])
def test_which_commands_the_server_runs(argv, served):
    assert serves(argv) is served


@pytest.mark.parametrize("env", [
    {},
    {"XDG_DATA_HOME": "/srv/data"},
    {"XDG_DATA_HOME": "  "},
    {"AIPTRAIN_HOME": "~/somewhere/../home"},
])
def test_the_client_finds_the_home_settings_finds(env, monkeypatch, tmp_path):
    """The launcher finds the home without aiptrain.settings' imports: the two must agree."""
    from aiptrain.settings import default_home

    for name in ("AIPTRAIN_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert launcher.home_directory() == str(default_home())


def test_every_spelling_of_a_home_names_one_server(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "home")
    assert launcher.socket_name(str(tmp_path / "home")) == launcher.socket_name(str(tmp_path / "link/../home"))
    assert launcher.socket_name(str(tmp_path / "home")) == launcher.socket_name(str(tmp_path / "link"))
