"""Vertex AI jobs exported to Kubeflow (`jobs export custom_job_ID`, TrainJob and legacy TFJob):
their pods see what the job's replicas see here, as its planning.ReplicaContract says: CLUSTER_SPEC
with the pools' `workerpoolN` names and the job spec as a JSON string, TF_CONFIG with `chief`,
CLOUD_ML_JOB_ID, the pools' own env and args, AIP_MODEL_DIR and the other output directories, and
the buckets under /gcs as GKE's Cloud Storage FUSE volumes.

The jobs are translated by aiptrain.vertex.translate, as `aiptrain serve` creates them. Each pod's
bootstrap runs with the environment Kubernetes would give it (a JobSet's pod: its labels and
JOB_COMPLETION_INDEX; a TFJob's pod: the training operator's TF_CONFIG), and what it builds must
equal, byte for byte, what aiptrain's own plan gives the same replica, hostnames aside."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from aiptrain import jobs, tfjob, trainjob
from aiptrain.client import Client
from aiptrain.config import SubmitFlags
from aiptrain.model import HyperparameterSpec, Job, State
from aiptrain.planning import TF_PORT, PlanInputs, ReplicaContract, load_contract, plan, save_contract
from aiptrain.podbootstrap import BOOTSTRAP_PY
from aiptrain.settings import Settings
from aiptrain.topology import replicas_for
from aiptrain.vertex.resources import CustomJobSpec
from aiptrain.vertex.translate import translate

from fakes import FakeBackend
from test_trainjob_export import (
    JOBSET_CRD,
    PRINT_ENV,
    RUNTIME_CRD,
    RUNTIME_IMAGE,
    TRAINJOB_CRD,
    as_kubectl_reads,
    crd_schema,
    pod_environment,
    pods_of,
    run_bootstrap,
    schema_errors,
)

IMAGE = "example.com/team/trainer:1"
BUCKETS = (("vx-data", False), ("vx-out", True))


def pool(count: int, args: list[str], env: dict[str, str], machine: str = "n1-standard-4") -> dict:
    return {"machineSpec": {"machineType": machine}, "replicaCount": str(count), "containerSpec": {
        "imageUri": IMAGE, "command": ["python3", "-m", "trainer.task"], "args": args,
        "env": [{"name": k, "value": v} for k, v in env.items()]}}


def package_pool(count: int, args: list[str]) -> dict:
    return {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": str(count), "pythonPackageSpec": {
        "executorImageUri": "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-11.py310:latest",
        "packageUris": ["gs://vx-data/pkg/trainer-0.1.tar.gz"], "pythonModule": "trainer.task", "args": args}}


def vertex_job(job_id: str, numeric: str, spec: dict) -> tuple[Job, ReplicaContract]:
    """The ml v1 job and contract of a CustomJob, with the buckets a submit adds (the project's, kept here)."""
    translation = translate(job_id, numeric, CustomJobSpec.model_validate(spec))
    return translation.job, dataclasses.replace(translation.contract, buckets=BUCKETS)


OUTPUT = {"baseOutputDirectory": {"outputUriPrefix": "gs://vx-out/run"}}
# Chief, workers, parameter servers and an evaluator, each pool with its own args and env.
ESTIMATOR = vertex_job("custom_job_101", "101", {**OUTPUT, "workerPoolSpecs": [
    pool(1, ["--role", "chief"], {"POOL": "0"}), pool(2, ["--role", "worker"], {"POOL": "1"}),
    pool(1, ["--role", "ps"], {"POOL": "2"}, "n1-highmem-2"), pool(1, ["--role", "eval"], {"POOL": "3"})]})
# MultiWorkerMirrored: a chief and workers alike.
MWMS = vertex_job("custom_job_102", "102", {**OUTPUT, "workerPoolSpecs": [pool(1, [], {}), pool(3, [], {})]})
# A Python package on a prebuilt image, the workers with args of their own (the contract's task args).
PACKAGE = vertex_job("custom_job_103", "103", {**OUTPUT, "workerPoolSpecs": [
    package_pool(1, ["--epochs", "2"]), package_pool(2, ["--epochs", "2", "--worker"])]})
# PyTorch DDP in a torch image: Trainer's torch-distributed runtime.
DDP = vertex_job("custom_job_104", "104", {"workerPoolSpecs": [
    {**pool(1, ["--steps", "5"], {}), "containerSpec": {"imageUri": "example.com/pytorch-ddp:1",
                                                      "args": ["--steps", "5"]}},
    {**pool(2, ["--steps", "5"], {}), "containerSpec": {"imageUri": "example.com/pytorch-ddp:1",
                                                      "args": ["--steps", "5"]}}]})
JOBS = [ESTIMATOR, MWMS, PACKAGE, DDP]
DDP_ENTRYPOINT = ["python3", "-m", "trainer.task"]
ENTRYPOINTS = {"example.com/pytorch-ddp:1": DDP_ENTRYPOINT}


def ids(case: tuple[Job, ReplicaContract]) -> str:
    return case[0].job_id


def runtime_of(job: Job) -> str | None:
    return None if job.training_input.uses_custom_container else RUNTIME_IMAGE


def trainjob_of(job: Job, contract: ReplicaContract) -> trainjob.TrainJobExport:
    ti = job.training_input
    return trainjob.build_trainjob(job, replicas_for(ti), runtime_of(job), list(ti.package_uris or []), 5,
                                   entrypoints=ENTRYPOINTS, contract=contract)


def tfjob_of(job: Job, contract: ReplicaContract) -> tfjob.Export:
    ti = job.training_input
    return tfjob.build_tfjob(job, replicas_for(ti), runtime_of(job), list(ti.package_uris or []), 5,
                             contract=contract, entrypoints=ENTRYPOINTS)


def local_replicas(job: Job, contract: ReplicaContract) -> list[dict]:
    """Every replica as aiptrain runs it here, in replica order: its host, whole environment,
    command line and task type."""
    launch_plan = plan(job, replicas_for(job.training_input), PlanInputs(runtime_image=runtime_of(job),
                                                                         contract=contract))
    return [{"host": spec.hostname, "type": spec.task_type, "env": launch_plan.environment(spec),
             "command": [*(spec.entrypoint or ENTRYPOINTS.get(spec.image, [])), *spec.command]}
            for spec in launch_plan.containers]


def check_pod(built: dict, command: list[str], replica: dict, contract: ReplicaContract, hosts: dict[str, str],
              master_port: str) -> None:
    """What a pod's bootstrap built against what the replica gets here: TF_CONFIG and CLUSTER_SPEC
    byte for byte (the replicas' hosts read as the pods'), the PyTorch variables, the contract's
    variables (CLOUD_ML_JOB_ID, the pool's env, the output dirs) and the command line."""
    def as_pods_see_it(text: str) -> str:
        for host, pod in hosts.items():
            text = text.replace(f'"{host}:{TF_PORT}"', f'"{pod}:{TF_PORT}"')
        return text

    local = replica["env"]
    assert built["TF_CONFIG"] == as_pods_see_it(local["TF_CONFIG"])
    assert built["CLUSTER_SPEC"] == as_pods_see_it(local["CLUSTER_SPEC"])
    assert (built["MASTER_ADDR"], built["MASTER_PORT"]) == (hosts[local["MASTER_ADDR"]], master_port)
    assert (built["WORLD_SIZE"], built.get("RANK")) == (local["WORLD_SIZE"], local.get("RANK"))
    variables = contract.replica_env(replica["type"], None)
    assert variables and {k: built[k] for k in variables} == {k: local[k] for k in variables} == variables
    assert command == replica["command"]


@pytest.mark.parametrize("case", JOBS, ids=ids)
def test_each_trainjob_pod_sees_what_its_replica_sees_here(case):
    job, contract = case
    export = trainjob_of(job, contract)
    name = export.trainjob.metadata.name
    pods = pods_of(export)
    local = local_replicas(job, contract)
    assert len(pods) == len(local)
    hosts = {r["host"]: f"{name}-{rjob}-0-{index}.{name}" for r, (rjob, index, _) in zip(local, pods, strict=True)}
    torch = export.runtime is None
    for replica, (rjob, index, container) in zip(local, pods, strict=True):
        built = run_bootstrap(container, pod_environment(export, rjob, index, container))
        port = str(trainjob.TORCH_PORT) if torch else replica["env"]["MASTER_PORT"]
        check_pod(built, container["command"][3:], replica, contract, hosts, port)
        spec = json.loads(built["CLUSTER_SPEC"])
        assert spec["task"]["type"].startswith("workerpool") and isinstance(spec["job"], str)
        assert json.loads(built["TF_CONFIG"])["task"]["type"] in ("chief", "worker", "ps", "evaluator")


def test_the_shapes_take_the_runtimes_they_would_from_aiplatform():
    assert trainjob_of(*DDP).runtime is None  # one image, command and env in every pool: torch-distributed
    assert all(trainjob_of(*case).runtime is not None for case in (ESTIMATOR, MWMS, PACKAGE))
    job, contract = DDP
    # Pools with env of their own cannot share Trainer's one trainer step.
    apart = dataclasses.replace(contract, task_env={"worker": {"POOL": "1"}})
    forced = trainjob.build_trainjob(job, replicas_for(job.training_input), None, [], 5, None,
                                     trainjob.Runtime.TORCH, ENTRYPOINTS, apart)
    assert forced.runtime is not None and "does not fit" in forced.warnings[0]


@pytest.mark.parametrize("case", JOBS, ids=ids)
def test_the_trainjob_of_a_vertex_job_validates_against_the_crds(case):
    from kubernetes.client import ApiClient

    export = trainjob_of(*case)
    manifest = as_kubectl_reads(export.trainjob.to_manifest())
    assert schema_errors(crd_schema(*TRAINJOB_CRD), manifest) == []
    api = ApiClient()
    if export.runtime is None:  # the volumes ride in the runtime patch
        patch = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        templates = [patch["template"]["spec"]["template"]]
    else:
        runtime = as_kubectl_reads(export.runtime.to_manifest())
        assert schema_errors(crd_schema(*RUNTIME_CRD), runtime) == []
        jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                  "metadata": {"name": manifest["metadata"]["name"]}, "spec": runtime["spec"]["template"]["spec"]}
        assert schema_errors(crd_schema(*JOBSET_CRD), jobset) == []
        templates = [r["template"]["spec"]["template"] for r in jobset["spec"]["replicatedJobs"]]
        model = api.deserialize(json.dumps(templates[0]), "V1PodTemplateSpec", "application/json")
        assert api.sanitize_for_serialization(model) == templates[0]  # the CSI volumes are core/v1's
    for template in templates:
        assert template["metadata"]["annotations"][tfjob.GCSFUSE_ANNOTATION] == "true"
        assert_buckets_mounted(template)


def assert_buckets_mounted(template: dict) -> None:
    """/gcs/BUCKET as here: the bucket kept writable is writable, the other read-only."""
    spec = template["spec"]
    volumes = {v["name"]: v["csi"] for v in spec["volumes"] if "csi" in v}
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"] if m["name"] in volumes}
    seen = {path: (volumes[m["name"]]["volumeAttributes"]["bucketName"], not m.get("readOnly", False),
                   not volumes[m["name"]]["readOnly"]) for path, m in mounts.items()}
    assert seen == {"/gcs/vx-data": ("vx-data", False, False), "/gcs/vx-out": ("vx-out", True, True)}
    assert {v["driver"] for v in volumes.values()} == {tfjob.GCSFUSE_DRIVER}
    assert {v["volumeAttributes"]["mountOptions"] for v in volumes.values()} == {"implicit-dirs,uid=65534,gid=65534"}


def test_the_notes_say_what_the_cluster_needs_for_the_output_dir_and_the_buckets():
    notes = "\n".join(trainjob_of(*ESTIMATOR).notes)
    assert "AIP_MODEL_DIR, AIP_CHECKPOINT_DIR, AIP_TENSORBOARD_LOG_DIR name directories under gs://vx-out/run" in notes
    assert "vx-data, vx-out are mounted at /gcs/BUCKET" in notes and tfjob.GCSFUSE_DRIVER in notes


# -- the legacy TFJob ---------------------------------------------------------------------------


def operator_tf_config(manifest: dict, replica_type: str, index: int, namespace: str = "ns") -> str:
    """The TF_CONFIG Kubeflow's training operator sets in a TFJob's pod (pkg/controller.v1/tensorflow,
    genTFConfigJSONStr): every replica type's services `<name>-<type>-<i>.<namespace>.svc:<port>`
    (evaluators too), keys sorted as Go writes a map, no `job`."""
    name = manifest["metadata"]["name"]
    cluster = {kind.lower(): [f"{name}-{kind.lower()}-{i}.{namespace}.svc:{TF_PORT}" for i in range(spec["replicas"])]
               for kind, spec in manifest["spec"]["tfReplicaSpecs"].items()}
    return json.dumps({"cluster": dict(sorted(cluster.items())), "task": {"type": replica_type.lower(), "index": index},
                       "environment": "cloud"}, separators=(",", ":"))


def run_tfjob_pod(container: dict, tf_config: str) -> dict:
    env = {"PATH": "/usr/bin:/bin", "TF_CONFIG": tf_config, **{v["name"]: v["value"] for v in container["env"]}}
    command = container["command"]
    assert command[:3] == ["python3", "-c", BOOTSTRAP_PY] and "args" not in container
    result = subprocess.run([sys.executable, "-c", command[2], *PRINT_ENV], env=env, capture_output=True, text=True,
                            check=True)
    return json.loads(result.stdout)


@pytest.mark.parametrize("case", JOBS, ids=ids)
def test_each_tfjob_pod_rebuilds_what_its_replica_sees_here_from_the_operators_tf_config(case):
    job, contract = case
    manifest = as_kubectl_reads(tfjob_of(job, contract).tfjob.to_manifest())
    tfjob.TFJob.model_validate(manifest)
    name = manifest["metadata"]["name"]
    local = local_replicas(job, contract)
    kinds = {"master": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
    indices = {r["host"]: int(r["host"].rsplit("-", 1)[1]) for r in local}
    hosts = {r["host"]: f"{name}-{kinds[r['type']].lower()}-{indices[r['host']]}.ns.svc" for r in local}
    for replica in local:
        kind = kinds[replica["type"]]
        container = manifest["spec"]["tfReplicaSpecs"][kind]["template"]["spec"]["containers"][0]
        built = run_tfjob_pod(container, operator_tf_config(manifest, kind, indices[replica["host"]]))
        check_pod(built, container["command"][3:], replica, contract, hosts, str(TF_PORT))


def test_the_tfjob_of_a_vertex_job_is_a_kubernetes_manifest_with_the_buckets():
    from kubernetes.client import ApiClient

    export = tfjob_of(*ESTIMATOR)
    api = ApiClient()
    for spec in export.tfjob.spec.tf_replica_specs.values():
        model = api.deserialize(json.dumps(spec.template), "V1PodTemplateSpec", "application/json")
        assert api.sanitize_for_serialization(model) == spec.template
        assert_buckets_mounted(spec.template)
    assert any("rebuilds TF_CONFIG" in note for note in export.notes)


def test_a_vertex_tuning_job_is_refused_with_where_to_go():
    from aiptrain.errors import ValidationError

    job, contract = ESTIMATOR
    tuning = job.model_copy(deep=True)
    tuning.training_input.hyperparameters = HyperparameterSpec.model_validate({
        "goal": "MAXIMIZE", "maxTrials": 2, "params": [
            {"parameterName": "lr", "type": "DOUBLE", "minValue": 0.1, "maxValue": 0.5}]})
    for build in (trainjob_of, tfjob_of):
        with pytest.raises(ValidationError, match="Katib runs studies.*use it as the template"):
            build(tuning, contract)


# -- the contract kept for the export, from submit to after the job's end --------------------------


def test_the_contract_outlives_the_job_and_reaches_its_export(tmp_path, controller_in_process):
    """A Vertex job queued as `aiptrain serve` queues it keeps its contract after it ends (its
    work dir, with the plan inputs, goes), `jobs export` gives the pods what it said, and a
    delete of the job removes it."""
    settings = Settings(home=tmp_path / "home", poll_seconds=0.01)
    settings.ensure_dirs()
    backend = FakeBackend()
    controller_in_process(settings, backend)
    job, contract = MWMS
    with Client(settings=settings, backend=backend) as client:
        submission = client.prepare(SubmitFlags(job_id=job.job_id), base=job)
        client.queue(dataclasses.replace(submission, contract=contract))
        paths = settings.job_paths(client.key(job.job_id))
        kept = load_contract(paths.contract)
        assert kept is not None and dataclasses.replace(kept, buckets=contract.buckets) == contract
        assert client.cancel(job.job_id).state is State.CANCELLED
        assert not paths.plan_inputs.exists()
        export = client.export_trainjob(job.job_id)
        jobs.forget(client.key(job.job_id), settings, client.store)  # a Vertex AI delete: the contract goes too
        assert not paths.contract.exists()
    master = export.runtime.spec["template"]["spec"]["replicatedJobs"][0] if export.runtime else None
    assert master is not None
    env = {v["name"]: v.get("value") for v in master["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CLOUD_ML_JOB_ID"] == "102" and env["AIP_MODEL_DIR"] == "gs://vx-out/run/model/"
    assert json.loads(env["AIPTRAIN_CLUSTER"])["names"]["master"] == "workerpool0"


def test_the_contract_file_round_trips_and_an_aiplatform_job_has_none(tmp_path):
    path = tmp_path / "contracts" / "k.json"
    assert load_contract(path) is None
    save_contract(path, ESTIMATOR[1])
    assert load_contract(path) == ESTIMATOR[1]


# -- the command line ---------------------------------------------------------------------------


def test_jobs_export_of_a_stored_vertex_job_gives_its_pods_the_contract(run, home, monkeypatch):
    from test_tfjob_export import store_job

    monkeypatch.setenv("AIPTRAIN_GCS", "local")
    job, contract = ESTIMATOR
    store_job(home, job)
    save_contract(Settings(home=home).job_paths(job.job_id).contract, contract)
    code, out, err = run("jobs", "export", job.job_id)
    assert code == 0, err
    assert list(yaml.safe_load_all(out)) == trainjob_of(job, contract).documents()
    assert "output directory gs://vx-out/run and buckets under /gcs" in err and "AIPTRAIN_GCS=local" in err
    code, out, err = run("jobs", "export", job.job_id, "--format", "tfjob")
    assert code == 0, err
    assert yaml.safe_load(out) == tfjob_of(job, contract).tfjob.to_manifest()
