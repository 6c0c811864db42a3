"""Distributed lifecycle on the real engine: the master decides, signals restart replicas,
failures stop the rest, cancel and crashes leave nothing behind."""

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from conftest import controller_pids, job_resources, this_installation, wait_for

PROBE = Path(__file__).parents[1] / "trainers" / "probe"
CUSTOM = ("--scale-tier", "custom", "--master-machine-type", "n1-standard-4",
          "--worker-machine-type", "n1-standard-4", "--worker-count", "2",
          "--parameter-server-machine-type", "n1-standard-4", "--parameter-server-count", "1")


@pytest.fixture
def probe_args(tmp_path, minimal_runtime):
    def build(job_id, *extra, user_args=()):
        return ["jobs", "submit", "training", job_id, "--package-path", str(PROBE), "--module-name", "probe.task",
                "--job-dir", str(tmp_path / job_id), "--runtime-version", minimal_runtime, *extra, "--", *user_args]

    return build


def state_of(cli, job_id):
    return yaml.safe_load(cli("jobs", "describe", job_id, check_code=0).stdout)


def containers(api, job_id, **filters):
    return api.containers(all=True, filters={"label": [f"aiptrain.job-id={job_id}", this_installation()], **filters})


def test_master_success_stops_parameter_servers_and_workers(cli, probe_args, docker_api):
    result = cli(*probe_args("ps_job", *CUSTOM, "--stream-logs", user_args=("--run", "chief=3")))
    assert result.returncode == 0, result.stderr
    tasks = {line.split("\t")[2] for line in result.stderr.splitlines() if line.count("\t") == 4}
    assert {"master-replica-0", "worker-replica-0", "worker-replica-1", "ps-replica-0", "service"} <= tasks
    assert "probe ps 0 started" in result.stderr  # the ps ran, and never exits by itself
    assert state_of(cli, "ps_job")["state"] == "SUCCEEDED"
    assert job_resources(docker_api, "ps_job") == []


def test_worker_exit_1_fails_the_job_and_stops_the_others(cli, probe_args, docker_api):
    result = cli(*probe_args("worker_fails", *CUSTOM, "--stream-logs",
                             user_args=("--run", "chief=60", "--run", "worker=1", "--exit", "worker:1=1")))
    assert result.returncode == 1
    job = state_of(cli, "worker_fails")
    assert job["state"] == "FAILED"
    assert job["errorMessage"].startswith("The replica worker 1 exited with a non-zero status of 1.\n")
    assert "probe worker 1 exiting with 1" in job["errorMessage"]
    assert job_resources(docker_api, "worker_fails") == []


def test_killed_worker_is_restarted_in_place_and_the_job_succeeds(cli, probe_args, docker_api, home):
    cli(*probe_args("killed_worker", *CUSTOM, user_args=("--run", "chief=20", "--run", "worker=6")), check_code=0)
    log_file = home / "logs" / "killed_worker.jsonl"
    wait_for(lambda: "probe worker 1 started" in log_file.read_text(), timeout=90, what="worker 1 training")
    worker = wait_for(lambda: containers(docker_api, "killed_worker", status="running",
                                         label=["aiptrain.job-id=killed_worker", "aiptrain.task-name=worker-replica-1"]),
                      what="worker 1 running")[0]
    docker_api.kill(worker["Id"], signal="SIGKILL")  # exit 137, as kill -9 of the replica
    wait_for(lambda: state_of(cli, "killed_worker")["state"] in ("SUCCEEDED", "FAILED"), timeout=90, what="end")
    assert state_of(cli, "killed_worker")["state"] == "SUCCEEDED"
    logs = cli("jobs", "stream-logs", "killed_worker", check_code=0).stdout
    assert "The replica worker 1 exited with a non-zero status of 137. Restarting it in place (restart 1 of 5)." in logs
    assert logs.count("probe worker 1 started") == 2  # same replica, second run, logs re-attached
    assert job_resources(docker_api, "killed_worker") == []


def test_restart_budget_is_configurable(cli, probe_args, docker_api, monkeypatch):
    monkeypatch.setenv("AIPTRAIN_MAX_RESTARTS", "0")
    cli(*probe_args("no_restarts", user_args=("--run", "chief=30")), check_code=0)
    master = wait_for(lambda: containers(docker_api, "no_restarts", status="running"), what="master")[0]
    docker_api.kill(master["Id"], signal="SIGKILL")
    wait_for(lambda: state_of(cli, "no_restarts")["state"] == "FAILED", timeout=60, what="FAILED")
    assert "non-zero status of 137" in state_of(cli, "no_restarts")["errorMessage"]


def test_cancel_ends_cancelled_and_removes_everything(cli, probe_args, docker_api):
    cli(*probe_args("to_cancel", *CUSTOM, user_args=("--run", "chief=120", "--run", "worker=120")), check_code=0)
    assert len(containers(docker_api, "to_cancel", status="running")) == 4
    started = time.monotonic()
    cli("jobs", "cancel", "to_cancel", check_code=0)
    assert time.monotonic() - started < 60  # generous; the point is that it ends, not a timing
    job = state_of(cli, "to_cancel")
    assert job["state"] == "CANCELLED" and job["errorMessage"] == "Job cancelled by the user."
    assert job_resources(docker_api, "to_cancel") == []
    cli("jobs", "cancel", "to_cancel", check_code=0)  # a finished job: no-op, exit 0
    assert state_of(cli, "to_cancel")["state"] == "CANCELLED"


def test_stream_logs_follows_all_replicas_and_filters_by_task(cli, probe_args, docker_api):
    cli(*probe_args("streamed", *CUSTOM, user_args=("--run", "chief=4", "--lines", "3")), check_code=0)
    everything = cli("jobs", "stream-logs", "streamed", check_code=0).stdout
    assert "Job completed successfully." in everything  # followed until the end
    for task in ("master-replica-0", "worker-replica-0", "worker-replica-1", "ps-replica-0"):
        assert f"\t{task}\t\tline 2" in everything
    assert "ERROR\t" in everything and "says hello on stderr" in everything
    only = cli("jobs", "stream-logs", "streamed", "--task-name", "worker-replica-1", check_code=0).stdout
    assert {line.split("\t")[2] for line in only.splitlines()} == {"worker-replica-1"}


def test_max_running_time_cancels_the_job(cli, probe_args, docker_api, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("trainingInput:\n  scheduling:\n    maxRunningTime: 2s\n")
    result = cli(*probe_args("too_long", "--config", str(config), "--stream-logs", user_args=("--run", "chief=120")))
    assert result.returncode == 1
    job = state_of(cli, "too_long")
    assert job["state"] == "CANCELLED" and "maxRunningTime" in job["errorMessage"]
    assert job_resources(docker_api, "too_long") == []


def test_killed_controller_is_replaced_by_the_next_command(cli, probe_args, docker_api, home):
    cli(*probe_args("orphan", user_args=("--run", "chief=6")), check_code=0)
    pids = controller_pids(home)
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGKILL)
    wait_for(lambda: not controller_pids(home), what="the controller to die")
    assert state_of(cli, "orphan")["state"] == "RUNNING"  # describe noticed and started a new controller
    assert len(controller_pids(home)) == 1
    wait_for(lambda: state_of(cli, "orphan")["state"] == "SUCCEEDED", timeout=60, what="SUCCEEDED")
    assert job_resources(docker_api, "orphan") == []


def test_cli_killed_mid_submit_is_failed_with_nothing_orphaned(cli, probe_args, docker_api, home):
    args = probe_args("interrupted", "--scale-tier", "standard-1", user_args=("--run", "chief=120", "--run", "worker=120"))
    process = subprocess.Popen([sys.executable, "-m", "aiptrain", *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    job_log = home / "logs" / "interrupted.jsonl"  # opened once the job is recorded, before it is staged
    wait_for(lambda: job_log.exists() or process.poll() is not None, interval=0.005, what="the job's record")
    process.kill()  # SIGKILL, as `kill -9` of the CLI
    process.wait()
    wait_for(lambda: state_of(cli, "interrupted")["state"] in ("RUNNING", "FAILED"), timeout=60,
             what="the controller to take the job")
    job = state_of(cli, "interrupted")
    if job["state"] == "RUNNING":  # the kill came after the hand-over: the controller owns it
        cli("jobs", "cancel", "interrupted", check_code=0)
    else:
        assert job["state"] == "FAILED" and "interrupted" in job["errorMessage"]
    wait_for(lambda: job_resources(docker_api, "interrupted") == [], timeout=60, what="cleanup")
    assert state_of(cli, "interrupted")["state"] in ("FAILED", "CANCELLED")


def test_ten_concurrent_submits_are_all_recorded_once(cli, probe_args, docker_api):
    ids = [f"concurrent_{i}" for i in range(10)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda job_id: cli(*probe_args(job_id, user_args=("--run", "chief=1"))),
                                ids + ["concurrent_0", "concurrent_0"]))
    codes = [r.returncode for r in results]
    assert codes[:10].count(0) + codes[10:].count(0) == 10  # exactly one submit of concurrent_0 won
    assert sorted(codes[10:] + [codes[0]]) == [0, 2, 2]
    for job_id in ids:
        wait_for(lambda job_id=job_id: state_of(cli, job_id)["state"] == "SUCCEEDED", timeout=120, what=job_id)
    listed = [line.split()[0] for line in cli("jobs", "list", check_code=0).stdout.splitlines()[1:]]
    assert sorted(listed) == sorted(ids)
    assert all(job_resources(docker_api, job_id) == [] for job_id in ids)


def test_gpu_job_on_an_engine_without_gpu_runtime_is_refused_cleanly(cli, probe_args, docker_api, home):
    if "nvidia" in docker_api.info().get("Runtimes", {}):
        pytest.skip("this engine has a GPU runtime")
    result = cli(*probe_args("wants_gpu", "--scale-tier", "basic-gpu"))
    assert result.returncode == 3 and "no GPU runtime" in result.stderr and result.stderr.count("\n") == 1
    assert cli("jobs", "list").stderr.strip() == "Listed 0 items."
    assert job_resources(docker_api, "wants_gpu") == []


def test_through_the_api_it_is_a_failed_precondition_not_a_retryable_503(docker_api, home, package, minimal_runtime):
    """Clients retry a 503 for half a minute (gcloud does); no retry gives this engine a GPU runtime."""
    import json

    from aiptrain.api.app import App
    from aiptrain.api.calls import Request

    if "nvidia" in docker_api.info().get("Runtimes", {}):
        pytest.skip("this engine has a GPU runtime")
    body = {"jobId": "wants_gpu", "trainingInput": {"scaleTier": "BASIC_GPU", "packageUris": [str(package)],
                                                     "pythonModule": "trainer.task", "region": "us-central1",
                                                     "runtimeVersion": "minimal"}}
    answer = App().handle(Request("POST", "/v1/projects/p/jobs", body=json.dumps(body).encode()))
    assert (answer.code, answer.body["error"]["status"]) == (400, "FAILED_PRECONDITION"), answer.body
    assert "no GPU runtime" in answer.body["error"]["message"]
    assert job_resources(docker_api, "wants_gpu") == []


def test_ctrl_c_stops_the_stream_not_the_job(cli, probe_args, docker_api):
    args = probe_args("interrupted_stream", "--stream-logs", user_args=("--run", "chief=8"))
    # Ctrl-C as a terminal gives it: a suite started in the background of a script inherits SIGINT
    # ignored, and Python keeps an ignored SIGINT ignored; the CLI gets Python's own handler back.
    as_at_a_terminal = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                        "sys.argv[0] = 'aiptrain'; runpy.run_module('aiptrain', run_name='__main__')")
    process = subprocess.Popen([sys.executable, "-c", as_at_a_terminal, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    wait_for(lambda: containers(docker_api, "interrupted_stream", status="running"), what="master running")
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "Received keyboard interrupt." in stderr and "aiptrain jobs stream-logs interrupted_stream" in stderr
    assert state_of(cli, "interrupted_stream")["state"] == "RUNNING"
    wait_for(lambda: state_of(cli, "interrupted_stream")["state"] == "SUCCEEDED", timeout=60, what="SUCCEEDED")


def test_launch_failing_half_way_removes_what_was_started(cli, probe_args, docker_api):
    from aiptrain.settings import Settings

    name = f"half_way-worker-2-{Settings().installation_id[:8]}"  # this home's name for worker 2
    blocker = docker_api.create_container("aiptrain/runtime:minimal", command=["sleep", "60"], name=name)
    try:
        result = cli(*probe_args("half_way", "--scale-tier", "standard-1", user_args=("--run", "chief=60")))
        assert result.returncode == 3 and "Docker refused the job's replicas" in result.stderr
        assert result.stderr.count("\n") == 1 and "http+docker" not in result.stderr
        job = state_of(cli, "half_way")
        assert job["state"] == "FAILED" and name in job["errorMessage"]
        assert job_resources(docker_api, "half_way") == []
    finally:
        docker_api.remove_container(blocker, force=True)


def test_two_aiptrain_homes_never_touch_each_others_replicas(cli, probe_args, docker_api, home, tmp_path, monkeypatch):
    cli(*probe_args("same_name", user_args=("--run", "chief=8")), check_code=0)
    monkeypatch.setenv("AIPTRAIN_HOME", str(tmp_path / "other-home"))
    cli(*probe_args("same_name", user_args=("--run", "chief=1")), check_code=0)  # names carry the home
    wait_for(lambda: state_of(cli, "same_name")["state"] == "SUCCEEDED", timeout=60, what="the other home's job")
    monkeypatch.setenv("AIPTRAIN_HOME", str(home))
    assert len(containers(docker_api, "same_name", status="running")) == 1  # the first home's replica lives on
    wait_for(lambda: state_of(cli, "same_name")["state"] == "SUCCEEDED", timeout=60, what="SUCCEEDED")
    assert job_resources(docker_api, "same_name") == []
