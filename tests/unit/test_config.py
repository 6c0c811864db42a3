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


# TrainingInput fields written at the top level of a --config file (not under `trainingInput:`):
# gcloud 528 reads such a file and posts them at the top level of the Job body (apitools keeps a
# message's unknown fields), and the service took them as if they were under trainingInput.
# (config written, the same config written as the service documents it)
TOP_LEVEL_CONFIGS = [
    ("scaleTier: CUSTOM\nmasterType: n1-standard-8\n",
     "trainingInput: {scaleTier: CUSTOM, masterType: n1-standard-8}\n"),
    ("jobId: x\nlabels: {a: b}\nscaleTier: STANDARD_1\nargs: [--epochs, '5']\n",
     "jobId: x\nlabels: {a: b}\ntrainingInput: {scaleTier: STANDARD_1, args: [--epochs, '5']}\n"),
    ("workerCount: 2\nworkerType: n1-standard-4\nmasterType: n1-standard-4\nscaleTier: custom\n",
     "trainingInput: {workerCount: '2', workerType: n1-standard-4, masterType: n1-standard-4, scaleTier: CUSTOM}\n"),
    ("hyperparameters:\n  goal: MINIMIZE\n  params:\n  - {parameterName: lr, type: DOUBLE, minValue: 0.1, maxValue: 1}\n",
     "trainingInput:\n  hyperparameters:\n    goal: MINIMIZE\n    params:\n"
     "    - {parameterName: lr, type: DOUBLE, minValue: 0.1, maxValue: 1}\n"),
    # some fields in one place, some in the other: the two are merged
    ("masterType: n1-standard-8\ntrainingInput: {scaleTier: CUSTOM}\n",
     "trainingInput: {scaleTier: CUSTOM, masterType: n1-standard-8}\n"),
    ("trainingInput:\nscaleTier: BASIC_GPU\n", "trainingInput: {scaleTier: BASIC_GPU}\n"),  # an empty trainingInput
    ("masterConfig: {imageUri: gcr.io/p/i:1}\nscheduling: {maxRunningTime: 60s}\n",
     "trainingInput: {masterConfig: {imageUri: gcr.io/p/i:1}, scheduling: {maxRunningTime: 60s}}\n"),
    ('{"scaleTier": "BASIC", "region": "europe-west1", "runtimeVersion": "2.11"}',  # JSON too
     '{"trainingInput": {"scaleTier": "BASIC", "region": "europe-west1", "runtimeVersion": "2.11"}}'),
]


@pytest.mark.parametrize("written, documented", TOP_LEVEL_CONFIGS)
def test_training_fields_at_the_top_level_make_the_job_they_make_under_training_input(tmp_path, written, documented):
    (tmp_path / "written.yaml").write_text(written)
    (tmp_path / "documented.yaml").write_text(documented)
    for flags in ({}, {"module_name": "trainer.task", "region": "us-east1", "worker_count": 3}):
        job = build_job(SubmitFlags(job_id="j", config=str(tmp_path / "written.yaml"), **flags))
        assert job == build_job(SubmitFlags(job_id="j", config=str(tmp_path / "documented.yaml"), **flags))
        assert set(job.to_resource()) <= {"jobId", "labels", "trainingInput"}


# (config, what the job gets): a field given both at the top level and under trainingInput keeps
# the trainingInput value (that is where gcloud puts what the flags set), and flags win over both.
TOP_LEVEL_CONFLICTS = [
    ("region: europe-west1\ntrainingInput: {region: asia-east1}\n", {}, "region", "asia-east1"),
    ("region: europe-west1\n", {"region": "us-east1"}, "region", "us-east1"),
    ("scaleTier: CUSTOM\nmasterType: n1-standard-8\n", {"scale_tier": "basic"}, "scale_tier", ScaleTier.BASIC),
    ("masterType: n1-standard-8\n", {"master_machine_type": "n1-standard-4"}, "master_type", "n1-standard-4"),
    ("args: [--a]\ntrainingInput: {args: [--b]}\n", {"user_args": ["--c"]}, "args", ["--c"]),
    ("args: [--a]\ntrainingInput: {args: [--b]}\n", {}, "args", ["--b"]),
]


@pytest.mark.parametrize("config, flags, field, value", TOP_LEVEL_CONFLICTS)
def test_training_input_and_flags_win_over_the_top_level(tmp_path, config, flags, field, value):
    path = tmp_path / "config.yaml"
    path.write_text(config)
    assert getattr(build_job(SubmitFlags(job_id="j", config=str(path), **flags)).training_input, field) == value


@pytest.mark.parametrize("text, message", [
    ("workerCount: many\n", "Invalid --config file [{path}]: trainingInput.workerCount: "),
    ("scaleTier: 'CUSTOM '\n", "trainingInput.scaleTier [CUSTOM ] is not a scale tier"),
    ("scaleTeir: CUSTOM\n", "Invalid --config file [{path}]: scaleTeir: Extra inputs are not permitted."),
    ("masterType: n1-standard-8\ntrainingInput: [a]\n", "Invalid --config file [{path}]: trainingInput: "),
])
def test_top_level_training_fields_are_checked_as_under_training_input(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValidationError) as error:
        build_job(SubmitFlags(job_id="j", config=str(path)))
    assert message.format(path=path) in str(error.value) and "\n" not in str(error.value)
