"""Studies on the real engine against what trainers really do (issue 16, item 5) and what a
hostile one does (issue 21, items 1, 2, 3 and 5): the metric from TensorFlow summary events,
trials whose only report is their last one, links and FIFOs planted where the host side (root)
looks, and a controller killed between creating and starting a trial's replica."""

import os
from pathlib import Path

import pytest
import yaml

from aiptrain.jobpaths import JobPaths

from conftest import job_resources, kill_controller, require_image, runtime_image, wait_for
from test_tuning_docker import describe, trials_of

TRAINERS = Path(__file__).parents[1] / "trainers"


@pytest.fixture
def study(tmp_path, cli, monkeypatch):
    """Submit a study: `study(job_id, spec, trainer, runtime, *user_args, wait=True, code=None)`."""
    monkeypatch.setenv("AIPTRAIN_POLL_SECONDS", "0.2")

    def submit(job_id, spec, trainer, runtime, *user_args, wait=True, code=None):
        config = tmp_path / f"{job_id}.yaml"
        config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": spec}}))
        args = ["jobs", "submit", "training", job_id, "--config", str(config),
                "--package-path", str(TRAINERS / trainer), "--module-name", f"{trainer}.task",
                "--job-dir", str(tmp_path / job_id), "--region", "us-central1", "--runtime-version", runtime]
        if wait:
            args.append("--stream-logs")
        return cli(*args, "--", *user_args, timeout=900, check_code=code)

    return submit


@pytest.fixture
def secret(tmp_path):
    """A root-only host directory holding a root-only file: what a trainer's links aim at."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("12345\n")
    os.chmod(private / "secret", 0o600)
    return private


def untouched(path: Path) -> bool:
    info = path.stat()
    return (info.st_uid, info.st_gid, oct(info.st_mode & 0o777)) == (os.getuid(), os.getgid(), "0o700") and sorted(
        p.name for p in path.iterdir()) == ["secret"]


@pytest.mark.tensorflow
def test_a_study_reads_tensorflow_summaries_and_final_reports_are_not_stopped_early(cli, study, docker_api):
    """Every trial reports once, through tf.summary (TF2 tensors or TF1 simple values), then
    pauses as a trainer saving its model would: the study takes each finalMetric from the
    events, and with early stopping on no trial whose only report was its final one is marked
    stopped early."""
    require_image(docker_api, runtime_image("2.11"))
    spec = {"algorithm": "GRID_SEARCH", "maxTrials": 6, "maxParallelTrials": 1, "enableTrialEarlyStopping": True,
            "hyperparameterMetricTag": "epoch_accuracy",
            "params": [{"parameterName": "lr", "type": "DISCRETE", "discreteValues": [0.1, 0.2, 0.3]},
                       {"parameterName": "style", "type": "CATEGORICAL", "categoricalValues": ["tf1", "tf2"]}]}
    result = study("summaries", spec, "summary_tuner", "2.11", "--epochs", "1", "--pause", "2", code=0)
    assert "state: SUCCEEDED" in result.stdout
    trials = trials_of(describe(cli, "summaries"))
    assert len(trials) == 6
    for trial in trials.values():
        assert trial["state"] == "SUCCEEDED"
        assert trial["finalMetric"]["trainingStep"] == "0"
        assert trial["finalMetric"]["objectiveValue"] == pytest.approx(float(trial["hyperparameters"]["lr"]))
        assert not trial.get("isTrialStoppedEarly"), trial
    assert job_resources(docker_api, "summaries") == []


def test_links_and_fifos_a_trainer_plants_are_never_followed_nor_block(cli, study, docker_api, minimal_runtime,
                                                                       tmp_path, secret):
    """Issue 21, items 1 to 3: a trial links the next trials' directories and its metric file
    to a root-only host directory and file, to /dev/zero, or makes the metric file a FIFO. The
    study ends; the host directory keeps its owner, mode and contents; no root-only byte
    becomes a metric; the trials that were not hostile keep theirs."""
    attacks = ["link-next-trial", "link-metric", "zero-metric", "fifo-metric", "hostile-events", "plain"]
    spec = {"algorithm": "GRID_SEARCH", "maxTrials": 6, "maxParallelTrials": 1, "maxFailedTrials": 6,
            "params": [{"parameterName": "attack", "type": "CATEGORICAL", "categoricalValues": attacks}]}
    study("hostile", spec, "hostile", minimal_runtime, "--secret", str(secret), code=0)
    job = describe(cli, "hostile")
    assert untouched(secret)
    trials = trials_of(job)
    for trial_id, trial in trials.items():
        attack = trial["hyperparameters"]["attack"]
        metric = (trial.get("finalMetric") or {}).get("objectiveValue")
        assert metric != 12345.0, trial  # the root-only file's content never became a metric
        if attack in ("link-metric", "zero-metric", "fifo-metric"):
            assert metric is None, trial
        elif trial["state"] == "SUCCEEDED":
            assert metric == float(trial_id), trial
    # A trial whose directory an earlier trial had made a link did not start: said in one line.
    refused = [t for t in trials.values() if t["state"] == "FAILED"]
    log = cli("jobs", "stream-logs", "hostile", check_code=0).stdout + cli(
        "jobs", "stream-logs", "hostile", check_code=0).stderr
    for trial in refused:
        assert f"Trial {trial['trialId']} could not start" in log
    assert job_resources(docker_api, "hostile") == []


def test_cancel_is_not_held_up_by_a_fifo_metric_file(cli, study, docker_api, minimal_runtime, secret, home):
    """Issue 21, item 3: the metric file is a FIFO and the trial still runs; the study reads it
    every poll without blocking, and `jobs cancel` ends the job."""
    spec = {"maxTrials": 2, "maxParallelTrials": 1, "enableTrialEarlyStopping": True,
            "params": [{"parameterName": "attack", "type": "CATEGORICAL", "categoricalValues": ["fifo-metric"]}]}
    study("fifo_cancel", spec, "hostile", minimal_runtime, "--sleep", "600", wait=False, code=0)
    wait_for(lambda: docker_api.containers(filters={"label": "aiptrain.job-id=fifo_cancel", "status": "running"}),
             timeout=120, what="the trial running")
    wait_for(lambda: list(JobPaths(home, "fifo_cancel").trials_dir.glob("*/*.metrics")), timeout=60,
             what="the FIFO planted")
    cli("jobs", "cancel", "fifo_cancel", check_code=0, timeout=120)
    job = wait_for(lambda: (lambda j: j if j["state"] == "CANCELLED" else None)(describe(cli, "fifo_cancel")),
                   timeout=120, what="the job cancelled")
    assert {t["state"] for t in trials_of(job).values()} == {"CANCELLED"}
    assert job_resources(docker_api, "fifo_cancel") == []


def test_a_trial_created_but_never_started_is_started_by_the_next_controller(cli, study, docker_api, minimal_runtime,
                                                                            tmp_path, home):
    """Issue 21, item 5: the controller dies between creating a trial's replica and starting
    it (made here exactly: the trial's replica replaced by a `Created` copy of it and its launch
    not recorded as done). The next controller does not count it as running: the trial runs,
    once, and the study ends."""
    spec = {"algorithm": "GRID_SEARCH", "maxTrials": 2, "maxParallelTrials": 1,
            "params": [{"parameterName": "attack", "type": "CATEGORICAL", "categoricalValues": ["plain"]},
                       {"parameterName": "n", "type": "INTEGER", "minValue": 1, "maxValue": 2}]}
    study("created_only", spec, "hostile", minimal_runtime, "--sleep", "300", wait=False, code=0)
    running = wait_for(lambda: docker_api.containers(filters={"label": "aiptrain.job-id=created_only",
                                                              "status": "running"}), timeout=120, what="trial 1")
    runs = tmp_path / "created_only" / "runs.log"
    # The trainer makes runs.log (as the replicas' user) when it starts: made here by root instead,
    # the replica could not write it (as on a busy machine, where the kill came first).
    wait_for(lambda: runs.is_file() and runs.read_text().split() == ["1"], timeout=120, what="trial 1's first run")
    kill_controller(home)
    info = docker_api.inspect_container(running[0]["Id"])
    docker_api.remove_container(info["Id"], force=True)
    config = info["Config"]
    docker_api.create_container(config["Image"], command=config["Cmd"], entrypoint=config["Entrypoint"],
                                environment=config["Env"], user=config["User"], working_dir=config["WorkingDir"],
                                hostname=config["Hostname"], labels=config["Labels"], name=info["Name"].lstrip("/"),
                                host_config=info["HostConfig"])
    JobPaths(home, "created_only").launched("1").unlink(missing_ok=True)
    runs.write_text("")  # trial 1's first run never happened, as if it had been killed before starting
    describe(cli, "created_only")  # takes the job over
    wait_for(lambda: runs.read_text().split() == ["1"], timeout=120, what="trial 1 to run")
    cli("jobs", "cancel", "created_only", check_code=0, timeout=120)
    assert job_resources(docker_api, "created_only") == [] or wait_for(
        lambda: job_resources(docker_api, "created_only") == [], timeout=60, what="cleanup")
