"""translate(): a Vertex AI CustomJobSpec as the ml v1 job the controller runs, the replicas'
contract and the controller's rules, table-tested on the JSON the clients send (camelCase, enums
as names or as the integers the SDK's REST transport sends, int64 as strings)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from aiptrain.client import Client
from aiptrain.config import SubmitFlags
from aiptrain.errors import ValidationError
from aiptrain.lifecycle import RunRules
from aiptrain.model import Job, State, TrainingOutput
from aiptrain.submission import plan_inputs
from aiptrain.vertex import views
from aiptrain.vertex.records import CUSTOM_JOBS, Record
from aiptrain.vertex.resources import CustomJobSpec
from aiptrain.vertex.translate import SPOT_NOTICE, WEB_ACCESS_NOTICE, translate, vertex_message

IMAGE = "aiptrain/runtime:2.11"
TF_EXECUTOR = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-11.py310:latest"


def container(image: str = IMAGE, count: object = 1, **spec) -> dict:
    return {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": count,
            "containerSpec": {"imageUri": image, **spec}}


def package(count: object = 1, executor: str = TF_EXECUTOR, **spec) -> dict:
    return {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": count,
            "pythonPackageSpec": {"executorImageUri": executor, "packageUris": ["gs://b/trainer-0.1.tar.gz"],
                                  "pythonModule": "trainer.task", **spec}}


def translated(pools: list[dict], **spec):
    return translate("custom_job_1", "1", CustomJobSpec.model_validate({"workerPoolSpecs": pools, **spec}))


# -- pools --------------------------------------------------------------------------------------

POOLS = [
    # (case, pools, (workers, parameter servers, evaluators))
    ("the primary alone", [container()], (None, None, None)),
    ("workers", [container(), container(count=2)], (2, None, None)),
    ("replicaCount as the REST transport's int64 string", [container(), container(count="3")], (3, None, None)),
    ("no replicaCount: one", [container(), {"containerSpec": {"imageUri": IMAGE}}], (1, None, None)),
    ("all four pools", [container(), container(count=2), container(), container()], (2, 1, 1)),
    ("placeholders keep the later pools' numbers", [container(), {}, container(count="2")], (None, 2, None)),
    ("an evaluator behind two placeholders", [container(), {}, {}, container()], (None, None, 1)),
]


@pytest.mark.parametrize("pools, counts", [case[1:] for case in POOLS], ids=[case[0] for case in POOLS])
def test_pools_become_ai_platforms_task_types(pools, counts):
    ti = translated(pools).job.training_input
    assert ti.scale_tier.value == "CUSTOM" and ti.master_type == "n1-standard-4" and ti.use_chief_in_tf_config
    assert (ti.worker_count, ti.parameter_server_count, ti.evaluator_count) == counts
    for count, machine in zip(counts, (ti.worker_type, ti.parameter_server_type, ti.evaluator_type), strict=True):
        assert (machine is None) == (count is None)


REFUSED = [
    ("no pools", [], "workerPoolSpecs[0] is required"),
    ("a placeholder primary", [{}, container()], "workerPoolSpecs[0] is required"),
    ("two primaries", [container(count=2)], "workerPoolSpecs[0].replicaCount must be 1"),
    ("a pool of none", [container(), container(count="0")], "workerPoolSpecs[1].replicaCount must be at least 1"),
    ("five pools", [container()] * 5, "holds 5 pools; Vertex AI takes at most 4"),
    ("both specs", [{**container(), **package()}], "needs exactly one of containerSpec and pythonPackageSpec"),
    ("no image", [{"containerSpec": {"command": ["true"]}}], "containerSpec.imageUri is required"),
    ("mixed kinds", [container(), package()], "mix containerSpec and pythonPackageSpec"),
    ("no executor image", [package(executor="")], "executorImageUri is required"),
    ("no packages", [package(packageUris=[])], "packageUris is required"),
    ("no module", [package(pythonModule="")], "pythonModule is required"),
    ("another image per pool", [package(), package(executor=TF_EXECUTOR.replace("2-11", "2-8"))],
     "differs from workerPoolSpecs[0]'s executorImageUri"),
    ("an image that is no prebuilt one", [package(executor="gcr.io/mine/trainer:1")],
     "is not one of Vertex AI's prebuilt training images"),
    ("an output prefix outside Cloud Storage", [container()], "is not a gs:// URI"),
]


@pytest.mark.parametrize("pools, message", [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_specs_the_service_or_aiptrain_refuses_are_one_line_naming_the_field(pools, message):
    extra = {"baseOutputDirectory": {"outputUriPrefix": "/tmp/out"}} if "gs:// URI" in message else {}
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")) as refused:
        translated(pools, **extra)
    assert "\n" not in str(refused.value) and str(refused.value).startswith("jobSpec.")


# -- containers, executor images, env and args per pool ------------------------------------------------


def test_each_pools_container_keeps_its_image_command_args_and_env():
    translation = translated([
        container(command=["python3", "-m", "chief"], args=["--steps", "2"], env=[{"name": "ROLE", "value": "chief"}]),
        container(image="example.com/worker:1", args=["--steps", "3"], env=[{"name": "ROLE", "value": "worker"}]),
        {},
        container(command=["python3", "-m", "evaluate"]),
    ])
    ti = translation.job.training_input
    assert (ti.master_config.image_uri, ti.master_config.container_command, ti.master_config.container_args) == (
        IMAGE, ["python3", "-m", "chief"], ["--steps", "2"])
    assert (ti.worker_config.image_uri, ti.worker_config.container_command, ti.worker_config.container_args) == (
        "example.com/worker:1", None, ["--steps", "3"])
    assert (ti.evaluator_config.container_command, ti.evaluator_config.container_args) == (
        ["python3", "-m", "evaluate"], None)
    assert translation.contract.task_env == {"master": {"ROLE": "chief"}, "worker": {"ROLE": "worker"}}


EXECUTORS = [
    (TF_EXECUTOR, "2.11", None),
    ("europe-docker.pkg.dev/vertex-ai/training/tf-cpu.2-8.py37:latest", "2.8", None),
    ("gcr.io/cloud-aiplatform/training/tf-cpu.2-3:latest", "2.3", None),
    ("us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-99.py310:latest", "2.11", "the newest built here"),
    ("us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0:latest", "2.11", None),
    ("us-docker.pkg.dev/vertex-ai/training/xgboost-cpu.1-1:latest", "2.2", None),
    # Every PyTorch image, any release, CPU/GPU/XLA, Vertex AI's or AI Platform's, runs PyTorch 2.13's CPU build.
    ("us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-1.py310:latest", "pytorch-2.13",
     "NOTE: [us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-1.py310:latest] runs on runtime pytorch-2.13 "
     "(PyTorch 2.13.0, CPU build)."),
    ("us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.1-13:latest", "pytorch-2.13",
     "(PyTorch 2.13.0, CPU build, on CPU: the GPU build is not here)."),
    ("europe-docker.pkg.dev/vertex-ai/training/pytorch-xla.2-4.py310:latest", "pytorch-2.13",
     "on CPU: the XLA build is not here"),
    ("gcr.io/cloud-ml-public/training/pytorch-cpu.1-4", "pytorch-2.13", "runs on runtime pytorch-2.13"),
    ("gcr.io/cloud-ml-public/training/pytorch-gpu.1-10", "pytorch-2.13", "the GPU build is not here"),
]


@pytest.mark.parametrize("uri, runtime, note", EXECUTORS)
def test_prebuilt_executor_images_run_on_the_runtime_that_holds_their_frameworks(uri, runtime, note):
    translation = translated([package(executor=uri)])
    ti = translation.job.training_input
    assert (ti.runtime_version, ti.package_uris, ti.python_module) == (
        runtime, ["gs://b/trainer-0.1.tar.gz"], "trainer.task")
    assert (note is None) == (not translation.notices) and all(note in n for n in translation.notices if note)
    assert all("\n" not in n for n in translation.notices)


def test_a_pytorch_image_a_team_mapped_is_taken_before_the_pytorch_runtime():
    uri = "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-1.py310:latest"
    spec = CustomJobSpec.model_validate({"workerPoolSpecs": [package(executor=uri)]})
    translation = translate("j", "1", spec, mapped_runtimes={uri: {"image": "team/torch:cuda"}})
    assert (translation.job.training_input.runtime_version, tuple(translation.notices)) == (uri, ())


def test_an_executor_image_a_team_mapped_runs_as_mapped():
    mapped = {"example.com/torch-trainer:1": {"image": "aiptrain-test/pytorch:latest"}}
    spec = CustomJobSpec.model_validate({"workerPoolSpecs": [package(executor="example.com/torch-trainer:1")]})
    assert translate("j", "1", spec, mapped_runtimes=mapped).job.training_input.runtime_version == \
        "example.com/torch-trainer:1"


def test_each_package_pool_keeps_its_args_and_env():
    translation = translated([
        package(args=["--role", "chief"], env=[{"name": "A", "value": "0"}]),
        package(count="2", args=["--role", "worker"]),
        {},
        package(args=["--role", "chief"], env=[{"name": "A", "value": "3"}]),
    ])
    ti = translation.job.training_input
    assert ti.args == ["--role", "chief"] and ti.worker_count == 2 and ti.evaluator_count == 1
    # The primary's args are the job's; a pool with other args has its own, one with the same none.
    assert translation.contract.task_args == {"worker": ["--role", "worker"]}
    assert translation.contract.task_env == {"master": {"A": "0"}, "evaluator": {"A": "3"}}


ACCELERATORS = [
    ({"acceleratorType": "NVIDIA_TESLA_T4", "acceleratorCount": 1}, ("NVIDIA_TESLA_T4", 1)),
    ({"acceleratorType": 5, "acceleratorCount": 2}, ("NVIDIA_TESLA_T4", 2)),  # the REST transport's integers
    ({"acceleratorType": "8", "acceleratorCount": "4"}, ("NVIDIA_TESLA_A100", 4)),
    ({"acceleratorType": 0, "acceleratorCount": 1}, None),  # ACCELERATOR_TYPE_UNSPECIFIED
    ({"acceleratorType": "NVIDIA_L4"}, None),  # no count: none
]


@pytest.mark.parametrize("machine, expected", ACCELERATORS)
def test_accelerators_as_names_or_integers(machine, expected):
    pool = container()
    pool["machineSpec"] = {"machineType": "n1-standard-8", **machine}
    ti = translated([container(), pool]).job.training_input
    config = ti.worker_config.accelerator_config
    assert ti.master_config.accelerator_config is None
    assert (None if config is None else (config.type, config.count)) == expected


def test_an_unknown_accelerator_is_refused_naming_the_choices():
    with pytest.raises(Exception, match="is not a value of AcceleratorType"):
        CustomJobSpec.model_validate({"workerPoolSpecs": [{**container(), "machineSpec": {"acceleratorType": 99}}]})


# -- the replicas' contract -----------------------------------------------------------------------------


def test_the_contract_names_the_pools_carries_the_spec_and_the_output_directories():
    spec = {"workerPoolSpecs": [container(), container(count="2")],
            "baseOutputDirectory": {"outputUriPrefix": "gs://b/out"}}
    translation = translate("custom_job_7", "7", CustomJobSpec.model_validate(spec), {"team": "a"})
    contract = translation.contract
    assert translation.job.job_id == "custom_job_7" and translation.job.labels == {"team": "a"}
    assert contract.cluster_spec_names == {"master": "workerpool0", "worker": "workerpool1", "ps": "workerpool2",
                                           "evaluator": "workerpool3"}
    # `job` is the spec with the proto's field names, as the ml v1 contract's TrainingInput is.
    assert json.loads(contract.cluster_spec_job)["worker_pool_specs"][1]["replica_count"] == "2"
    assert contract.env == {"CLOUD_ML_JOB_ID": "7"} and contract.bucket_mount_dir == "/gcs"
    assert contract.output_variables(None) == {"AIP_MODEL_DIR": "gs://b/out/model/",
                                               "AIP_CHECKPOINT_DIR": "gs://b/out/checkpoints/",
                                               "AIP_TENSORBOARD_LOG_DIR": "gs://b/out/logs/"}


def test_without_an_output_prefix_there_are_no_output_directories():
    assert translated([container()]).contract.output_variables(None) == {}


# -- scheduling -----------------------------------------------------------------------------------------

SCHEDULING = [
    # (case, scheduling, ml v1 scheduling (maxRunningTime, maxWaitTime), rules, notices)
    ("none", None, None, RunRules(limits_fail=True), ()),
    ("timeout", {"timeout": "7200s"}, ("7200s", None), RunRules(limits_fail=True), ()),
    ("fractional timeout", {"timeout": "1.5s"}, ("1.5s", None), RunRules(limits_fail=True), ()),
    ("restart the job on a worker's restart", {"restartJobOnWorkerRestart": True}, None,
     RunRules(restart_together=True, limits_fail=True), ()),
    ("retries disabled: no restarts, whatever else asks for them",
     {"restartJobOnWorkerRestart": True, "disableRetries": True}, None,
     RunRules(max_restarts=0, limits_fail=True), ()),
    ("STANDARD", {"strategy": "STANDARD"}, None, RunRules(limits_fail=True), ()),
    ("SPOT, as the REST transport's integer", {"strategy": 4}, None, RunRules(limits_fail=True), (SPOT_NOTICE,)),
    ("FLEX_START waits 24 hours unless told", {"strategy": "FLEX_START"}, (None, "86400s"),
     RunRules(limits_fail=True), ()),
    ("FLEX_START with its wait", {"strategy": 6, "maxWaitDuration": "1800s", "timeout": "60s"}, ("60s", "1800s"),
     RunRules(limits_fail=True), ()),
    ("FLEX_START with 0: waits for as long as it takes", {"strategy": "FLEX_START", "maxWaitDuration": "0s"}, None,
     RunRules(limits_fail=True), ()),
    ("a wait without FLEX_START is ignored, as the service ignores it", {"maxWaitDuration": "1800s"}, None,
     RunRules(limits_fail=True), ()),
]


@pytest.mark.parametrize("scheduling, ml_v1, rules, notices", [c[1:] for c in SCHEDULING],
                         ids=[c[0] for c in SCHEDULING])
def test_scheduling_becomes_the_jobs_limits_and_the_controllers_rules(scheduling, ml_v1, rules, notices):
    translation = translated([container()], **({"scheduling": scheduling} if scheduling is not None else {}))
    limits = translation.job.training_input.scheduling
    assert (None if limits is None else (limits.max_running_time, limits.max_wait_time)) == ml_v1
    assert translation.rules == rules and translation.notices == notices


@pytest.mark.parametrize("scheduling, field", [
    ({"timeout": "2h"}, "jobSpec.scheduling.timeout"),
    ({"strategy": "FLEX_START", "maxWaitDuration": "forever"}, "jobSpec.scheduling.maxWaitDuration"),
])
def test_a_malformed_duration_is_refused_naming_the_vertex_field(scheduling, field):
    with pytest.raises(ValidationError, match=rf"Invalid {field} \["):
        translated([container()], scheduling=scheduling)


def test_web_access_is_recorded_and_said_to_have_no_shell_here():
    translation = translated([container()], enableWebAccess=True)
    assert translation.job.training_input.enable_web_access and translation.notices == (WEB_ACCESS_NOTICE,)


# -- what the job says, in Vertex AI's words ---------------------------------------------------------------

MESSAGES = [
    ("The replica worker 1 exited with a non-zero status of 1.",
     "The replica workerpool1-1 exited with a non-zero status of 1."),
    ("The replica master 0 disappeared: its container was removed.",
     "The replica workerpool0-0 disappeared: its container was removed."),
    ("The job ran longer than scheduling.maxRunningTime (60s): its replicas were stopped.",
     "The job ran longer than scheduling.timeout (60s): its replicas were stopped."),
    ("The job did not start within scheduling.maxWaitTime (1800s).",
     "The job did not start within scheduling.maxWaitDuration (1800s)."),
    ("a trainer's own line: worker 1 of 2", "a trainer's own line: worker 1 of 2"),
]


@pytest.mark.parametrize("ours, theirs", MESSAGES)
def test_messages_in_vertex_words(ours, theirs):
    assert vertex_message(ours) == theirs


def _record() -> Record:
    return Record("p", CUSTOM_JOBS, "1", "us-central1", "2026-01-01T00:00:00Z",
                  {"displayName": "d", "jobSpec": {"workerPoolSpecs": [container()]}}, "p--custom_job_1")


@pytest.mark.parametrize("message, code", [
    ("The replica master 0 exited with a non-zero status of 2.", 3),
    ("The job ran longer than scheduling.maxRunningTime (60s): its replicas were stopped.", 4),
    ("The job did not start within scheduling.maxWaitTime (1800s).", 4),
    ("Docker refused the job's replicas: no room.", 13),
])
def test_a_failed_jobs_error_code(message, code):
    job = Job(job_id="custom_job_1", state=State.FAILED, error_message=message + "\n\nTo find out more ...")
    error = views.custom_job(_record(), job)["error"]
    assert error["code"] == code and error["message"].startswith(vertex_message(message))


def test_web_access_uris_are_keyed_by_vertex_node_names():
    uris = {"master-replica-0": "https://a", "worker-replica-0": "https://b", "worker-replica-1": "https://c"}
    job = Job(job_id="custom_job_1", state=State.RUNNING, start_time=datetime(2026, 1, 1, tzinfo=timezone.utc),
              training_output=TrainingOutput(web_access_uris=uris))
    assert views.custom_job(_record(), job)["webAccessUris"] == {
        "workerpool0-0": "https://a", "workerpool1-0": "https://b", "workerpool1-1": "https://c"}


def test_a_job_writing_its_output_to_cloud_storage_itself_gets_this_hosts_access(home, monkeypatch, tmp_path):
    """AIPTRAIN_GCS=remote: a Vertex job has no jobDir, only baseOutputDirectory; its replicas get
    the emulator (or credentials) this host reaches Cloud Storage with, as an ml v1 job's do."""
    monkeypatch.setenv("AIPTRAIN_GCS", "remote")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://storage.example:9023")
    translation = translate("custom_job_1", "1", CustomJobSpec.model_validate(
        {"workerPoolSpecs": [container()], "baseOutputDirectory": {"outputUriPrefix": "gs://out-bucket/run"}}))
    with Client() as client:
        submission = client.prepare(SubmitFlags(job_id="custom_job_1"), base=translation.job)
    submission.contract = translation.contract
    assert submission.writes_remote_gcs
    inputs = plan_inputs(submission, None, [], host_gateway="172.17.0.1")
    assert inputs.extra_env["STORAGE_EMULATOR_HOST"] == "http://storage.example:9023"
