"""Issue 21, item 9: aiptrain's home on a full disk. A real full disk: a small tmpfs mounted as
AIPTRAIN_HOME (so these tests need root), filled with a file, removed after.

- Submit refuses, exit 3 in one line, and leaves nothing (it used to leave a half-made job that
  the next command failed, or say "failed unexpectedly", exit 4).
- A job whose replicas finish while the disk is full is never silently RUNNING: every command
  reading it says why, and once there is room it ends as its replicas did."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from conftest import job_resources, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """A 20 MiB tmpfs as AIPTRAIN_HOME's disk; `fill(leave_kib)` fills it up to that."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount)], check=True)
    home = mount / "home"
    monkeypatch.setenv("AIPTRAIN_HOME", str(home))
    filler = mount / "filler"

    def fill(leave_kib: int = 0) -> None:
        with filler.open("ab") as handle:
            stats = os.statvfs(mount)
            handle.write(b"\0" * max(0, stats.f_bavail * stats.f_frsize - leave_kib * 1024))

    try:
        yield home, fill, filler
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def trainer(tmp_path: Path) -> Path:
    """Waits for a `go` file in its job dir, then prints enough lines to need the disk."""
    package = tmp_path / "waiting" / "trainer"
    package.mkdir(parents=True)
    (package / "__init__.py").touch()
    (package / "task.py").write_text(
        "import os, sys, time\n"
        "job_dir = sys.argv[sys.argv.index('--job-dir') + 1]\n"
        "while not os.path.exists(os.path.join(job_dir, 'go')):\n"
        "    time.sleep(0.1)\n"
        "for i in range(2000):\n"
        "    print(f'line {i} ' + 'x' * 100)\n"
    )
    return package


@pytest.mark.parametrize("leave_kib", [0, 100, 400])
def test_submit_on_a_full_disk_is_exit_3_in_one_line_and_leaves_nothing(cli, small_disk, tmp_path, leave_kib,
                                                                        docker_api, minimal_runtime):
    home, fill, _ = small_disk
    home.mkdir()
    fill(leave_kib)
    job_id = f"full_{uuid.uuid4().hex[:8]}"
    result = cli("jobs", "submit", "training", job_id, "--package-path", str(trainer(tmp_path)),
                 "--module-name", "trainer.task", "--job-dir", str(tmp_path / "out"),
                 "--runtime-version", minimal_runtime)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ERROR: The disk of aiptrain's home [{home}] has "), lines
    assert "free space on it" in lines[0]
    assert [p for p in home.rglob("*") if p.is_file()] == []
    assert not (tmp_path / "out").exists()
    assert job_resources(docker_api, job_id) == []


def test_a_job_that_ends_while_the_disk_is_full_says_so_then_ends_as_it_did(cli, small_disk, tmp_path, docker_api,
                                                                            minimal_runtime):
    home, fill, filler = small_disk
    job_id = f"filled_{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    cli("jobs", "submit", "training", job_id, "--package-path", str(trainer(tmp_path)), "--module-name",
        "trainer.task", "--job-dir", str(out), "--runtime-version", minimal_runtime, check_code=0)
    try:
        fill()
        (out / "go").touch()
        wait_for(lambda: all(c["State"] == "exited" for c in docker_api.containers(
            all=True, filters={"label": f"aiptrain.job-id={job_id}"})), timeout=120, what="the replica to exit")

        def ended_or_said_why() -> bool:
            result = cli("jobs", "describe", job_id)
            state = yaml.safe_load(result.stdout)["state"] if result.returncode == 0 else None
            return state == "SUCCEEDED" or f"WARNING: Job [{job_id}] may show an outdated state" in result.stderr

        wait_for(ended_or_said_why, timeout=120, interval=0.5, what="the job to end, or describe to say why not")
    finally:
        filler.unlink()
    wait_for(lambda: yaml.safe_load(cli("jobs", "describe", job_id).stdout)["state"] == "SUCCEEDED",
             timeout=120, interval=0.5, what="the job to end once there is room")
    assert job_resources(docker_api, job_id) == []
    log = cli("jobs", "stream-logs", job_id, check_code=0).stdout
    assert "Job completed successfully." in log
    for line in (home / "logs" / f"{job_id}.jsonl").read_text().splitlines():
        json.loads(line)  # no record cut short by the full disk
