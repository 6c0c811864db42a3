"""`jobs export --format tfjob` and `submit --dry-run --format tfjob`: the job as a Kubeflow TFJob (legacy;
the default format is trainjob, tests/unit/test_trainjob_export.py).

Whole manifests are compared as values; every pod template must deserialise into the official
kubernetes client's V1PodTemplateSpec and serialise back unchanged (a misspelt or misplaced
field would be dropped), and the TFJob itself must validate against aiptrain.tfjob's model of
the kubeflow.org/v1 API."""

from __future__ import annotations

import json

import pytest
import yaml

from aiptrain import tfjob
from aiptrain.model import Job, State
from aiptrain.planning import BOOTSTRAP
from aiptrain.settings import Settings
from aiptrain.store import JobStore
from aiptrain.topology import replicas_for

RUNTIME_IMAGE = "aiptrain/runtime:2.11"
PACKAGE = "gs://bkt/census/packages/abc123/trainer-0.1.tar.gz"
TEMPLATE_ANNOTATIONS = {"sidecar.istio.io/inject": "false"}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                      "capabilities": {"drop": ["ALL"]}}
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534}
BASE_VOLUMES = [{"name": "tmp", "emptyDir": {}}, {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
BASE_MOUNTS = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "dshm", "mountPath": "/dev/shm"}]
FETCH = {
    "name": "fetch-packages",
    "image": tfjob.FETCH_IMAGE,
    "command": ["sh", "-c", tfjob.FETCH, "fetch", PACKAGE],
    "env": [{"name": "HOME", "value": "/tmp"}, {"name": "CLOUDSDK_CONFIG", "value": "/tmp/gcloud"}],
    "volumeMounts": [{"name": "packages", "mountPath": "/opt/aiptrain/packages"}, {"name": "tmp", "mountPath": "/tmp"}],
    "securityContext": CONTAINER_SECURITY,
}
RUNTIME_ENV = [
    {"name": "PYTHONUNBUFFERED", "value": "1"},
    {"name": "HOME", "value": "/tmp"},
    {"name": "PYTHONUSERBASE", "value": "/tmp/.local"},
    {"name": "AIPTRAIN_PACKAGES", "value": "/opt/aiptrain/packages/trainer-0.1.tar.gz"},
    {"name": "AIPTRAIN_WHEELHOUSE", "value": "/opt/aiptrain/packages/wheelhouse"},
]


def job_of(job_id: str, labels: dict | None = None, **training_input) -> Job:
    return Job.model_validate({"jobId": job_id, "labels": labels, "trainingInput": {
        "pythonModule": "trainer.task", "region": "us-central1", "runtimeVersion": "2.11",
        "packageUris": [PACKAGE], **training_input}})


def export_of(job: Job, runtime_image: str | None = RUNTIME_IMAGE, backoff_limit: int = 5,
              seconds: float | None = None) -> tfjob.Export:
    return tfjob.build_tfjob(job, replicas_for(job.training_input), runtime_image,
                             list(job.training_input.package_uris or []), backoff_limit, seconds)


def runtime_pod(args: list[str], cpu: str, memory: str, gpus: int = 0, job_dir_mount: dict | None = None,
                job_dir_volume: dict | None = None) -> dict:
    limits = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {
        "metadata": {"annotations": TEMPLATE_ANNOTATIONS},
        "spec": {
            "initContainers": [FETCH],
            "containers": [{
                "name": "tensorflow",
                "image": RUNTIME_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "args": ["sh", "-c", BOOTSTRAP, "trainer.task", *args],
                "workingDir": "/tmp",
                "env": RUNTIME_ENV,
                "ports": [{"name": "tfjob-port", "containerPort": 2222}],
                "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits},
                "volumeMounts": [*BASE_MOUNTS, *([job_dir_mount] if job_dir_mount else []),
                                 {"name": "packages", "mountPath": "/opt/aiptrain/packages", "readOnly": True}],
                "securityContext": CONTAINER_SECURITY,
            }],
            "volumes": [*BASE_VOLUMES, *([job_dir_volume] if job_dir_volume else []),
                        {"name": "packages", "emptyDir": {}}],
            "securityContext": POD_SECURITY,
        },
    }


def replica_spec(count: int, template: dict) -> dict:
    return {"replicas": count, "restartPolicy": "ExitCode", "template": template}


def test_basic_job_whole_manifest():
    job = job_of("census_1", labels={"team": "ml"}, jobDir="gs://bkt/census", args=["--steps", "5"])
    manifest = export_of(job).tfjob.to_manifest()
    assert manifest == {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "census-1", "labels": {"team": "ml"}, "annotations": {"aiptrain/job-id": "census_1"}},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 5},
            "tfReplicaSpecs": {
                "Chief": replica_spec(1, runtime_pod(["--steps", "5", "--job-dir", "gs://bkt/census"], "4", "15Gi")),
            },
        },
    }


def test_standard_1_whole_manifest_with_a_local_job_dir_and_a_deadline():
    job = job_of("std", scaleTier="STANDARD_1", jobDir="/data/std", scheduling={"maxRunningTime": "7200.5s"})
    args = ["--job-dir", "/data/std"]
    mount = {"name": "job-dir", "mountPath": "/data/std", "subPath": "std"}
    volume = {"name": "job-dir", "persistentVolumeClaim": {"claimName": "aiptrain-job-dir"}}
    export = export_of(job, backoff_limit=3, seconds=7200.5)
    assert export.tfjob.to_manifest() == {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "std", "annotations": {"aiptrain/job-id": "std"}},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3, "activeDeadlineSeconds": 7201},
            "tfReplicaSpecs": {
                "Chief": replica_spec(1, runtime_pod(args, "8", "7373Mi", job_dir_mount=mount, job_dir_volume=volume)),
                "Worker": replica_spec(4, runtime_pod(args, "8", "7373Mi", job_dir_mount=mount, job_dir_volume=volume)),
                "PS": replica_spec(3, runtime_pod(args, "4", "15Gi", job_dir_mount=mount, job_dir_volume=volume)),
            },
        },
    }
    assert any("aiptrain-job-dir" in note for note in export.notes)
    assert export.warnings == ()


def test_custom_job_with_an_evaluator_and_gpus_whole_manifest():
    job = job_of(
        "custom_gpu", labels={"team": "ml", "odd": "trailing_"}, scaleTier="CUSTOM", jobDir="gs://bkt/out",
        masterType="n1-standard-8", masterConfig={"acceleratorConfig": {"type": "NVIDIA_TESLA_T4", "count": 2}},
        workerType="a2-highgpu-1g", workerCount=2, evaluatorType="e2-standard-2", evaluatorCount=1,
    )
    args = ["--job-dir", "gs://bkt/out"]
    assert export_of(job).tfjob.to_manifest() == {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        # Kubernetes refuses a label value ending in `_`: that label is kept as an annotation.
        "metadata": {"name": "custom-gpu", "labels": {"team": "ml"},
                     "annotations": {"aiptrain/job-id": "custom_gpu", "aiptrain/label.odd": "trailing_"}},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 5},
            "tfReplicaSpecs": {
                "Chief": replica_spec(1, runtime_pod(args, "8", "30Gi", gpus=2)),
                "Worker": replica_spec(2, runtime_pod(args, "12", "85Gi", gpus=1)),
                "Evaluator": replica_spec(1, runtime_pod(args, "2", "8Gi")),
            },
        },
    }


def test_custom_container_keeps_the_entrypoint_split_and_aiptrains_master():
    """Docker's ENTRYPOINT is Kubernetes' command and CMD its args; a custom container's
    TF_CONFIG says `master` unless useChiefInTfConfig, so its replica type is Master."""
    job = Job.model_validate({"jobId": "cc", "trainingInput": {
        "region": "us-central1", "masterConfig": {"imageUri": "my/image:1", "containerCommand": ["python3", "t.py"],
                                                  "containerArgs": ["--x", "1"]}}})
    specs = export_of(job, runtime_image=None).tfjob.to_manifest()["spec"]["tfReplicaSpecs"]
    assert list(specs) == ["Master"]
    container = specs["Master"]["template"]["spec"]["containers"][0]
    assert (container["image"], container["command"], container["args"]) == ("my/image:1", ["python3", "t.py"], ["--x", "1"])
    assert "workingDir" not in container and "initContainers" not in specs["Master"]["template"]["spec"]
    job.training_input.use_chief_in_tf_config = True
    assert list(export_of(job, runtime_image=None).tfjob.to_manifest()["spec"]["tfReplicaSpecs"]) == ["Chief"]


def test_packages_in_a_local_bucket_are_expected_in_the_image_with_a_warning():
    job = job_of("local_pkg", packageUris=["/home/me/bucket/local_pkg/abc/trainer-0.1.tar.gz"])
    export = export_of(job)
    pod = export.tfjob.to_manifest()["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]
    names = [variable["name"] for variable in pod["containers"][0]["env"]]
    assert "initContainers" not in pod and "AIPTRAIN_PACKAGES" not in names
    assert pod["containers"][0]["args"] == ["sh", "-c", BOOTSTRAP, "trainer.task"]  # the same command, no install
    assert len(export.warnings) == 1 and "local bucket" in export.warnings[0]


def test_a_long_job_id_still_gives_one_dns_label_per_pod():
    job = job_of("a" * 128, scaleTier="STANDARD_1")
    name = export_of(job).tfjob.metadata.name
    assert len(f"{name}-worker-3") <= 63 and len(name) > 40


def test_a_tuning_job_is_refused():
    from aiptrain.errors import ValidationError

    job = job_of("hp", hyperparameters={"goal": "MAXIMIZE", "maxTrials": 2, "params": [
        {"parameterName": "lr", "type": "DOUBLE", "minValue": 0.1, "maxValue": 0.5}]})
    with pytest.raises(ValidationError, match="Katib"):
        export_of(job)


CASES = [
    job_of("basic"),
    job_of("std", scaleTier="STANDARD_1", jobDir="/data/std"),
    job_of("custom", scaleTier="CUSTOM", masterType="n1-standard-8", workerType="n1-standard-4", workerCount=2,
           parameterServerType="n1-highmem-2", parameterServerCount=1, evaluatorType="n1-standard-4",
           evaluatorCount=1, workerConfig={"acceleratorConfig": {"type": "NVIDIA_TESLA_T4", "count": 1}}),
]


@pytest.mark.parametrize("job", CASES, ids=lambda job: job.job_id)
def test_every_pod_template_is_a_kubernetes_pod_template(job):
    from kubernetes.client import ApiClient

    api = ApiClient()
    for spec in export_of(job).tfjob.spec.tf_replica_specs.values():
        model = api.deserialize(json.dumps(spec.template), "V1PodTemplateSpec", "application/json")
        assert api.sanitize_for_serialization(model) == spec.template  # nothing unknown was dropped
        assert [c.name for c in model.spec.containers] == ["tensorflow"]


@pytest.mark.parametrize("job", CASES, ids=lambda job: job.job_id)
def test_the_manifest_validates_against_the_tfjob_model(job):
    manifest = yaml.safe_load(yaml.safe_dump(export_of(job).tfjob.to_manifest()))  # as kubectl would read it
    parsed = tfjob.TFJob.model_validate(manifest)
    assert (parsed.api_version, parsed.kind) == ("kubeflow.org/v1", "TFJob")
    assert set(parsed.spec.tf_replica_specs) <= {tfjob.ReplicaType.CHIEF, tfjob.ReplicaType.WORKER,
                                                 tfjob.ReplicaType.PS, tfjob.ReplicaType.EVALUATOR}
    assert {s.restart_policy for s in parsed.spec.tf_replica_specs.values()} == {tfjob.RestartPolicy.EXIT_CODE}
    assert parsed.spec.run_policy.clean_pod_policy is tfjob.CleanPodPolicy.RUNNING
    counts = {t.value: s.replicas for t, s in parsed.spec.tf_replica_specs.items()}
    by_type = {"master": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
    expected: dict[str, int] = {}
    for replica in replicas_for(job.training_input):
        expected[by_type[replica.task_type]] = expected.get(by_type[replica.task_type], 0) + 1
    assert counts == expected


@pytest.mark.parametrize("broken, why", [
    ({"kind": "PyTorchJob"}, "kind"),
    ({"spec": {"tfReplicaSpecs": {"Chief": {"replicas": 1, "restartPolicy": "Sometimes", "template": {}}}}},
     "restartPolicy"),
    ({"spec": {"tfReplicaSpecs": {"Chief": {"replicas": 1, "template": {"spec": {"containers": [
        {"name": "trainer", "image": "x"}]}}}}}}, "tensorflow"),
    ({"spec": {"runPolicy": {"backoffLimit": -1}, "tfReplicaSpecs": {}}}, "backoffLimit"),
])
def test_the_model_refuses_what_the_operator_would(broken, why):
    from pydantic import ValidationError

    manifest = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "x"},
                "spec": {"tfReplicaSpecs": {}}}
    with pytest.raises(ValidationError, match=why):
        tfjob.TFJob.model_validate({**manifest, **broken})


# -- the command line ---------------------------------------------------------------------------


def store_job(home, job: Job) -> None:
    """A finished job in the store, as a submit leaves it (no engine needed to export it)."""
    settings = Settings(home=home)
    settings.ensure_dirs()
    store = JobStore(settings.store_path)
    store.create(job)
    store.transition(job.job_id, State.SUCCEEDED, [State.QUEUED])
    store.close()


def test_export_prints_the_manifest_of_a_stored_job(run, home, monkeypatch):
    monkeypatch.setenv("AIPTRAIN_GCS", "remote")
    job = job_of("stored_1", scaleTier="STANDARD_1", jobDir="gs://bkt/out", args=["--epochs", "2"])
    store_job(home, job)
    code, out, err = run("jobs", "export", "stored_1", "--format", "tfjob")
    assert code == 0, err
    assert out.startswith("# Kubeflow TFJob of aiptrain job stored_1.")
    expected = export_of(job, runtime_image="aiptrain/runtime:2.11")
    assert yaml.safe_load(out) == expected.tfjob.to_manifest()
    assert err == ""
    # gcloud's prefixes reach it too.
    assert run("ai-platform", "jobs", "export", "stored_1", "--format", "tfjob")[1] == out


def test_export_refusals_are_one_line_and_exit_2(run, home):
    code, out, err = run("jobs", "export", "missing", "--format", "tfjob")
    assert (code, out) == (2, "") and err.strip().splitlines() == [
        "ERROR: Job [missing] not found; `aiptrain jobs list` shows the jobs that exist."]
    code, out, err = run("jobs", "export", "missing", "--format", "xml")
    assert (code, out) == (2, "") and err.startswith("ERROR: --format [xml] is not supported here")
    code, out, err = run("jobs", "export", "missing", "--format", "json")
    assert (code, out) == (2, "") and err.startswith("ERROR: jobs export prints Kubeflow manifests: use --format trainjob")
    code, _, err = run("jobs", "list", "--format", "tfjob")
    assert code == 2 and "jobs export" in err


def test_submit_dry_run_prints_the_manifest_and_creates_nothing(run, home, tmp_path):
    from conftest import SAMPLE_TRAINER

    flags = ["--package-path", str(SAMPLE_TRAINER), "--module-name", "trainer.task", "--region", "us-central1",
             "--staging-bucket", str(tmp_path / "bucket"), "--job-dir", str(tmp_path / "out"), "--scale-tier",
             "standard-1", "--runtime-version", "minimal"]
    code, out, err = run("jobs", "submit", "training", "dry_tf", *flags, "--dry-run", "--format", "tfjob", "--", "-v")
    assert code == 0, err
    manifest = tfjob.TFJob.model_validate(yaml.safe_load(out))
    chief = manifest.spec.tf_replica_specs[tfjob.ReplicaType.CHIEF].template["spec"]["containers"][0]
    assert chief["args"] == ["sh", "-c", BOOTSTRAP, "trainer.task", "-v", "--job-dir", str(tmp_path / "out")]
    assert "local bucket" in err  # the staging bucket is a directory here: pods cannot read it
    assert not (tmp_path / "bucket").exists() and not (tmp_path / "out").exists()
    assert run("jobs", "list", "--format", "value(jobId)")[1] == ""
    # Without --dry-run, --format tfjob is refused before anything happens.
    code, out, err = run("jobs", "submit", "training", "dry_tf", *flags, "--format", "tfjob")
    assert (code, out) == (2, "") and "add --dry-run" in err
    assert run("jobs", "list", "--format", "value(jobId)")[1] == ""


