"""`jobs export` (TrainJob, its default) and `submit --dry-run --format trainjob`.

Every manifest is checked against the OpenAPI v3 schemas of the CRDs of kubeflow/trainer
v2.3.0 and JobSet v0.12.0, vendored in tests/unit/data/kubeflow (SOURCES.md says from where),
and every pod template against the kubernetes client's V1PodTemplateSpec. The per-pod
bootstrap is run with the environment Kubernetes, JobSet and Trainer give each pod, and the
TF_CONFIG and CLUSTER_SPEC it builds must equal, byte for byte, what aiptrain's own plan gives
the same replica here once its Docker hostnames are read as the pods' DNS names."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from aiptrain import trainjob
from aiptrain.model import Job
from aiptrain.planning import TF_PORT, PlanInputs, plan
from aiptrain.podbootstrap import BOOTSTRAP_PY
from aiptrain.topology import replicas_for

DATA = Path(__file__).parent / "data" / "kubeflow"
RUNTIME_IMAGE = "aiptrain/runtime:2.11"
PACKAGE = "gs://bkt/jobs/packages/abc123/trainer-0.1.tar.gz"
DDP_IMAGE = "aiptrain-test/pytorch-ddp:1"
DDP_ENTRYPOINT = ["python3", "-m", "trainer.task"]


def job_of(job_id: str, **training_input) -> Job:
    return Job.model_validate({"jobId": job_id, "trainingInput": {
        "pythonModule": "trainer.task", "region": "us-central1", "runtimeVersion": "2.11",
        "packageUris": [PACKAGE], "jobDir": "gs://bkt/out", "args": ["--steps", "100"], **training_input}})


def custom(job_id: str, **counts) -> Job:
    return job_of(job_id, scaleTier="CUSTOM", masterType="n1-standard-4", **counts)


PS = custom("ps_job", workerType="n1-standard-4", workerCount=2, parameterServerType="n1-standard-4",
            parameterServerCount=1)
MWMS = custom("mwms_job", workerType="n1-standard-4", workerCount=2)
ESTIMATOR = custom("estimator_job", workerType="n1-standard-4", workerCount=1, parameterServerType="n1-standard-4",
                   parameterServerCount=1, evaluatorType="n1-standard-4", evaluatorCount=1)
DDP = Job.model_validate({"jobId": "torch_ddp", "trainingInput": {
    "region": "us-central1", "scaleTier": "CUSTOM", "masterType": "n1-standard-4", "workerType": "n1-standard-4",
    "workerCount": 2, "masterConfig": {"imageUri": DDP_IMAGE}, "jobDir": "/data/ddp", "args": ["--steps", "50"]}})
SHAPES = [PS, MWMS, ESTIMATOR, DDP]
# The other sample jobs' shapes (basic, sklearn_xgboost, with_dependency run BASIC), a GPU job,
# a local job dir, packages in a local bucket, and a custom container with its own command.
OTHERS = [
    job_of("basic"),
    job_of("std", scaleTier="STANDARD_1", jobDir="/data/std"),
    job_of("local_pkg", packageUris=["/home/me/bucket/local_pkg/abc/trainer-0.1.tar.gz"]),
    custom("gpu", masterConfig={"acceleratorConfig": {"type": "NVIDIA_TESLA_T4", "count": 2}},
           workerType="a2-highgpu-1g", workerCount=2, evaluatorType="e2-standard-2", evaluatorCount=1),
    Job.model_validate({"jobId": "cc", "trainingInput": {"region": "us-central1", "masterConfig": {
        "imageUri": "my/image:1", "containerCommand": ["python3", "t.py"], "containerArgs": ["--x", "1"]}}}),
]


def export_of(job: Job, runtime=trainjob.Runtime.AUTO) -> trainjob.TrainJobExport:
    ti = job.training_input
    return trainjob.build_trainjob(job, replicas_for(ti), None if ti.uses_custom_container else RUNTIME_IMAGE,
                                   list(ti.package_uris or []), 5, None, runtime, {DDP_IMAGE: DDP_ENTRYPOINT})


# -- the CRDs' OpenAPI v3 schemas ---------------------------------------------------------------


@cache
def crd_schema(file: str, version: str) -> dict:
    crd = yaml.safe_load((DATA / file).read_text())
    return next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)


def schema_errors(schema: dict, value, path: str = "") -> list[str]:
    """What the API server's structural schema check refuses: wrong types, missing required
    fields, unknown fields (which it would prune, or refuse with kubectl's strict validation),
    enums, patterns and bounds. ObjectMeta (`metadata`, typed `object` only) is the server's own."""
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, int | str) and not isinstance(value, bool)
        return [] if ok else [f"{path}: not an int or a string"]
    kind = schema.get("type")
    checks = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int, "number": int | float}
    if kind in checks and (not isinstance(value, checks[kind]) or (kind in ("integer", "number")
                                                                     and isinstance(value, bool))):
        return [f"{path}: {value!r} is not of type {kind}"]
    if kind == "object":
        return _object_errors(schema, value, path)
    if kind == "array":
        bounded = [f"{path}: too many items"] if len(value) > schema.get("maxItems", len(value)) else []
        return bounded + [e for i, item in enumerate(value) for e in schema_errors(schema.get("items", {}), item,
                                                                                    f"{path}[{i}]")]
    return _scalar_errors(schema, value, path)


def _object_errors(schema: dict, value: dict, path: str) -> list[str]:
    errors = [f"{path}.{key}: required" for key in schema.get("required", []) if key not in value]
    properties, extra = schema.get("properties"), schema.get("additionalProperties")
    if properties is None and extra is None and (path.endswith(".metadata") or path == ".metadata"
                                                 or schema.get("x-kubernetes-preserve-unknown-fields")):
        return errors
    for key, item in value.items():
        if properties is not None and key in properties:
            errors += schema_errors(properties[key], item, f"{path}.{key}")
        elif isinstance(extra, dict):
            errors += schema_errors(extra, item, f"{path}.{key}")
        elif not schema.get("x-kubernetes-preserve-unknown-fields"):
            errors.append(f"{path}.{key}: unknown field")
    return errors


def _scalar_errors(schema: dict, value, path: str) -> list[str]:
    import re

    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
        if len(value) > schema.get("maxLength", len(value)) or len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: length out of bounds")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < schema.get("minimum", value) or value > schema.get("maximum", value):
            errors.append(f"{path}: {value} out of bounds")
        if schema.get("format") == "int32" and not -(2**31) <= value < 2**31:
            errors.append(f"{path}: {value} is not an int32")
    return errors


TRAINJOB_CRD = ("trainer.kubeflow.org_trainjobs.yaml", "v1alpha1")
RUNTIME_CRD = ("trainer.kubeflow.org_clustertrainingruntimes.yaml", "v1alpha1")
JOBSET_CRD = ("jobset.x-k8s.io_jobsets.yaml", "v1alpha2")


def as_kubectl_reads(manifest: dict) -> dict:
    return yaml.safe_load(yaml.safe_dump(manifest))


@pytest.mark.parametrize("job", SHAPES + OTHERS, ids=lambda job: job.job_id)
def test_the_trainjob_and_its_runtime_validate_against_the_crds(job):
    export = export_of(job)
    manifest = as_kubectl_reads(export.trainjob.to_manifest())
    assert schema_errors(crd_schema(*TRAINJOB_CRD), manifest) == []
    name = manifest["metadata"]["name"]  # the CRD's CEL rules on the name
    assert len(name) <= 63 and trainjob.ObjectMeta.model_fields["name"].metadata
    ref = manifest["spec"]["runtimeRef"]
    if export.runtime is None:
        assert ref == {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"}
        return
    runtime = as_kubectl_reads(export.runtime.to_manifest())
    assert ref["name"] == runtime["metadata"]["name"] and runtime["kind"] == "ClusterTrainingRuntime"
    assert schema_errors(crd_schema(*RUNTIME_CRD), runtime) == []
    # The JobSet Trainer makes of it (named after the TrainJob) validates against JobSet's CRD.
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
              "spec": runtime["spec"]["template"]["spec"]}
    assert schema_errors(crd_schema(*JOBSET_CRD), jobset) == []
    # Trainer's webhook: the trainer step is one replica with a `node` container.
    steps = [r for r in jobset["spec"]["replicatedJobs"]
             if r["template"].get("metadata", {}).get("labels", {}).get(trainjob.LABEL_ANCESTOR) == "trainer"]
    assert len(steps) == 1 and steps[0]["replicas"] == 1
    assert [c["name"] for c in steps[0]["template"]["spec"]["template"]["spec"]["containers"]] == ["node"]


def test_the_validator_accepts_trainers_own_runtime_and_refuses_what_the_server_would():
    shipped = yaml.safe_load((DATA / "torch_distributed.yaml").read_text())
    assert schema_errors(crd_schema(*RUNTIME_CRD), shipped) == []
    manifest = as_kubectl_reads(export_of(PS).trainjob.to_manifest())
    schema = crd_schema(*TRAINJOB_CRD)
    assert schema_errors(schema, {**manifest, "spec": {**manifest["spec"], "runtimeRf": {}}}) == [
        ".spec.runtimeRf: unknown field"]
    assert schema_errors(schema, {**manifest, "spec": {**manifest["spec"], "activeDeadlineSeconds": "1"}}) == [
        ".spec.activeDeadlineSeconds: '1' is not of type integer"]


@pytest.mark.parametrize("job", SHAPES + OTHERS, ids=lambda job: job.job_id)
def test_every_pod_template_is_a_kubernetes_pod_template(job):
    from kubernetes.client import ApiClient

    export = export_of(job)
    if export.runtime is None:
        return
    api = ApiClient()
    for replicated in export.runtime.spec["template"]["spec"]["replicatedJobs"]:
        template = replicated["template"]["spec"]["template"]
        model = api.deserialize(json.dumps(template), "V1PodTemplateSpec", "application/json")
        assert api.sanitize_for_serialization(model) == template  # nothing unknown was dropped


def test_runtimes_by_shape():
    assert export_of(DDP).runtime is None  # PyTorch master + workers, code in the image
    plain = DDP.model_copy(deep=True)
    assert plain.training_input.master_config is not None
    plain.training_input.master_config.image_uri = "my/trainer:1"  # not a torch image by its name
    assert export_of(plain).runtime is not None
    assert export_of(plain, trainjob.Runtime.TORCH).runtime is None  # asked for
    assert export_of(MWMS, trainjob.Runtime.TORCH).runtime is not None  # gs:// packages need the init container
    assert export_of(DDP, trainjob.Runtime.TENSORFLOW).runtime is not None
    forced = export_of(PS, trainjob.Runtime.TORCH)  # a ps cannot be a torch node
    assert forced.runtime is not None and "does not fit" in forced.warnings[0]


def test_a_tuning_job_is_refused():
    from aiptrain.errors import ValidationError

    job = job_of("hp", hyperparameters={"goal": "MAXIMIZE", "maxTrials": 2, "params": [
        {"parameterName": "lr", "type": "DOUBLE", "minValue": 0.1, "maxValue": 0.5}]})
    with pytest.raises(ValidationError, match="Katib"):
        export_of(job)


# -- the per-pod bootstrap against aiptrain's own TF_CONFIG ------------------------------------

PRINT_ENV = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]


def pods_of(export: trainjob.TrainJobExport) -> list[tuple[str, int, dict]]:
    """(replicated job, pod index, container) of every pod Trainer and JobSet would create."""
    if export.runtime is None:
        trainer = export.trainjob.spec.trainer
        assert trainer is not None and trainer.num_nodes
        container = {"command": trainer.command, "env": trainer.env}
        return [(trainjob.NODE, index, container) for index in range(trainer.num_nodes)]
    return [(r["name"], index, r["template"]["spec"]["template"]["spec"]["containers"][0])
            for r in export.runtime.spec["template"]["spec"]["replicatedJobs"]
            for index in range(r["template"]["spec"]["parallelism"])]


def pod_environment(export: trainjob.TrainJobExport, replicated_job: str, index: int, container: dict) -> dict:
    """The container's env as the kubelet resolves it: JobSet's pod labels through the downward
    API, the Indexed Job's JOB_COMPLETION_INDEX, and on torch-distributed Trainer's PET_* values
    (torch plugin of v2.3.0: PET_MASTER_ADDR `<trainjob>-node-0-0.<trainjob>`, port 29500)."""
    name = export.trainjob.metadata.name
    labels = {trainjob.LABEL_JOBSET: name, trainjob.LABEL_REPLICATED_JOB: replicated_job}
    env = {"JOB_COMPLETION_INDEX": str(index), "PATH": "/usr/bin:/bin"}
    for variable in container["env"]:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            path = variable["valueFrom"]["fieldRef"]["fieldPath"]
            env[variable["name"]] = labels[path.split("'")[1]]
    if export.runtime is None:
        trainer = export.trainjob.spec.trainer
        assert trainer is not None
        env.update({"PET_NNODES": str(trainer.num_nodes), "PET_NPROC_PER_NODE": str(trainer.num_proc_per_node),
                    "PET_NODE_RANK": str(index), "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
                    "PET_MASTER_PORT": str(trainjob.TORCH_PORT)})
    return env


def run_bootstrap(container: dict, env: dict) -> dict:
    command = container["command"]
    assert command[:3] == ["python3", "-c", BOOTSTRAP_PY]
    result = subprocess.run([sys.executable, "-c", command[2], *PRINT_ENV], env=env, capture_output=True, text=True,
                            check=True)
    return json.loads(result.stdout)


def local_environments(job: Job) -> list[dict]:
    """Every replica's environment as aiptrain runs it here, in replica order."""
    ti = job.training_input
    local_dir = ti.job_dir if ti.job_dir and not ti.job_dir.startswith("gs://") else None
    inputs = PlanInputs(runtime_image=None if ti.uses_custom_container else RUNTIME_IMAGE, job_dir_mount=local_dir)
    launch_plan = plan(job, replicas_for(ti), inputs)
    return [{"host": spec.hostname, **launch_plan.environment(spec)} for spec in launch_plan.containers]


@pytest.mark.parametrize("job", SHAPES, ids=lambda job: job.job_id)
def test_each_pod_builds_the_tf_config_aiptrain_gives_its_replica(job):
    export = export_of(job)
    name = export.trainjob.metadata.name
    pods = pods_of(export)
    local = local_environments(job)
    assert len(pods) == len(local)
    # Pods come in replica order (roles in the plan's order, indices ascending): pod k is replica k.
    fqdn = {replica["host"]: f"{name}-{rjob}-0-{index}.{name}" for replica, (rjob, index, _) in zip(local, pods, strict=True)}

    def as_pods_see_it(text: str) -> str:
        for host, pod in fqdn.items():
            text = text.replace(f'"{host}:{TF_PORT}"', f'"{pod}:{TF_PORT}"')
        return text

    torch = export.runtime is None
    for replica, (rjob, index, container) in zip(local, pods, strict=True):
        built = run_bootstrap(container, pod_environment(export, rjob, index, container))
        assert built["TF_CONFIG"] == as_pods_see_it(replica["TF_CONFIG"])
        assert built["CLUSTER_SPEC"] == as_pods_see_it(replica["CLUSTER_SPEC"])
        expected_port = str(trainjob.TORCH_PORT) if torch else replica["MASTER_PORT"]
        assert (built["MASTER_ADDR"], built["MASTER_PORT"]) == (fqdn[replica["MASTER_ADDR"]], expected_port)
        assert (built["WORLD_SIZE"], built.get("RANK")) == (replica["WORLD_SIZE"], replica.get("RANK"))
        task = json.loads(built["TF_CONFIG"])["task"]
        assert task["index"] == json.loads(replica["TF_CONFIG"])["task"]["index"]


def test_the_ddp_pods_run_the_images_entrypoint_after_the_bootstrap():
    trainer = export_of(DDP).trainjob.spec.trainer
    assert trainer is not None and trainer.num_proc_per_node == 1 and trainer.num_nodes == 3
    assert trainer.command == ["python3", "-c", BOOTSTRAP_PY, *DDP_ENTRYPOINT, "--steps", "50",
                               "--job-dir", "/data/ddp"]


# -- the command line ---------------------------------------------------------------------------


def test_export_prints_the_runtime_then_the_trainjob_by_default(run, home, monkeypatch):
    from test_tfjob_export import store_job

    monkeypatch.setenv("AIPTRAIN_GCS", "remote")
    store_job(home, ESTIMATOR)
    code, out, err = run("jobs", "export", "estimator_job")
    assert code == 0, err
    assert out.startswith("# Kubeflow Trainer v2 TrainJob of aiptrain job estimator_job")
    expected = export_of(ESTIMATOR)
    assert list(yaml.safe_load_all(out)) == expected.documents()
    assert [d["kind"] for d in expected.documents()] == ["ClusterTrainingRuntime", "TrainJob"]
    assert err == ""
    assert run("ai-platform", "jobs", "export", "estimator_job", "--format", "trainjob")[1] == out
    code, out, _ = run("jobs", "export", "estimator_job", "--format", "trainjob[torch]")
    assert code == 0 and "does not fit torch-distributed" in _


def test_export_refuses_unknown_runtimes_in_one_line(run, home):
    code, out, err = run("jobs", "export", "x", "--format", "trainjob[jax]")
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1 and "trainjob[torch]" in err


def test_submit_dry_run_prints_the_trainjob_and_creates_nothing(run, home, tmp_path):
    from conftest import SAMPLE_TRAINER

    flags = ["--package-path", str(SAMPLE_TRAINER), "--module-name", "trainer.task", "--region", "us-central1",
             "--staging-bucket", str(tmp_path / "bucket"), "--scale-tier", "standard-1", "--runtime-version",
             "minimal"]
    code, out, err = run("jobs", "submit", "training", "dry_tj", *flags, "--dry-run", "--format", "trainjob")
    assert code == 0, err
    runtime, job = yaml.safe_load_all(out)
    assert schema_errors(crd_schema(*RUNTIME_CRD), runtime) == [] and schema_errors(crd_schema(*TRAINJOB_CRD), job) == []
    assert "local bucket" in err and not (tmp_path / "bucket").exists()
    code, out, err = run("jobs", "submit", "training", "dry_tj", *flags, "--format", "trainjob")
    assert (code, out) == (2, "") and "add --dry-run" in err
    assert run("jobs", "list", "--format", "value(jobId)")[1] == ""
