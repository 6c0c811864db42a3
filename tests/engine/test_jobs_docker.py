"""End to end on the real Docker engine: submit, stream, describe, list; bad input leaves no trace."""

import json

import pytest
import yaml

from aiptrain.planning import LONE_HOSTNAME

from conftest import job_resources, wait_for


def describe(cli, job_id):
    return yaml.safe_load(cli("jobs", "describe", job_id, check_code=0).stdout)


def test_basic_job_streams_logs_and_succeeds(cli, submit_args, tmp_path, docker_api):
    result = cli(*submit_args("my_job_1", "--stream-logs"))
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("Job [my_job_1] submitted successfully.\n")
    lines = [line.split("\t") for line in result.stderr.splitlines() if line.count("\t") == 4]
    master_messages = [fields[4] for fields in lines if fields[2] == "master-replica-0"]
    assert "Starting chief 0: 10 steps" in master_messages
    assert "Running command: python3 -m trainer.task --steps 10 --job-dir " + str(tmp_path / "my_job_1-out") in master_messages
    assert all(fields[0] in ("INFO", "WARNING", "ERROR") and fields[3] == "" for fields in lines)
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"

    model = json.loads((tmp_path / "my_job_1-out" / "model.json").read_text())
    assert model["steps"] == 10
    job = describe(cli, "my_job_1")
    assert job["state"] == "SUCCEEDED"
    assert set(job) >= {"jobId", "state", "createTime", "startTime", "endTime", "trainingInput"}
    assert job["trainingInput"]["args"] == ["--steps", "10"]
    assert job["trainingInput"]["packageUris"][0].endswith("/trainer-0.0.0.tar.gz")
    assert job["createTime"].endswith("Z")
    listed = cli("jobs", "list", check_code=0).stdout.splitlines()
    assert listed[0].split() == ["JOB_ID", "STATUS", "CREATED"]
    assert listed[1].split()[:2] == ["my_job_1", "SUCCEEDED"]
    assert job_resources(docker_api, "my_job_1") == []


def test_failing_trainer_fails_the_job_with_its_log_tail(cli, submit_args, docker_api):
    result = cli(*submit_args("failing", "--stream-logs", user_args=("--steps", "5", "--fail-with", "3")))
    assert result.returncode == 1
    job = describe(cli, "failing")
    assert job["state"] == "FAILED"
    assert job["errorMessage"].startswith("The replica master 0 exited with a non-zero status of 3.\n")
    assert "failing on purpose with status 3" in job["errorMessage"]
    assert "ERROR\t" in result.stderr and "Job failed." in result.stderr
    assert job_resources(docker_api, "failing") == []


def test_async_submit_returns_and_the_controller_finishes_the_job(cli, submit_args, docker_api):
    result = cli(*submit_args("async_job"), check_code=0)
    assert "Job [async_job] submitted successfully." in result.stderr
    assert "aiptrain jobs stream-logs async_job" in result.stderr
    assert yaml.safe_load(result.stdout) == {"jobId": "async_job", "state": "RUNNING"}
    wait_for(lambda: describe(cli, "async_job")["state"] == "SUCCEEDED", what="SUCCEEDED")
    logs = cli("jobs", "stream-logs", "async_job", check_code=0).stdout
    assert "master-replica-0\t\tWrote model to" in logs
    assert job_resources(docker_api, "async_job") == []


def assert_no_trace(cli, home, docker_api, tmp_path, job_id):
    assert cli("jobs", "list").stderr.strip() == "Listed 0 items."
    assert job_resources(docker_api, job_id) == []
    bucket = home / "bucket"
    assert not bucket.exists() or not any(bucket.rglob("*.tar.gz"))
    assert not any(tmp_path.glob("*-out"))
    work = home / "work"
    assert not work.exists() or not any(work.iterdir())
    locks = home / "locks"
    assert not locks.exists() or not any(locks.iterdir())
    logs = home / "logs"  # no job log
    assert not logs.exists() or not any(logs.iterdir())


@pytest.mark.parametrize("job_id", ["1abc", "a-b", "a" * 129, ""])
def test_invalid_job_ids_exit_2_with_one_line_and_no_trace(cli, submit_args, home, docker_api, tmp_path, job_id):
    result = cli(*submit_args(job_id))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("ERROR: Invalid job ID")
    assert "Traceback" not in result.stderr
    assert_no_trace(cli, home, docker_api, tmp_path, job_id)


def test_missing_package_path_and_missing_init(cli, submit_args, home, docker_api, tmp_path):
    args = submit_args("no_package")
    args[args.index("--package-path") + 1] = str(tmp_path / "nowhere")
    result = cli(*args)
    assert result.returncode == 2 and "is not a directory" in result.stderr and result.stderr.count("\n") == 1

    bare = tmp_path / "bare" / "trainer"
    bare.mkdir(parents=True)
    (bare / "task.py").write_text("print('hi')\n")
    args[args.index("--package-path") + 1] = str(bare)
    result = cli(*args)
    assert result.returncode == 2 and "does not contain an `__init__.py` file" in result.stderr
    assert_no_trace(cli, home, docker_api, tmp_path, "no_package")


def test_duplicate_job_id_exits_2_and_keeps_the_first_job(cli, submit_args, docker_api, tmp_path):
    cli(*submit_args("twice", "--stream-logs"), check_code=0)
    result = cli(*submit_args("twice"))
    assert result.returncode == 2 and "already exists" in result.stderr and result.stderr.count("\n") == 1
    assert describe(cli, "twice")["state"] == "SUCCEEDED"
    assert job_resources(docker_api, "twice") == []


def test_broken_setup_py_fails_packaging_with_gclouds_text_and_no_trace(cli, submit_args, home, docker_api, tmp_path):
    root = tmp_path / "broken"
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("")
    (root / "setup.py").write_text("raise SystemExit('setup.py is broken')\n")
    args = submit_args("broken_setup")
    args[args.index("--package-path") + 1] = str(root / "trainer")
    result = cli(*args)
    assert result.returncode == 2
    assert "Packaging of user Python code failed: " in result.stderr.splitlines()[0]
    assert "setup.py is broken" in result.stderr and "python setup.py sdist" in result.stderr
    assert sorted(p.name for p in root.iterdir()) == ["setup.py", "trainer"]  # user tree untouched
    assert_no_trace(cli, home, docker_api, tmp_path, "broken_setup")


def test_missing_image_is_an_environment_error_with_no_trace(cli, home, docker_api, tmp_path):
    result = cli("jobs", "submit", "training", "no_image", "--master-image-uri", "aiptrain/never-built:1",
                 "--job-dir", str(tmp_path / "no_image-out"))
    assert result.returncode == 3 and result.stderr.count("\n") == 1
    assert "is not on this Docker engine" in result.stderr and "aiptrain runtimes build" in result.stderr
    assert_no_trace(cli, home, docker_api, tmp_path, "no_image")


def test_dry_run_prints_the_plan_and_touches_nothing(cli, submit_args, home, docker_api, tmp_path):
    result = cli(*submit_args("dry", "--dry-run", "--scale-tier", "standard-1"), check_code=0)
    printed = yaml.safe_load(result.stdout)
    assert printed["network"]["name"].startswith("aiptrain-dry-")  # then this home's installation
    assert [c["task_name"] for c in printed["containers"]][:2] == ["master-replica-0", "worker-replica-0"]
    assert len(printed["containers"]) == 8
    assert all(c["user"] != "0:0" and c["image"] == "aiptrain/runtime:minimal" for c in printed["containers"])
    assert not (home / "jobs.db").exists()
    assert_no_trace(cli, home, docker_api, tmp_path, "dry")


def test_replicas_are_unprivileged_and_see_the_package_read_only(cli, submit_args, docker_api, tmp_path):
    cli(*submit_args("inspected", user_args=("--steps", "1", "--sleep", "30")), check_code=0)
    try:
        (info,) = [docker_api.inspect_container(c["Id"]) for c in docker_api.containers(filters={"label": "aiptrain.job-id=inspected"})]
        host = info["HostConfig"]
        assert info["Config"]["User"] not in ("", "0", "root", "0:0")
        assert host["Privileged"] is False and host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
        mounts = {m["Destination"]: m for m in info["Mounts"]}
        assert mounts["/opt/aiptrain/packages"]["RW"] is False
        assert mounts[str(tmp_path / "inspected-out")]["RW"] is True
        assert not any("docker.sock" in m["Source"] for m in info["Mounts"])
        assert info["Config"]["Hostname"] == LONE_HOSTNAME
    finally:
        cli("jobs", "cancel", "inspected", check_code=0)
    assert job_resources(docker_api, "inspected") == []


def test_limit_resources_sizes_replicas_by_machine_type(cli, submit_args):
    printed = yaml.safe_load(cli(*submit_args("limited", "--dry-run", "--limit-resources", "--scale-tier", "standard-1"),
                                 check_code=0).stdout)
    cpus = [c["nano_cpus"] for c in printed["containers"]]
    assert all(cpus) and abs(cpus[0] - 2 * cpus[-1]) <= 1  # n1-highcpu-8 master, n1-standard-4 ps, scaled alike
    assert all(c["memory_bytes"] for c in printed["containers"])
    unlimited = yaml.safe_load(cli(*submit_args("limited", "--dry-run"), check_code=0).stdout)
    assert unlimited["containers"][0]["nano_cpus"] is None
