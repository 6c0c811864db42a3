"""The TensorFlow samples under `aiptrain local train --distributed`, in a Python that has
TensorFlow: a virtual environment built once under the repository's .cache/, with the oldest
TensorFlow that has wheels for this host's Python (the runtime images' 2.11 needs Python 3.10
or older), taken from a runtime wheelhouse on this machine where one has it, else the index."""

import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from aiptrain.settings import Settings

from conftest import REPO
from test_local_train import free_port_block, local_train
from test_tensorflow_jobs import STEPS, assert_checkpoint

pytestmark = pytest.mark.tensorflow

TENSORFLOW = "tensorflow-cpu==2.12.1" if sys.version_info < (3, 12) else "tensorflow-cpu==2.16.2"
PYTHON_VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"
VENV = REPO / ".cache" / f"local-train-tf-py{PYTHON_VERSION}-{TENSORFLOW.replace('==', '-')}"
# Read at import, before fixtures point AIPTRAIN_HOME at a temporary home.
WHEELHOUSE = Settings().cache_dir / "wheelhouse" / f"2.11-py{PYTHON_VERSION}-{platform.machine()}"


@pytest.fixture(scope="session")
def tf_python() -> str:
    python = VENV / "bin" / "python"
    if (VENV / "complete").is_file():
        return str(python)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=VENV.parent))
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(building)], check=True)
    source = ["--find-links", str(WHEELHOUSE)] if WHEELHOUSE.is_dir() else []
    subprocess.run(
        [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--only-binary=:all:", *source, TENSORFLOW],
        check=True,
    )
    os.rename(building, VENV)  # its python finds its packages relative to itself, wherever it lies
    (VENV / "complete").write_text(TENSORFLOW)
    return str(python)


def run_sample(sample: str, job_dir: Path, tf_python: str, *topology: str) -> subprocess.CompletedProcess:
    command = local_train(
        "--module-name", "trainer.task", "--package-path", str(REPO / "sample_jobs" / sample / "trainer"),
        "--distributed", *topology, "--start-port", str(free_port_block(6)), "--job-dir", str(job_dir),
        "--", "--steps", str(STEPS),
    )
    env = {**os.environ, "AIPTRAIN_LOCAL_PYTHON": tf_python, "TF_ENABLE_ONEDNN_OPTS": "0"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def test_parameter_server_sample_trains_and_the_command_ends_with_the_chief(home, tmp_path, tf_python):
    job_dir = tmp_path / "ps-out"
    result = run_sample("tf_parameter_server", job_dir, tf_python, "--parameter-server-count", "1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "master-replica-0: chief: connected to 2 workers and 1 parameter servers" in lines, result.stdout
    assert any(line.startswith(f"master-replica-0: chief: trained {STEPS} steps") for line in lines)
    assert_checkpoint(job_dir)


def test_multi_worker_mirrored_sample_trains_with_no_parameter_servers(home, tmp_path, tf_python):
    job_dir = tmp_path / "mwms-out"
    result = run_sample("tf_multi_worker", job_dir, tf_python, "--parameter-server-count", "0")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    for task in ("master-replica-0", "worker-replica-0", "worker-replica-1"):
        assert any(line.startswith(task) and line.endswith("3 replicas in sync") for line in lines), task
    assert any(line.startswith(f"master-replica-0: chief 0: trained {STEPS} steps") for line in lines)
    assert_checkpoint(job_dir)
