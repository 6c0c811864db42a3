"""A job as a Kubeflow TFJob (kubeflow.org/v1), for `jobs export --format tfjob` and
`jobs submit training --dry-run --format tfjob`.

Built from the same LaunchPlan that drives Docker (planning.plan), so both run the same
image, command, arguments and environment. Pure: no I/O; the caller looks up the runtime
image and says where the packages are.

Mapping (docs/guide/kubeflow-export.md explains the choices):
- replica types: master -> Chief (Master where aiptrain's TF_CONFIG says `master`: runtimes
  before 2.1 and custom containers without useChiefInTfConfig, so the trainer sees the same
  task type), worker -> Worker, ps -> PS, evaluator -> Evaluator;
- restartPolicy ExitCode on every type: the operator recreates a pod that exited 128-255
  (killed by a signal) and fails the job on 1-127, as aiptrain restarts signal-killed replicas
  and fails on any other code; runPolicy.backoffLimit is aiptrain's restart budget;
- TF_CONFIG is the operator's (its services' DNS names); CLUSTER_SPEC and the PyTorch
  variables name aiptrain's Docker hostnames, so they are left out, except for a job whose
  CLUSTER_SPEC names its task types its own way (a Vertex AI job's contract, which its trainers
  read): its pods run podbootstrap.BOOTSTRAP_PY, which rebuilds them from the operator's TF_CONFIG;
- a contract's buckets seen as files (/gcs/BUCKET) are GKE's Cloud Storage FUSE CSI volumes;
- packages: a `gs://` package is fetched by an init container into the directory the
  replicas install from; a package in a local bucket cannot reach a pod (a warning says so)
  and the image must already hold it;
- a local job dir is a ReadWriteMany PersistentVolumeClaim (JOB_DIR_CLAIM) mounted at the
  same path, one subdirectory per job; a gs:// job dir is passed through.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from aiptrain.errors import ValidationError
from aiptrain.jobpaths import WHEELHOUSE
from aiptrain.model import Job
from aiptrain.planning import (
    HOSTNAME_MAX,
    PACKAGES_DIR,
    TF_PORT,
    ClusterConfig,
    ContainerSpec,
    PlanInputs,
    ReplicaContract,
    dns_label_within,
    plan,
    primary_task_type,
)
from aiptrain.podbootstrap import (
    Role,
    bootstrap_command,
    cluster_variable,
    unknown_entrypoint_warning,
    unknown_entrypoints,
)
from aiptrain.topology import EVALUATOR, MASTER, PS, WORKER, Replica

# -- the TFJob API, from the training operator's API reference (docs/api, kubeflow.org/v1) ------

API_VERSION: Final = "kubeflow.org/v1"
KIND: Final = "TFJob"
# The operator sets TF_CONFIG only in the container of this name, and its webhook refuses a
# replica spec without one.
CONTAINER_NAME = "tensorflow"
PORT_NAME = "tfjob-port"  # the operator's default port name; aiptrain's port is its default too


class ReplicaType(str, enum.Enum):
    CHIEF = "Chief"
    MASTER = "Master"
    WORKER = "Worker"
    PS = "PS"
    EVALUATOR = "Evaluator"


class RestartPolicy(str, enum.Enum):
    ALWAYS = "Always"
    ON_FAILURE = "OnFailure"
    NEVER = "Never"
    EXIT_CODE = "ExitCode"


class CleanPodPolicy(str, enum.Enum):
    ALL = "All"
    RUNNING = "Running"
    NONE = "None"


class _Api(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class ObjectMeta(_Api):
    name: str = Field(pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=HOSTNAME_MAX)
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class ReplicaSpec(_Api):
    replicas: int = Field(ge=1)
    restart_policy: RestartPolicy = RestartPolicy.NEVER
    template: dict[str, Any]  # a core/v1 PodTemplateSpec (the tests check it with the kubernetes client)

    @model_validator(mode="after")
    def _has_tensorflow_container(self) -> ReplicaSpec:
        containers = self.template.get("spec", {}).get("containers", [])
        if not any(c.get("name") == CONTAINER_NAME and c.get("image") for c in containers):
            raise ValueError(f"a replica's pod needs a container named {CONTAINER_NAME!r} with an image")
        return self


class RunPolicy(_Api):
    clean_pod_policy: CleanPodPolicy | None = None
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    backoff_limit: int | None = Field(default=None, ge=0)


class TFJobSpec(_Api):
    run_policy: RunPolicy = RunPolicy()
    success_policy: Literal["", "AllWorkers"] | None = None
    tf_replica_specs: dict[ReplicaType, ReplicaSpec]

    @model_validator(mode="after")
    def _one_chief(self) -> TFJobSpec:
        if {ReplicaType.CHIEF, ReplicaType.MASTER} <= set(self.tf_replica_specs):
            raise ValueError("a TFJob has a Chief or a Master, not both")
        for primary in (ReplicaType.CHIEF, ReplicaType.MASTER):
            if primary in self.tf_replica_specs and self.tf_replica_specs[primary].replicas != 1:
                raise ValueError(f"a TFJob has one {primary.value}")
        return self


class TFJob(_Api):
    api_version: Literal["kubeflow.org/v1"] = API_VERSION
    kind: Literal["TFJob"] = KIND
    metadata: ObjectMeta
    spec: TFJobSpec

    def to_manifest(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# -- from a job to a TFJob ----------------------------------------------------------------------

# A ReadWriteMany claim the cluster's user creates once; each job writes in its own subdirectory.
JOB_DIR_CLAIM = "aiptrain-job-dir"
# Fetches gs:// packages (and a wheelhouse staged beside them) for the replicas: gsutil as the
# pod's Google identity (e.g. GKE Workload Identity) reads the bucket.
FETCH_IMAGE = "gcr.io/google.com/cloudsdktool/google-cloud-cli:slim"
FETCH = (
    "set -e; "
    f'for uri in "$@"; do gsutil -q cp "$uri" {PACKAGES_DIR}/; '
    f'dir="${{uri%/*}}/{WHEELHOUSE}"; '
    f'if gsutil -q ls "$dir/" >/dev/null 2>&1; then gsutil -q -m cp -r "$dir" {PACKAGES_DIR}/; fi; done'
)
ANNOTATION_JOB_ID = "aiptrain/job-id"
ANNOTATION_LABEL = "aiptrain/label."  # a job label that Kubernetes would refuse as a label
NO_ISTIO = {"sidecar.istio.io/inject": "false"}  # Kubeflow's docs: TFJob pods fail with Istio's sidecar
INSTALL_VARIABLES = ("AIPTRAIN_PACKAGES", "AIPTRAIN_WHEELHOUSE")  # what planning.BOOTSTRAP installs from
REPLICA_USER = "65534:65534"  # nobody, as aiptrain's replicas run when it runs as root
# How GKE gives pods a bucket as files, as Vertex AI's /gcs (Cloud Storage FUSE): an inline CSI
# volume of its driver, and the pod annotation that has its webhook add the gcsfuse sidecar.
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
GCSFUSE_ANNOTATION = "gke-gcsfuse/volumes"
_K8S_LABEL = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


@dataclass(frozen=True)
class Export:
    """A TFJob and what a person must know to apply it: `notes` go into the manifest as
    comments, `warnings` to stderr."""

    tfjob: TFJob
    notes: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    def comment(self) -> str:
        return "".join(f"# {note}\n" for note in self.notes)

    def documents(self) -> list[dict[str, Any]]:
        """The manifests to apply, in order (one YAML document each)."""
        return [self.tfjob.to_manifest()]


def replica_type(job: Job, task_type: str) -> ReplicaType:
    if task_type == MASTER:
        return ReplicaType.CHIEF if primary_task_type(job) == "chief" else ReplicaType.MASTER
    return {WORKER: ReplicaType.WORKER, PS: ReplicaType.PS, EVALUATOR: ReplicaType.EVALUATOR}[task_type]


def resource_name(job: Job, replicas: list[Replica]) -> str:
    """The TFJob's name: the job ID in DNS form, short enough that the operator's pod and
    service names (`<name>-<replica type>-<index>`) stay one DNS label."""
    counts: dict[str, int] = {}
    for replica in replicas:
        kind = replica_type(job, replica.task_type).value.lower()
        counts[kind] = counts.get(kind, 0) + 1
    longest = max(len(f"-{kind}-{count - 1}") for kind, count in counts.items())
    return dns_label_within(job.job_id, HOSTNAME_MAX - longest).strip("-")


def memory_quantity(memory_gb: float) -> str:
    """Machine types' GB are GiB (as planning counts them): `15Gi`, or whole MiB (`7373Mi`)."""
    return f"{int(memory_gb)}Gi" if float(memory_gb).is_integer() else f"{round(memory_gb * 1024)}Mi"


def resources(replica: Replica) -> dict[str, dict[str, str]]:
    """The machine type as requests equal to limits (a pod sized as that VM); GPUs as the
    NVIDIA device plugin's resource."""
    sized = {"cpu": str(replica.machine.vcpus), "memory": memory_quantity(replica.machine.memory_gb)}
    limits = dict(sized)
    if replica.accelerator:
        limits["nvidia.com/gpu"] = str(replica.accelerator.count)
    return {"requests": sized, "limits": limits}


def object_meta(job: Job, name: str) -> ObjectMeta:
    """Job labels Kubernetes accepts are labels; the rest (AI Platform allows a trailing `_`)
    are kept as annotations, with the job ID."""
    labels, annotations = {}, {ANNOTATION_JOB_ID: job.job_id}
    for key, value in (job.labels or {}).items():
        if _K8S_LABEL.match(key) and key and len(key) <= 63 and _K8S_LABEL.match(value) and len(value) <= 63:
            labels[key] = value
        else:
            annotations[ANNOTATION_LABEL + key] = value
    return ObjectMeta(name=name, labels=labels or None, annotations=annotations)


def _security_context(user: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod, container) security contexts: aiptrain's replica settings in Kubernetes' words."""
    uid, _, gid = user.partition(":")
    pod = {"runAsNonRoot": True, "runAsUser": int(uid), "runAsGroup": int(gid or uid), "fsGroup": int(gid or uid)}
    container = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                 "capabilities": {"drop": ["ALL"]}}
    return pod, container


@dataclass(frozen=True)
class BucketMount:
    """A bucket a replica sees as a directory (a contract's /gcs/BUCKET)."""

    bucket: str
    path: str
    writable: bool


def bucket_volumes(buckets: tuple[BucketMount, ...], user: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): each bucket as an inline volume of GKE's Cloud Storage FUSE CSI driver,
    its files owned by the replica's user (the driver mounts as root otherwise), directories
    implied by object names as Cloud Storage FUSE shows them on Vertex AI."""
    uid, _, gid = user.partition(":")
    volumes, mounts = [], []
    for index, mount in enumerate(buckets):
        name = f"gcs-{index}"  # a bucket's name need not be a DNS label
        volumes.append({"name": name, "csi": {"driver": GCSFUSE_DRIVER, "readOnly": not mount.writable,
                                              "volumeAttributes": {"bucketName": mount.bucket, "mountOptions":
                                                                   f"implicit-dirs,uid={uid},gid={gid or uid}"}}})
        mounts.append({"name": name, "mountPath": mount.path, **({} if mount.writable else {"readOnly": True})})
    return volumes, mounts


def pod_template(spec: ContainerSpec, replica: Replica, job_dir: str | None, job_name: str,
                 fetched: list[str], container_name: str = CONTAINER_NAME,
                 port: tuple[str, int] = (PORT_NAME, TF_PORT), buckets: tuple[BucketMount, ...] = ()) -> dict[str, Any]:
    """A replica's core/v1 PodTemplateSpec: its container `container_name` as the plan runs it,
    the init container that fetches gs:// packages, the job dir's claim and the buckets seen as
    files (shared with TrainJob)."""
    pod_security, container_security = _security_context(spec.user)
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}, {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if job_dir:
        mounts.append({"name": "job-dir", "mountPath": job_dir, "subPath": job_name})
        volumes.append({"name": "job-dir", "persistentVolumeClaim": {"claimName": JOB_DIR_CLAIM}})
    init_containers = []
    if fetched:
        package_mount = {"name": "packages", "mountPath": PACKAGES_DIR}
        mounts.append({**package_mount, "readOnly": True})
        volumes.append({"name": "packages", "emptyDir": {}})
        init_containers.append({
            "name": "fetch-packages", "image": FETCH_IMAGE, "command": ["sh", "-c", FETCH, "fetch", *fetched],
            "env": [{"name": "HOME", "value": "/tmp"}, {"name": "CLOUDSDK_CONFIG", "value": "/tmp/gcloud"}],
            "volumeMounts": [package_mount, {"name": "tmp", "mountPath": "/tmp"}],
            "securityContext": container_security,
        })
    fuse_volumes, fuse_mounts = bucket_volumes(buckets, spec.user)
    volumes.extend(fuse_volumes)
    mounts.extend(fuse_mounts)
    container: dict[str, Any] = {
        "name": container_name,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": spec.entrypoint,  # Docker's ENTRYPOINT; None keeps the image's
        "args": spec.command or None,  # Docker's CMD
        "workingDir": spec.working_dir,
        "env": [{"name": key, "value": value} for key, value in spec.env.items()],
        "ports": [{"name": port[0], "containerPort": port[1]}],
        "resources": resources(replica),
        "volumeMounts": mounts,
        "securityContext": container_security,
    }
    pod_spec = {
        "initContainers": init_containers or None,
        "containers": [{k: v for k, v in container.items() if v is not None}],
        "volumes": volumes,
        "securityContext": pod_security,
    }
    annotations = {**NO_ISTIO, **({GCSFUSE_ANNOTATION: "true"} if buckets else {})}
    return {"metadata": {"annotations": annotations}, "spec": {k: v for k, v in pod_spec.items() if v is not None}}


@dataclass(frozen=True)
class Planned:
    """What every Kubernetes export starts from: the launch plan's first container of each task
    type (a type's replicas differ only in index) with the replica it runs, the count of each
    type, the plan's cluster (TF_CONFIG's parts), where the packages and the job dir come from,
    and the job's contract (what a job of another dialect tells its replicas), if any."""

    firsts: dict[str, tuple[ContainerSpec, Replica]]
    counts: dict[str, int]
    cluster: ClusterConfig
    fetched: list[str]  # gs:// packages an init container fetches
    unreachable: list[str]  # packages in a local bucket, which no pod can read
    job_dir: str | None  # a local job dir, mounted from JOB_DIR_CLAIM
    contract: ReplicaContract | None = None

    @property
    def buckets(self) -> tuple[BucketMount, ...]:
        """The buckets the contract shows its replicas as directories, as here."""
        contract = self.contract
        if contract is None or not contract.bucket_mount_dir:
            return ()
        return tuple(BucketMount(bucket, f"{contract.bucket_mount_dir}/{bucket}", writable)
                     for bucket, writable in contract.buckets)

    @property
    def names_its_own_cluster_spec(self) -> bool:
        """Whether CLUSTER_SPEC names the task types its own way (a contract's): its trainers read it."""
        return bool(self.cluster.spec_names)


def refuse_tuning(job: Job, kind: str) -> None:
    if job.training_input.hyperparameters:
        raise ValidationError(
            f"Job [{job.job_id}] is a hyperparameter tuning job, which a {kind} cannot express: on Kubernetes, "
            "Kubeflow's Katib runs studies (an Experiment whose trial template is one trial's job); submit the "
            "trial's job without the study, export that, and use it as the template."
        )


def plan_for_pods(job: Job, replicas: list[Replica], runtime_image: str | None, package_uris: list[str],
                  contract: ReplicaContract | None = None) -> Planned:
    """The job planned as pods run it: packages under PACKAGES_DIR, as user nobody, with what its
    contract tells its replicas (variables, args, CLUSTER_SPEC's names and job)."""
    ti = job.training_input
    unreachable = [uri for uri in package_uris if not uri.startswith("gs://")]
    fetched = [] if unreachable else list(package_uris)  # all from gs://, or all from the image
    job_dir = ti.job_dir if ti.job_dir and not ti.job_dir.startswith("gs://") else None
    inputs = PlanInputs(
        runtime_image=runtime_image,
        package_files=tuple(uri.rsplit("/", 1)[-1] for uri in package_uris),
        wheelhouse=WHEELHOUSE if runtime_image and fetched else None,
        job_dir_mount=job_dir,
        user=REPLICA_USER,
        contract=contract,
    )
    launch_plan = plan(job, replicas, inputs)
    firsts: dict[str, tuple[ContainerSpec, Replica]] = {}
    counts: dict[str, int] = {}
    for spec, replica in zip(launch_plan.containers, replicas, strict=True):
        if unreachable:  # the bootstrap skips the install and runs the module the image holds
            spec = replace(spec, env={k: v for k, v in spec.env.items() if k not in INSTALL_VARIABLES})
        firsts.setdefault(replica.task_type, (spec, replica))
        counts[replica.task_type] = counts.get(replica.task_type, 0) + 1
    assert launch_plan.cluster is not None  # plan() always builds one
    return Planned(firsts, counts, launch_plan.cluster, fetched, unreachable, job_dir, contract)


def build_tfjob(job: Job, replicas: list[Replica], runtime_image: str | None, package_uris: list[str],
                backoff_limit: int, max_running_seconds: float | None = None, contract: ReplicaContract | None = None,
                entrypoints: dict[str, list[str]] | None = None) -> Export:
    """The TFJob of `job`. `package_uris` are where its packages are (packageUris): gs:// ones
    are fetched in each pod, others cannot reach a pod. `backoff_limit` is aiptrain's restart
    budget. `contract`: what the job (of another dialect) tells its replicas; `entrypoints`: the
    ENTRYPOINTs of custom images run without a command, which the bootstrap must run itself."""
    refuse_tuning(job, "TFJob")
    planned = plan_for_pods(job, replicas, runtime_image, package_uris, contract)
    name = resource_name(job, replicas)
    roles = [Role(task_type, replica_type(job, task_type).value.lower(), count)
             for task_type, count in planned.counts.items()]
    specs = {
        replica_type(job, task_type): ReplicaSpec(
            replicas=planned.counts[task_type], restart_policy=RestartPolicy.EXIT_CODE,
            template=_template(planned, task_type, name, roles, entrypoints or {}),
        )
        for task_type in planned.firsts
    }
    run_policy = RunPolicy(
        clean_pod_policy=CleanPodPolicy.RUNNING,
        backoff_limit=backoff_limit,
        active_deadline_seconds=max(1, math.ceil(max_running_seconds)) if max_running_seconds is not None else None,
    )
    tfjob = TFJob(metadata=object_meta(job, name), spec=TFJobSpec(run_policy=run_policy, tf_replica_specs=specs))
    images = sorted({c["image"] for s in specs.values() for c in s.template["spec"]["containers"]})
    warnings = list(unreachable_warnings(job, planned.unreachable))
    unknown = unknown_entrypoints([spec for spec, _ in planned.firsts.values()], entrypoints or {})
    if planned.names_its_own_cluster_spec and unknown:
        warnings.append(unknown_entrypoint_warning(unknown))
    return Export(tfjob, notes_of(job, images, planned, name), tuple(warnings))


def _template(planned: Planned, task_type: str, name: str, roles: list[Role],
              entrypoints: dict[str, list[str]]) -> dict[str, Any]:
    """A replica type's pod template; where the job's CLUSTER_SPEC is its own, its container runs
    the bootstrap that rebuilds TF_CONFIG and CLUSTER_SPEC from the operator's TF_CONFIG first."""
    spec, replica = planned.firsts[task_type]
    template = pod_template(spec, replica, planned.job_dir, name, planned.fetched, buckets=planned.buckets)
    if planned.names_its_own_cluster_spec:
        container = template["spec"]["containers"][0]
        container.pop("args", None)
        container["command"] = bootstrap_command(spec, entrypoints.get(spec.image))
        container["env"].append({"name": "AIPTRAIN_CLUSTER", "value": cluster_variable(planned.cluster, roles)})
    return template


def notes_of(job: Job, images: list[str], planned: Planned, name: str) -> tuple[str, ...]:
    if planned.names_its_own_cluster_spec:
        cluster = ("Each pod rebuilds TF_CONFIG (with the job's `job` part) and CLUSTER_SPEC as aiptrain sets them "
                   "from the operator's TF_CONFIG, its services' names for the hosts (python3 must be in the image).")
    else:
        cluster = "TF_CONFIG is set by the operator (its services' names, and no `job` part); CLUSTER_SPEC is not set."
    notes = [
        f"Kubeflow TFJob of aiptrain job {job.job_id}. Apply with `kubectl apply -f FILE`; needs Kubeflow's "
        "training-operator.",
        "restartPolicy ExitCode: a replica that exits 128-255 (killed by a signal) is recreated, 1-127 fails the "
        "job, as aiptrain restarts signal-killed replicas; backoffLimit is aiptrain's restart budget.",
        cluster,
        f"The cluster must be able to pull {', '.join(images)}: push to a registry it reads (or load into it).",
    ]
    return (*notes, *storage_notes(planned, name))


def storage_notes(planned: Planned, name: str) -> tuple[str, ...]:
    """What the pods read and write beyond their images, for the person applying the manifests."""
    notes = []
    if planned.fetched:
        notes.append("The init container fetches the packages from gs://: pods need read access to the bucket.")
    if planned.job_dir:
        notes.append(f"The job dir {planned.job_dir} is subdirectory {name} of the ReadWriteMany PersistentVolumeClaim "
                     f"{JOB_DIR_CLAIM}: create it first (or use a gs:// job dir).")
    contract = planned.contract
    if contract and contract.output_dir and contract.output_env:
        notes.append(f"{', '.join(contract.output_env)} name directories under {contract.output_dir}, as here: pods "
                     "need write access to it.")
    if planned.buckets:
        notes.append(
            f"The buckets {', '.join(b.bucket for b in planned.buckets)} are mounted at "
            f"{contract.bucket_mount_dir if contract else ''}/BUCKET as here, as volumes of GKE's Cloud Storage FUSE "
            f"CSI driver ({GCSFUSE_DRIVER}): enable it on the cluster and give the pods' Kubernetes service account "
            "access to the buckets (Workload Identity); elsewhere, remove those volumes or mount the buckets your way.")
    return tuple(notes)


def unreachable_warnings(job: Job, unreachable: list[str]) -> tuple[str, ...]:
    if not unreachable:
        return ()
    return (
        f"The packages of job [{job.job_id}] are in a local bucket ({', '.join(unreachable)}), which pods cannot "
        "read: the manifest runs the module from the image, so install them in it, or submit with "
        "`--staging-bucket gs://BUCKET` and export again.",
    )


def with_warning(export: Export, warning: str) -> Export:
    return replace(export, warnings=(*export.warnings, warning))


def with_note(export: Export, note: str) -> Export:
    return replace(export, notes=(*export.notes, note))
