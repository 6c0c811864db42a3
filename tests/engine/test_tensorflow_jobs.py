"""Real TensorFlow distribution strategies as CUSTOM jobs on the Docker engine: the samples in
sample_jobs/tf_parameter_server and sample_jobs/tf_multi_worker train on 1 master + 2 workers
(+ 1 parameter server), the job SUCCEEDS, the chief's checkpoint lands in the job dir and
nothing is left on the engine."""

import re
import time
import uuid
from pathlib import Path

import pytest
import yaml

from conftest import REPO, job_resources, require_image, runtime_image

pytestmark = pytest.mark.tensorflow

RUNTIME = "2.11"
STEPS = 100


@pytest.fixture(scope="session")
def tf_runtime(docker_api):
    require_image(docker_api, runtime_image(RUNTIME))
    return RUNTIME


def custom_job_args(job_id: str, sample: str, job_dir: Path, *topology: str) -> list[str]:
    return [
        "jobs", "submit", "training", job_id,
        "--package-path", str(REPO / "sample_jobs" / sample / "trainer"),
        "--module-name", "trainer.task",
        "--job-dir", str(job_dir),
        "--region", "us-central1",
        "--scale-tier", "custom",
        "--master-machine-type", "n1-standard-4",
        "--worker-machine-type", "n1-standard-4",
        "--worker-count", "2",
        *topology,
        "--runtime-version", RUNTIME,
        "--stream-logs",
        "--", "--steps", str(STEPS),
    ]


def replica_messages(stderr: str, task: str) -> list[str]:
    fields = (line.split("\t") for line in stderr.splitlines() if line.count("\t") == 4)
    return [f[4] for f in fields if f[2] == task]


def exit_codes(docker_api, job_id: str, since: int) -> dict[str, list[int]]:
    """Task name (master-replica-0) -> exit codes of every time it died, from the engine's event log."""
    events = docker_api.events(
        since=since,
        until=int(time.time()) + 1,
        filters={"label": f"aiptrain.job-id={job_id}", "event": "die"},
        decode=True,
    )
    codes: dict[str, list[int]] = {}
    for event in events:
        attributes = event["Actor"]["Attributes"]
        codes.setdefault(attributes["aiptrain.task-name"], []).append(int(attributes["exitCode"]))
    return codes


def assert_trained(stderr: str, chief_line: str) -> None:
    """The chief reports the fitted y = 3x + 1 (a correctness check, not a timing one)."""
    report = next(m for m in replica_messages(stderr, "master-replica-0") if m.startswith(chief_line))
    match = re.search(rf"trained {STEPS} steps: weight=([-\d.]+) bias=([-\d.]+)", report)
    assert match, report
    weight, bias = map(float, match.groups())
    assert weight == pytest.approx(3.0, abs=0.1) and bias == pytest.approx(1.0, abs=0.1), report


def assert_checkpoint(job_dir: Path) -> None:
    checkpoints = job_dir / "checkpoints"
    state = (checkpoints / "checkpoint").read_text()
    assert f'model_checkpoint_path: "ckpt-{STEPS}"' in state, state
    assert (checkpoints / f"ckpt-{STEPS}.index").is_file()
    assert list(checkpoints.glob(f"ckpt-{STEPS}.data-*-of-*")), sorted(p.name for p in checkpoints.iterdir())


def test_parameter_server_strategy_job_succeeds_and_stops_workers_and_ps(cli, home, docker_api, tf_runtime, tmp_path):
    job_id = f"tf_ps_{uuid.uuid4().hex[:8]}"
    job_dir = tmp_path / "ps-out"
    since = int(time.time()) - 1
    result = cli(
        *custom_job_args(
            job_id, "tf_parameter_server", job_dir,
            "--parameter-server-machine-type", "n1-standard-4", "--parameter-server-count", "1",
        ),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    job = yaml.safe_load(cli("jobs", "describe", job_id, check_code=0).stdout)
    assert job["state"] == "SUCCEEDED"
    assert job["trainingInput"]["scaleTier"] == "CUSTOM"
    assert job["trainingInput"]["parameterServerCount"] == "1"

    for task, index in (("worker", 0), ("worker", 1), ("ps", 0)):
        assert f"{task} {index} serving at grpc://{job_id.replace('_', '-')}-{task}-{index}:2222" in replica_messages(
            result.stderr, f"{task}-replica-{index}"
        )
    assert_trained(result.stderr, "chief: trained")
    assert_checkpoint(job_dir)
    # The chief finished on its own; the workers and ps never do: the controller stopped them.
    codes = exit_codes(docker_api, job_id, since)
    assert codes["master-replica-0"] == [0], codes
    assert set(codes) == {"master-replica-0", "worker-replica-0", "worker-replica-1", "ps-replica-0"}, codes
    assert job_resources(docker_api, job_id) == []


def test_multi_worker_mirrored_strategy_job_succeeds_with_every_replica_exiting_0(
    cli, home, docker_api, tf_runtime, tmp_path
):
    job_id = f"tf_mwms_{uuid.uuid4().hex[:8]}"
    job_dir = tmp_path / "mwms-out"
    since = int(time.time()) - 1
    result = cli(*custom_job_args(job_id, "tf_multi_worker", job_dir), timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    job = yaml.safe_load(cli("jobs", "describe", job_id, check_code=0).stdout)
    assert job["state"] == "SUCCEEDED"
    assert "parameterServerCount" not in job["trainingInput"]

    for task in ("master-replica-0", "worker-replica-0", "worker-replica-1"):
        assert any(m.endswith(": 3 replicas in sync") for m in replica_messages(result.stderr, task)), task
    assert_trained(result.stderr, "chief 0: trained")
    assert_checkpoint(job_dir)
    # Workers keep their copies of the checkpoint in temp dirs: only the chief's is in the job dir.
    assert sorted(p.name for p in (job_dir / "checkpoints").iterdir() if not p.name.startswith("ckpt-")) == ["checkpoint"]
    assert not list(job_dir.rglob("workertemp*"))
    # Every replica finished by itself, none was stopped.
    codes = exit_codes(docker_api, job_id, since)
    assert codes == {name: [0] for name in ("master-replica-0", "worker-replica-0", "worker-replica-1")}, codes
    assert job_resources(docker_api, job_id) == []
