"""Flags merged over a --config file, as gcloud's BuildTrainingJob does."""

import pytest

from aiptrain.config import SubmitFlags, build_job, parse_accelerator
from aiptrain.errors import ValidationError
from aiptrain.model import AcceleratorConfig, ScaleTier

CONFIG = """
jobId: ignored_by_positional
labels: {team: a}
trainingInput:
  scaleTier: CUSTOM
  masterType: n1-highcpu-16
  workerType: n1-highcpu-16
  workerCount: 9
  parameterServerType: n1-highmem-8
  parameterServerCount: 3
  evaluatorType: n1-highcpu-16
  evaluatorCount: 1
  args: [--from-config]
  scheduling: {maxRunningTime: 7200s}
"""


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return str(path)


def test_config_is_the_base_and_flags_override(config_file):
    job = build_job(SubmitFlags(job_id="j", config=config_file, worker_count=2, module_name="trainer.task",
                                region="europe-west1"))
    ti = job.training_input
    assert job.job_id == "j"
    assert job.labels == {"team": "a"}
    assert (ti.scale_tier, ti.master_type, ti.worker_count, ti.parameter_server_count) == (ScaleTier.CUSTOM, "n1-highcpu-16", 2, 3)
    assert (ti.python_module, ti.region, ti.evaluator_count) == ("trainer.task", "europe-west1", 1)
    assert ti.scheduling.max_running_time == "7200s"


def test_empty_user_args_keep_config_args_and_given_ones_replace_them(config_file):
    assert build_job(SubmitFlags(job_id="j", config=config_file)).training_input.args == ["--from-config"]
    job = build_job(SubmitFlags(job_id="j", config=config_file, user_args=["--epochs", "5"]))
    assert job.training_input.args == ["--epochs", "5"]


def test_labels_flag_replaces_config_labels(config_file):
    assert build_job(SubmitFlags(job_id="j", config=config_file, labels={"b": "c"})).labels == {"b": "c"}


def test_accelerator_and_image_flags_set_replica_configs():
    job = build_job(SubmitFlags(job_id="j", master_accelerator="type=nvidia-tesla-t4,count=2",
                                worker_image_uri="img:1"))
    ti = job.training_input
    assert ti.master_config.accelerator_config == AcceleratorConfig(type="NVIDIA_TESLA_T4", count=2)
    assert ti.worker_config.image_uri == "img:1"


def test_describe_form_is_camel_case_with_int64_strings(config_file):
    resource = build_job(SubmitFlags(job_id="j", config=config_file)).to_resource()
    assert resource["trainingInput"]["workerCount"] == "9"
    assert resource["trainingInput"]["parameterServerType"] == "n1-highmem-8"


@pytest.mark.parametrize(
    "text, message",
    [
        ("trainingInput: {workerCont: 2}", "workerCont"),
        ("trainingInput: {workerCount: many}", "workerCount"),
        ("- a list", "must hold a Job resource"),
        ("trainingInput: {a: [", "not valid YAML"),
        ("!!python/object/apply:os.system ['echo pwned']", "not valid YAML"),  # safe_load refuses
    ],
)
def test_bad_config_files_are_one_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValidationError, match=message) as error:
        build_job(SubmitFlags(job_id="j", config=str(path)))
    assert "\n" not in str(error.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ValidationError, match="does not exist"):
        build_job(SubmitFlags(job_id="j", config=str(tmp_path / "nope.yaml")))


@pytest.mark.parametrize("value, message", [("type=nvidia-tesla-t4", "both keys"), ("count=0,type=x", "greater than 0"),
                                            ("nvidia", "type=nvidia-tesla-t4,count=1")])
def test_bad_accelerators(value, message):
    with pytest.raises(ValidationError, match=message):
        parse_accelerator(value, "--master-accelerator")


def test_unknown_scale_tier_flag_lists_gclouds_choices():
    with pytest.raises(ValidationError) as error:
        build_job(SubmitFlags(job_id="j", scale_tier="weird"))
    assert str(error.value) == (
        "Invalid --scale-tier [weird]: choose one of basic, standard-1, premium-1, basic-gpu, basic-tpu, custom."
    )


def test_only_settings_reads_aiptrains_environment():
    """Every AIPTRAIN_* variable is read in aiptrain/settings.py, so one place says what each does
    and two readers cannot disagree; the storage endpoint's server runs alone in its container,
    and the launcher finds the home (AIPTRAIN_HOME) before any import, as settings does
    (tests/cli/test_command_server.py keeps the two in step)."""
    import re
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "aiptrain"
    read = re.compile(r"""(?:environ\.get\(|environ\[|getenv\()\s*f?["']AIPTRAIN_""")
    readers = {str(path.relative_to(package)) for path in package.rglob("*.py") if read.search(path.read_text())}
    assert readers == {"settings.py", "storage/endpoint_server.py", "launcher.py"}
