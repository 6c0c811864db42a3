"""A corpus of malformed configs and flag combinations, as real scripts get them wrong. Each one
exits 2 with one clear error line and no traceback, and leaves nothing behind: no store row,
no staged file, no log, no job dir. Submits run for real (no --dry-run) against an engine
address that does not exist, so a case that slipped through validation could not launch
anything and would fail with another exit status."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

# name, --config text (None: no config), extra flags; a config case gets `--config FILE`.
CUSTOM = "scaleTier: CUSTOM\n  masterType: n1-standard-4\n"
CASES = [
    # --config files
    ("bad YAML", "trainingInput: [\n", []),
    ("YAML list, not a mapping", "- trainingInput\n- scaleTier\n", []),
    ("YAML scalar", "just some text\n", []),
    ("unknown top-level field", "trainingInputs:\n  scaleTier: BASIC\n", []),
    ("unknown trainingInput field", "trainingInput:\n  masterTyp: n1-standard-4\n", []),
    ("list where a map belongs", "trainingInput:\n- scaleTier\n- BASIC\n", []),
    ("labels as a list", "labels: [team, ml]\n", []),
    ("workerCount not a number", f"trainingInput:\n  {CUSTOM}  workerType: n1-standard-4\n  workerCount: many\n", []),
    ("workerCount fractional", f"trainingInput:\n  {CUSTOM}  workerType: n1-standard-4\n  workerCount: 1.5\n", []),
    ("args as a string", "trainingInput:\n  args: --epochs 3\n", []),
    ("masterConfig as a string", "trainingInput:\n  masterConfig: gcr.io/p/image\n", []),
    ("bad duration", "trainingInput:\n  scheduling:\n    maxRunningTime: 2h\n", []),
    ("maxRunningTime past the service's range", "trainingInput:\n  scheduling:\n    maxRunningTime: 99999999999999999999999s\n", []),
    ("maxWaitTime past the service's range", "trainingInput:\n  scheduling:\n    maxWaitTime: 99999999999999999999999s\n", []),
    ("5000 parallel trials", "trainingInput:\n  hyperparameters:\n    maxTrials: 5000\n    maxParallelTrials: 5000\n"
     "    params:\n    - {parameterName: lr, type: DOUBLE, minValue: 0.01, maxValue: 0.1}\n", []),
    ("negative worker count", f"trainingInput:\n  {CUSTOM}  workerType: n1-standard-4\n  workerCount: -1\n", []),
    ("worker count without type", f"trainingInput:\n  {CUSTOM}  workerCount: 2\n", []),
    ("evaluator count without type", f"trainingInput:\n  {CUSTOM}  evaluatorCount: 1\n", []),
    ("scale tier with a blank", "trainingInput:\n  scaleTier: 'BASIC '\n", []),
    ("empty scale tier", "trainingInput:\n  scaleTier: ''\n", []),
    ("unknown scale tier", "trainingInput:\n  scaleTier: HUGE\n", []),
    ("BASIC_TPU", "trainingInput:\n  scaleTier: BASIC_TPU\n", []),
    ("cloud_tpu master", "trainingInput:\n  scaleTier: CUSTOM\n  masterType: cloud_tpu\n", []),
    ("TPU accelerator", f"trainingInput:\n  {CUSTOM}  masterConfig:\n    acceleratorConfig: {{type: TPU_V2, count: 8}}\n", []),
    ("accelerator count 0", f"trainingInput:\n  {CUSTOM}  masterConfig:\n    acceleratorConfig: {{type: NVIDIA_TESLA_T4, count: 0}}\n", []),
    ("unknown accelerator", f"trainingInput:\n  {CUSTOM}  masterConfig:\n    acceleratorConfig: {{type: NVIDIA_GTX_1080, count: 1}}\n", []),
    ("accelerator count words", f"trainingInput:\n  {CUSTOM}  masterConfig:\n    acceleratorConfig: {{type: NVIDIA_TESLA_T4, count: two}}\n", []),
    ("legacy and CE types mixed", "trainingInput:\n  scaleTier: CUSTOM\n  masterType: complex_model_m\n  workerType: n1-standard-4\n  workerCount: 1\n", []),
    ("GPU on an e2 machine", "trainingInput:\n  masterType: e2-standard-8\n  masterConfig:\n    acceleratorConfig: {type: NVIDIA_TESLA_T4, count: 1}\n", []),
    ("a2 with other GPUs", "trainingInput:\n  masterType: a2-highgpu-2g\n  masterConfig:\n    acceleratorConfig: {type: NVIDIA_TESLA_A100, count: 1}\n", []),
    ("labels in the config break the label rules", "labels:\n  Team: ml\n", []),
    ("worker type without a count", f"trainingInput:\n  {CUSTOM}  workerType: n1-standard-4\n", []),
    ("parameter-server type without a count", f"trainingInput:\n  {CUSTOM}  parameterServerType: n1-standard-4\n", []),
    ("workerCount: true", f"trainingInput:\n  {CUSTOM}  workerType: n1-standard-4\n  workerCount: true\n", []),
    ("config that is not UTF-8", "trainingInput:\n  region: \udcff\n", []),
    ("containerCommand with user args", "trainingInput:\n  masterConfig:\n    imageUri: example.com/img:1\n    containerCommand: [python3]\n", []),
    # flags
    ("missing --config file", None, ["--config", "/nonexistent/config.yaml"]),
    ("--staging-bucket that is a file", None, ["--staging-bucket", "/etc/hostname"]),
    ("--worker-machine-type without --worker-count", None, ["--scale-tier", "custom", "--master-machine-type",
                                                            "n1-standard-4", "--worker-machine-type", "n1-standard-4"]),
    ("empty --region", None, ["--region", ""]),
    ("empty --scale-tier", None, ["--scale-tier", ""]),
    ("unknown --scale-tier", None, ["--scale-tier", "huge"]),
    ("--scale-tier basic-tpu", None, ["--scale-tier", "basic-tpu"]),
    ("negative --worker-count", None, ["--scale-tier", "custom", "--master-machine-type", "n1-standard-4",
                                       "--worker-machine-type", "n1-standard-4", "--worker-count", "-2"]),
    ("--worker-count not a number", None, ["--worker-count", "two"]),
    ("--worker-count without a type", None, ["--scale-tier", "custom", "--master-machine-type", "n1-standard-4",
                                             "--worker-count", "2"]),
    ("--worker-count with no tier or master", None, ["--worker-count", "2", "--worker-machine-type", "n1-standard-4"]),
    ("accelerator without count", None, ["--master-machine-type", "n1-standard-8", "--master-accelerator", "type=nvidia-tesla-t4"]),
    ("accelerator with an unknown key", None, ["--master-machine-type", "n1-standard-8", "--master-accelerator", "kind=t4,count=1"]),
    ("TPU accelerator flag", None, ["--master-machine-type", "n1-standard-8", "--master-accelerator", "type=tpu-v2,count=8"]),
    ("accelerator count 0 flag", None, ["--master-machine-type", "n1-standard-8", "--master-accelerator", "type=nvidia-tesla-t4,count=0"]),
    ("--master-machine-type cloud_tpu", None, ["--master-machine-type", "cloud_tpu"]),
    ("unknown machine type", None, ["--master-machine-type", "n1-standard-3"]),
    ("machine type with a fixed tier", None, ["--scale-tier", "premium-1", "--master-machine-type", "n1-standard-4"]),
    ("image and runtime version", None, ["--master-image-uri", "example.com/img:1", "--runtime-version", "2.11"]),
    ("bad --verbosity", None, ["--verbosity", "loud"]),
    ("unsupported --format", None, ["--format", "flattened"]),
    ("bad label key", None, ["--labels", "Team=ml"]),
    ("70 labels", None, ["--labels", ",".join(f"k{i}=v" for i in range(70))]),
    ("a newline in a label value", None, ["--labels", "team=ml\nx"]),
    ("--async with --stream-logs", None, ["--async", "--stream-logs"]),
    ("unknown flag", None, ["--bogus-flag", "1"]),
    ("--use-chief-in-tf-config not a boolean", None, ["--use-chief-in-tf-config", "maybe"]),
    ("--project without a value", None, ["--project"]),
    ("--flags-file that is a list", "- --region\n", ["--flags-file"]),
]


@pytest.fixture
def package(tmp_path):
    path = tmp_path / "trainer-0.1.tar.gz"
    path.write_bytes(b"not really an sdist: validation fails before anyone reads it")
    return path


def _run(case, tmp_path, package):
    name, config_text, extra = case[0], case[1], list(case[2])
    args = ["jobs", "submit", "training", "malformed", "--packages", str(package),
            "--module-name", "trainer.task", "--job-dir", str(tmp_path / "out")]
    if config_text is not None:
        config = tmp_path / f"config-{CASES.index(case)}.yaml"
        config.write_bytes(config_text.encode("utf-8", "surrogateescape"))  # a lone \udcff: a non-UTF-8 byte
        args += [extra.pop(), str(config)] if extra == ["--flags-file"] else ["--config", str(config)]
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock", "STORAGE_EMULATOR_HOST": ""}
    result = subprocess.run([sys.executable, "-m", "aiptrain", *args, *extra, "--", "--steps", "1"],
                            capture_output=True, text=True, env=env, timeout=120)
    return name, result


def test_each_malformed_input_exits_2_with_one_line_and_leaves_nothing(home, tmp_path, package):
    assert len(CASES) >= 25
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda case: _run(case, tmp_path, package), CASES))
    problems = []
    for name, result in results:
        error_lines = [line for line in result.stderr.splitlines() if line.startswith(("ERROR:", "Error:"))]
        if result.returncode != 2 or len(error_lines) != 1 or "Traceback" in result.stderr:
            problems.append(f"{name}: exit {result.returncode}, stderr {result.stderr!r}")
        elif result.stdout:
            problems.append(f"{name}: printed to stdout: {result.stdout!r}")
    assert not problems, "\n".join(problems)
    assert not (tmp_path / "out").exists()
    leftovers = [p for d in ("bucket", "logs", "work") for p in (home / d).rglob("*") if p.is_file()]
    assert not leftovers
    if (home / "jobs.db").exists():
        from aiptrain.store import JobStore

        assert JobStore(home / "jobs.db").all() == []


def test_error_lines_name_the_problem(home, tmp_path, package):
    """A few lines checked word for word: the field, the value and the way out."""
    wanted = {
        "scale tier with a blank": "trainingInput.scaleTier [BASIC ] is not a scale tier",
        "empty --region": "argument --region: give a non-empty value",
        "TPU accelerator flag": "TPUs cannot be emulated",
        "--master-machine-type cloud_tpu": "Cloud TPU, which aiptrain cannot emulate",
        "machine type with a fixed tier": "scale tier PREMIUM_1 has fixed machines",
        "worker count without type": "--worker-machine-type is required when --worker-count is greater than 0",
        "unsupported --format": "--format [flattened] is not supported here",
    }
    cases = [case for case in CASES if case[0] in wanted]
    for name, result in (_run(case, tmp_path, package) for case in cases):
        assert wanted[name] in result.stderr, (name, result.stderr)
