"""`aiptrain local train` (issue 8 part 6): the process plan is table-tested as a value; the
runner is tested with real processes (sample_jobs/basic and tests/trainers/cluster_echo).
The TensorFlow samples run in tests/cli/test_local_train_tensorflow.py."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aiptrain.errors import ValidationError
from aiptrain.local_train import (
    LocalTrainArgs,
    ProcessSpec,
    ignored_flag_warnings,
    local_python,
    plan_processes,
    primary_type_for,
    validate,
)

from conftest import REPO, SAMPLE_TRAINER, wait_for

ECHO_TRAINER = REPO / "tests" / "trainers" / "cluster_echo"
PY = "/usr/bin/python3"


def tf_config(spec: ProcessSpec) -> dict:
    return json.loads(spec.env["TF_CONFIG"])


# -- the plan ----------------------------------------------------------------------------------


def test_single_process_is_one_whole_value():
    args = LocalTrainArgs(module_name="trainer.task", package_path="/src/proj/trainer",
                          user_args=("--steps", "5"), job_dir="gs://b/out")
    [spec] = plan_processes(args, PY, "chief", pythonpath="/opt/lib")
    user_args = ["--steps", "5", "--job-dir", "gs://b/out"]
    assert spec == ProcessSpec(
        task_name="master-replica-0",
        argv=[PY, "-m", "trainer.task", *user_args],
        env={
            "PYTHONPATH": "/src/proj:/opt/lib",
            # gcloud's exact string: key order job, task, cluster, environment; no cluster when single.
            "TF_CONFIG": json.dumps({"job": {"job_name": "trainer.task", "args": user_args}, "task": {},
                                     "cluster": {}, "environment": "cloud"}),
            "MASTER_ADDR": "localhost", "MASTER_PORT": "27182", "WORLD_SIZE": "1", "RANK": "0",
        },
        cwd="/src/proj",
        port=None,
        primary=True,
    )


def test_distributed_defaults_to_two_ps_and_two_workers_primary_last_ports_in_a_row():
    args = LocalTrainArgs(module_name="m", package_path="/p/pkg", distributed=True)
    specs = plan_processes(args, PY, "chief")
    assert [(s.task_name, s.port, s.primary) for s in specs] == [
        ("ps-replica-0", 27183, False), ("ps-replica-1", 27184, False),
        ("worker-replica-0", 27185, False), ("worker-replica-1", 27186, False),
        ("master-replica-0", 27182, True),
    ]
    cluster = {"chief": ["localhost:27182"], "ps": ["localhost:27183", "localhost:27184"],
               "worker": ["localhost:27185", "localhost:27186"]}
    assert [tf_config(s)["task"] for s in specs] == [
        {"type": "ps", "index": 0}, {"type": "ps", "index": 1},
        {"type": "worker", "index": 0}, {"type": "worker", "index": 1}, {"type": "chief", "index": 0},
    ]
    assert all(tf_config(s)["cluster"] == cluster and list(tf_config(s)["cluster"]) == ["chief", "ps", "worker"]
               for s in specs)
    assert {s.env["PYTHONUNBUFFERED"] for s in specs} == {"1"}  # output goes through a pipe
    assert {s.cwd for s in specs} == {"/p"}


@pytest.mark.parametrize(
    "ps, workers, evaluators, start, expected_cluster",
    [
        (1, 3, 0, 5000, {"master": ["localhost:5000"], "ps": ["localhost:5001"],
                         "worker": ["localhost:5002", "localhost:5003", "localhost:5004"]}),
        (0, 1, 2, 6000, {"master": ["localhost:6000"], "ps": [], "worker": ["localhost:6001"]}),
        (0, 0, 0, 7000, {"master": ["localhost:7000"], "ps": [], "worker": []}),
    ],
)
def test_counts_evaluators_and_start_port(ps, workers, evaluators, start, expected_cluster):
    args = LocalTrainArgs(module_name="m", package_path="/p/pkg", distributed=True, parameter_server_count=ps,
                          worker_count=workers, evaluator_count=evaluators, start_port=start)
    specs = plan_processes(args, PY, "master")
    assert {json.dumps(tf_config(s)["cluster"]) for s in specs} == {json.dumps(expected_cluster)}
    assert len(specs) == 1 + ps + workers + evaluators
    # Evaluators are not in the cluster: no port, their own index, started before the primary.
    evals = [s for s in specs if s.task_name.startswith("evaluator")]
    assert [(tf_config(s)["task"], s.port) for s in evals] == [
        ({"type": "evaluator", "index": i}, None) for i in range(evaluators)
    ]
    assert specs[-1].primary and tf_config(specs[-1])["task"] == {"type": "master", "index": 0}


def test_pytorch_variables_point_at_the_primary_with_ranks_for_primary_and_workers():
    args = LocalTrainArgs(module_name="m", package_path="/p/pkg", distributed=True, parameter_server_count=1,
                          worker_count=2, evaluator_count=1, start_port=9000)
    torch = {s.task_name: (s.env["MASTER_ADDR"], s.env["MASTER_PORT"], s.env["WORLD_SIZE"], s.env.get("RANK"))
             for s in plan_processes(args, PY, "chief")}
    assert torch == {
        "ps-replica-0": ("localhost", "9000", "3", None),
        "worker-replica-0": ("localhost", "9000", "3", "1"),
        "worker-replica-1": ("localhost", "9000", "3", "2"),
        "evaluator-replica-0": ("localhost", "9000", "3", None),
        "master-replica-0": ("localhost", "9000", "3", "0"),
    }


@pytest.mark.parametrize(
    "version, primary, warns",
    [("1.15.5", "master", False), ("2.12.1", "chief", False), (None, "chief", True), ("3.0.0", "chief", True)],
)
def test_primary_is_master_for_tensorflow_1_else_chief(version, primary, warns):
    name, warning = primary_type_for(version)
    assert name == primary and bool(warning) == warns


def test_gcloud_warnings_for_cluster_sizes_without_distributed():
    args = LocalTrainArgs(module_name="m", package_path="/p", worker_count=3, parameter_server_count=1)
    assert ignored_flag_warnings(args) == [
        "--parameter-server-count is ignored if --distributed is not provided.\n"
        "Did you mean to run distributed training?",
        "--worker-count is ignored if --distributed is not provided.\nDid you mean to run distributed training?",
    ]
    assert ignored_flag_warnings(LocalTrainArgs(module_name="m", package_path="/p", worker_count=3,
                                                distributed=True)) == []


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"AIPTRAIN_LOCAL_PYTHON": "/a/python", "CLOUDSDK_ML_ENGINE_LOCAL_PYTHON": "/b/python"}, "/a/python"),
        ({"CLOUDSDK_ML_ENGINE_LOCAL_PYTHON": "/b/python", "PATH": "/nowhere"}, "/b/python"),
        ({"PATH": "/nowhere"}, sys.executable),
    ],
)
def test_which_python(environ, expected):
    assert local_python(environ) == expected


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"package_path": "/no/such/dir"}, "--package-path [/no/such/dir] is not a directory"),
        ({"worker_count": -1}, "--worker-count must be 0 or more"),
        ({"distributed": True, "start_port": 65533}, "--start-port 65533 leaves no room for the cluster's 5 ports"),
    ],
)
def test_bad_flags(overrides, message):
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate(LocalTrainArgs(**{"module_name": "m", "package_path": str(REPO), **overrides}))


# -- real processes ----------------------------------------------------------------------------


def free_port_block(size: int) -> int:
    """A start port whose next `size` ports are free now (the engine and other tests share the host)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            start = probe.getsockname()[1]
        if start + size < 65536 and all(_port_free(start + i) for i in range(size)):
            return start
    raise AssertionError("no free block of ports")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def local_train(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiptrain", "local", "train", *args]


def local_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "AIPTRAIN_LOCAL_PYTHON": sys.executable, **extra}


def echo_args(job_dir: Path, *user_args: str, topology=("--worker-count", "2", "--parameter-server-count", "1")):
    return local_train(
        "--module-name", "cluster_echo.task", "--package-path", str(ECHO_TRAINER), "--distributed",
        *topology, "--start-port", str(free_port_block(8)), "--job-dir", str(job_dir), "--", *user_args,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose (its parent, aiptrain, has not reaped it yet or has exited).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def reports(job_dir: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in job_dir.glob("*.json")}


def background_pids(job_dir: Path) -> list[int]:
    found = reports(job_dir).values()
    return [pid for r in found if r["tf_config"]["task"]["type"] not in ("chief", "master")
            for pid in (r["pid"], r["child_pid"]) if pid]


def test_single_process_runs_the_basic_sample_with_output_unchanged(home, tmp_path):
    job_dir = tmp_path / "out"
    result = subprocess.run(
        local_train("--module-name", "trainer.task", "--package-path", str(SAMPLE_TRAINER),
                    "--job-dir", str(job_dir), "--", "--steps", "10"),
        capture_output=True, text=True, env=local_env(), cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "Starting master 0: 10 steps"  # no prefix when single
    assert json.loads((job_dir / "model.json").read_text())["steps"] == 10


def test_single_process_exit_status_is_the_trainers_and_cluster_flags_warn(home, tmp_path):
    result = subprocess.run(
        local_train("--module-name", "trainer.task", "--package-path", str(SAMPLE_TRAINER), "--worker-count", "3",
                    "--job-dir", str(tmp_path / "out"), "--", "--steps", "2", "--fail-with", "7"),
        capture_output=True, text=True, env=local_env(), timeout=120,
    )
    assert result.returncode == 7, result.stderr
    assert result.stderr.startswith(
        "WARNING: --worker-count is ignored if --distributed is not provided.\n"
        "Did you mean to run distributed training?\n"
    ), result.stderr


def test_bad_package_path_is_one_line_and_exit_2(home, tmp_path):
    result = subprocess.run(local_train("--module-name", "m", "--package-path", str(tmp_path / "nope")),
                            capture_output=True, text=True, env=local_env(), timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "is not a directory" in result.stderr, result.stderr


def test_distributed_cluster_prefixed_output_primary_exit_status_and_no_process_left(home, tmp_path):
    job_dir = tmp_path / "out"
    job_dir.mkdir()
    # Background tasks ignore SIGTERM and have a child each: both must be gone when the command returns.
    command = echo_args(job_dir, "--primary-seconds", "1", "--primary-exit", "3", "--child", "--ignore-sigterm",
                        topology=("--worker-count", "2", "--parameter-server-count", "1", "--evaluator-count", "1"))
    start_port = int(command[command.index("--start-port") + 1])
    result = subprocess.run(command, capture_output=True, text=True, env=local_env(), timeout=120)
    assert result.returncode == 3, result.stderr

    found = reports(job_dir)
    assert sorted(found) == ["chief-0", "evaluator-0", "ps-0", "worker-0", "worker-1"]
    ports = [f"localhost:{start_port + i}" for i in range(4)]
    cluster = {"chief": ports[:1], "ps": ports[1:2], "worker": ports[2:]}
    for name, report in found.items():
        task_type, index = name.split("-")
        assert report["tf_config"]["cluster"] == cluster
        assert report["tf_config"]["task"] == {"type": task_type, "index": int(index)}
        assert report["cwd"] == str(ECHO_TRAINER.parent)
    assert found["worker-1"]["torch"] == {"MASTER_ADDR": "localhost", "MASTER_PORT": str(start_port),
                                          "WORLD_SIZE": "3", "RANK": "2"}
    # Each line carries its task; stdout and stderr stay apart.
    for task, name in (("master-replica-0", "chief-0"), ("worker-replica-1", "worker-1"), ("ps-replica-0", "ps-0")):
        assert f"{task}: {name} started" in result.stdout.splitlines()
        assert f"{task}: {name} on stderr" in result.stderr.splitlines()
    assert "master-replica-0: chief-0 exiting with 3" in result.stdout.splitlines()
    assert len(background_pids(job_dir)) == 8
    assert [pid for pid in background_pids(job_dir) if alive(pid)] == []


def test_sigint_to_the_command_stops_every_process(home, tmp_path):
    job_dir = tmp_path / "out"
    job_dir.mkdir()
    command = echo_args(job_dir, "--primary-seconds", "600", "--child")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=local_env())
    try:
        wait_for(lambda: len(reports(job_dir)) == 4, timeout=60, what="all four tasks to start")
        process.send_signal(signal.SIGINT)  # to aiptrain only, not its process group
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    # The primary got the SIGINT (KeyboardInterrupt) and ended; its status is the command's.
    assert process.returncode == 130, stderr
    assert "KeyboardInterrupt" in stderr
    primary = reports(job_dir)["chief-0"]["pid"]
    assert [pid for pid in [primary, *background_pids(job_dir)] if alive(pid)] == []
