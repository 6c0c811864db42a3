"""Issue 21, items 7, 9 and 10: the service's limits on inputs, and exit 2 (input) or 3 (environment)
where aiptrain used to fail with exit 4. Pure rules are table-tested; the CLI runs in-process (the
`run` fixture) or, where a real process matters, as one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from aiptrain.admission import parallel_trials_allowed
from aiptrain.errors import ValidationError
from aiptrain.filtering import MAX_NESTING, parse
from aiptrain.validation import (
    MAX_DURATION_SECONDS,
    parse_duration_seconds,
    validate_image_reference,
    validate_labels,
    validate_runtime_version_name,
)

from conftest import SAMPLE_TRAINER

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "STORAGE_EMULATOR_HOST": ""}


def one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR: ") and "Traceback" not in stderr, stderr
    return lines[0]


# -- item 7: durations the service could not take -------------------------------------------------


@pytest.mark.parametrize("text, seconds", [
    ("7200s", 7200.0), ("1.5s", 1.5), ("0.123456789s", 0.123456789), (f"{MAX_DURATION_SECONDS}s", MAX_DURATION_SECONDS),
])
def test_durations_within_the_services_range(text, seconds):
    assert parse_duration_seconds(text, "scheduling.maxRunningTime") == seconds


@pytest.mark.parametrize("text, problem", [
    ("99999999999999999999999s", f"at most {MAX_DURATION_SECONDS}s"),
    (f"{MAX_DURATION_SECONDS + 1}s", f"at most {MAX_DURATION_SECONDS}s"),
    ("1.1234567891s", "at most nine fractional digits"),
    ("1e30s", "write a duration in seconds"),
])
def test_durations_beyond_the_services_range_are_refused(text, problem):
    with pytest.raises(ValidationError, match=problem):
        parse_duration_seconds(text, "scheduling.maxWaitTime")


@pytest.mark.parametrize("field", ["maxRunningTime", "maxWaitTime"])
def test_a_huge_duration_is_refused_at_submit(run, tmp_path, field):
    """It used to pass, and the job's driver died later with OverflowError, failing the job."""
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").touch()
    config = tmp_path / "config.yaml"
    config.write_text(f"trainingInput:\n  scheduling:\n    {field}: 99999999999999999999999s\n")
    code, out, err = run("jobs", "submit", "training", "huge", "--package-path", str(package),
                         "--module-name", "trainer.task", "--config", str(config), "--dry-run")
    assert code == 2 and out == ""
    assert f"scheduling.{field}" in one_error_line(err)


# -- item 9: exit 2 or 3, not 4 -------------------------------------------------------------------


def test_a_filter_nested_thousands_deep_is_one_line_and_exit_2(run):
    for text in ["(" * 5000 + "state:RUNNING" + ")" * 5000, "NOT " * 5000 + "a", "-" * 5000 + "a"]:
        code, out, err = run("jobs", "list", "--filter", text)
        assert code == 2 and out == "", err
        line = one_error_line(err)
        assert f"nested more than {MAX_NESTING} deep" in line and len(line) < 300


def test_filters_nested_up_to_the_bound_still_parse():
    assert parse("(" * MAX_NESTING + "state:RUNNING" + ")" * MAX_NESTING)
    assert parse("NOT " * (MAX_NESTING - 1) + "a")


@pytest.mark.parametrize("image", ["Bad Image!!", "UPPER/img", "img:", "a:b:c", "", "-x", "a//b", "x" * 300])
def test_malformed_image_names_are_refused(image):
    with pytest.raises(ValidationError, match="Invalid image name"):
        validate_image_reference(image)


@pytest.mark.parametrize("image", ["ubuntu", "ubuntu:22.04", "aiptrain/runtime:2.11", "localhost:5000/a/b:t",
                                   "gcr.io/project/trainer@sha256:" + "a" * 64, "Registry.Example.com/team/x"])
def test_image_names_docker_takes(image):
    assert validate_image_reference(image) == image


@pytest.mark.parametrize("version, image, problem", [
    ("mine", "Bad Image!!", "Invalid image name [Bad Image!!]"),
    ("", "ubuntu", "Invalid runtime version []"),
    ("../../etc", "ubuntu", "Invalid runtime version [../../etc]"),
])
def test_runtimes_add_refuses_malformed_names_before_asking_the_engine(home, version, image, problem):
    """Exit 4 ("APIError: 400 ... invalid reference format") before, and `""`/`../../etc` were mapped."""
    result = subprocess.run([sys.executable, "-m", "aiptrain", "runtimes", "add", version, "--image", image],
                            capture_output=True, text=True, env={**os.environ, **NO_ENGINE}, timeout=60)
    assert result.returncode == 2, result.stderr
    assert problem in one_error_line(result.stderr)
    assert not (home / "runtimes.json").exists()


@pytest.mark.parametrize("version", ["2.11", "minimal", "team-tf_1.0"])
def test_runtime_version_names(version):
    assert validate_runtime_version_name(version) == version


def test_gcloud_shim_into_a_directory_that_cannot_be_made_is_exit_3(run, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, _, err = run("gcloud-shim", "install", str(blocker / "bin"))
    assert code == 3
    assert f"Cannot write the shim into [{blocker / 'bin'}]" in one_error_line(err)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_gcloud_shim_into_a_read_only_directory_is_exit_3_and_writes_nothing(run, tmp_path):
    """Root writes anywhere a mode allows: a read-only filesystem is what it cannot write."""
    target = tmp_path / "ro"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(target)], check=True)
    try:
        code, _, err = run("gcloud-shim", "install", str(target))
        assert code == 3
        assert "Read-only file system" in one_error_line(err)
        assert os.listdir(target) == []
    finally:
        subprocess.run(["umount", str(target)], check=True)


# -- item 10: the service's limits ---------------------------------------------------------------


def labels_flag(count: int) -> str:
    return ",".join(f"k{i}=v" for i in range(count))


def test_at_most_64_labels():
    validate_labels({f"k{i}": "v" for i in range(64)})
    with pytest.raises(ValidationError, match="70 labels given: a job has at most 64"):
        validate_labels({f"k{i}": "v" for i in range(70)})


@pytest.mark.parametrize("labels, problem", [
    ({"team": "a\nb"}, r"Invalid label value \[a\\nb\] for \[team\]"),
    ({"k" * 64: "v"}, "keys have 1 to 63 characters"),
    ({"team": "v" * 64}, "values have at most 63 characters"),
    ({"t\x1b[31m": "v"}, r"Invalid label key \[t\\x1b\[31m\]"),
])
def test_label_rules_are_said_on_one_line(labels, problem):
    with pytest.raises(ValidationError, match=problem) as error:
        validate_labels(labels)
    assert "\n" not in str(error.value) and "\x1b" not in str(error.value)


def test_70_labels_at_submit_and_a_newline_in_a_value_are_exit_2_in_one_line(run, tmp_path):
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").touch()
    submit = ("jobs", "submit", "training", "labelled", "--package-path", str(package), "--module-name", "t.task",
              "--dry-run")
    code, _, err = run(*submit, "--labels", labels_flag(70))
    assert code == 2 and "at most 64" in one_error_line(err)
    code, _, err = run(*submit, "--labels", "team=ml\nrm -rf")
    assert code == 2 and r"[ml\nrm -rf]" in one_error_line(err)


def test_jobs_update_cannot_grow_labels_past_64(run, home):
    from aiptrain.model import Job
    from aiptrain.store import JobStore

    home.mkdir(parents=True)
    with JobStore(home / "jobs.db") as store:
        store.create(Job.model_validate({"jobId": "many", "labels": {f"k{i}": "v" for i in range(60)}}))
    code, _, err = run("jobs", "update", "many", "--update-labels", labels_flag(70))
    assert code == 2 and "at most 64" in one_error_line(err)
    with JobStore(home / "jobs.db") as store:
        assert len(store.get("many").labels) == 60


@pytest.mark.parametrize("per_trial, cpus, override, allowed", [
    (1, 2, None, 4),  # two replicas per core
    (3, 2, None, 1),  # a trial larger than the machine still runs, one at a time
    (2, 8, None, 8),
    (1, 2, 6, 6),  # AIPTRAIN_MAX_RUNNING_REPLICAS decides
    (4, 2, 6, 1),
    (1, 2, 0, None),  # no cap: only maxParallelTrials' own bound
])
def test_parallel_trials_the_machine_runs(per_trial, cpus, override, allowed):
    assert parallel_trials_allowed(per_trial, cpus, override)[0] == allowed


def test_a_study_running_more_trials_at_once_than_the_machine_runs_is_accepted_with_one_warning(
        run, tmp_path, monkeypatch):
    """Never refused for the machine's size (the service ran such configs): the trials that fit
    run at once, the others wait; submit says so once, naming the bound, why and how to change it."""
    monkeypatch.setenv("AIPTRAIN_MAX_RUNNING_REPLICAS", "4")
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").touch()
    config = tmp_path / "study.yaml"

    def submit(parallel: int):
        config.write_text(
            "trainingInput:\n  hyperparameters:\n    goal: MINIMIZE\n    maxTrials: 20\n"
            f"    maxParallelTrials: {parallel}\n    params:\n"
            "    - {parameterName: lr, type: DOUBLE, minValue: 0.001, maxValue: 0.1}\n"
        )
        return run("jobs", "submit", "training", "study", "--package-path", str(package),
                   "--module-name", "trainer.task", "--config", str(config), "--dry-run")

    code, out, err = submit(5)
    assert code == 0 and out
    warnings = [line for line in err.splitlines() if "maxParallelTrials" in line]
    assert warnings == [
        "WARNING: trainingInput.hyperparameters.maxParallelTrials [5]: this machine runs 4 of the study's trials "
        "at once (1 replica each; at most 4 replicas at once: AIPTRAIN_MAX_RUNNING_REPLICAS=4), and starts its "
        "other trials as earlier ones end. Set AIPTRAIN_MAX_RUNNING_REPLICAS to change it (0: no cap)."
    ]
    code, _, err = submit(4)
    assert code == 0 and "maxParallelTrials" not in err  # it fits: nothing to say


@pytest.mark.parametrize("argv, problem", [
    (["jobs", "describe"], "Missing argument 'JOB'."),
    (["jobs", "submit", "training", "x", "--bogus"], "No such option '--bogus'."),
    (["jobs", "list", "--limit", "many"], "Invalid value for '--limit'"),
    (["nonsense"], "No such command 'nonsense'."),
])
def test_click_usage_errors_are_one_line_with_the_way_out(run, argv, problem):
    code, out, err = run(*argv)
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert problem in line and "-h` for help" in line and "Usage: aiptrain" in line


@pytest.mark.parametrize("argv, shown", [
    (["jobs", "describe", "x\ny"], r"Job [x\ny] not found"),
    (["runtimes", "remove", "a\nb"], r"Runtime version [a\nb] is not mapped"),
    (["jobs", "submit", "training", "j", "--package-path", str(SAMPLE_TRAINER), "--module-name", "trainer.task",
      "--runtime-version", "a\nb", "--dry-run"], r"Unknown --runtime-version [a\nb]"),
])
def test_every_error_stays_on_one_line_whatever_value_it_echoes(run, argv, shown):
    code, _, err = run(*argv)
    assert code == 2 and shown in one_error_line(err)
