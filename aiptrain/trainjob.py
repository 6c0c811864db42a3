"""A job as a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1), with the
ClusterTrainingRuntime it references, for `jobs export` (its default format) and
`jobs submit training --dry-run --format trainjob`.

Built from the same LaunchPlan as the Docker replicas and the TFJob (tfjob.plan_for_pods).
Pure: no I/O. Trainer v2 has no TensorFlow runtime (kubeflow/trainer#2699), so:

- TensorFlow and every other job shape: an `aiptrain-tensorflow-<name>` ClusterTrainingRuntime
  whose JobSet has one replicated job per task type (chief or master, worker, ps, evaluator),
  one Indexed Job of N pods each. A TrainJob can size only the trainer step (numNodes,
  resourcesPerNode) and patch no Job's parallelism, so the roles' counts and machine types
  live in the runtime, one per exported job. Each pod runs podbootstrap.BOOTSTRAP_PY first, which
  computes TF_CONFIG, CLUSTER_SPEC and the PyTorch variables as aiptrain does
  (planning.ClusterConfig, with a contract's CLUSTER_SPEC names and job) from the JobSet pod
  names and JOB_COMPLETION_INDEX, then becomes the replica's command.
- PyTorch DDP (a master and identical workers, packages in the image): the shipped
  `torch-distributed` runtime; the TrainJob carries the image, command and sizes, and the
  bootstrap takes MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK from Trainer's PET_* variables.

docs/guide/kubeflow-export.md explains the choices and what differs from running here.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import Field

from aiptrain.model import Job
from aiptrain.planning import HOSTNAME_MAX, TF_PORT, ContainerSpec, ReplicaContract, dns_label_within
from aiptrain.podbootstrap import (
    Role,
    bootstrap_command,
    cluster_variable,
    unknown_entrypoint_warning,
    unknown_entrypoints,
)
from aiptrain.tfjob import (
    ObjectMeta,
    Planned,
    _Api,
    object_meta,
    plan_for_pods,
    pod_template,
    refuse_tuning,
    resources,
    storage_notes,
    unreachable_warnings,
)
from aiptrain.topology import MASTER, WORKER, Replica

API_VERSION: Final = "trainer.kubeflow.org/v1alpha1"
TORCH_RUNTIME = "torch-distributed"  # shipped with Trainer v2 (manifests/base/runtimes)
TORCH_PORT = 29500  # Trainer's PET_MASTER_PORT (constants.ContainerTrainerPort)
NODE = "node"  # the container Trainer runs a trainer step in; its webhook requires the name there
LABEL_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
LABEL_FRAMEWORK = "trainer.kubeflow.org/framework"
# JobSet labels every pod with its JobSet's and its replicated job's names (jobset_types.go).
LABEL_JOBSET = "jobset.sigs.k8s.io/jobset-name"
LABEL_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
# Exit codes that fail the job at once, as aiptrain fails a replica that exits 1-127; 128-255
# (killed by a signal) fail the Job by its backoffLimit, and JobSet restarts the whole set.
TRAINER_ERRORS = list(range(1, 128))


class Runtime(str, enum.Enum):
    """Which runtime a job is exported on: chosen from the job (AUTO), or by `trainjob[torch]`."""

    AUTO = "auto"
    TORCH = "torch"
    TENSORFLOW = "tensorflow"


class RuntimeRef(_Api):
    name: str = Field(min_length=1)
    api_group: Literal["trainer.kubeflow.org"] = "trainer.kubeflow.org"
    kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"] = "ClusterTrainingRuntime"


class Trainer(_Api):
    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[dict[str, Any]] | None = None
    num_nodes: int | None = Field(default=None, ge=1)
    resources_per_node: dict[str, Any] | None = None
    num_proc_per_node: int | None = Field(default=None, ge=1)


class TrainJobSpec(_Api):
    runtime_ref: RuntimeRef
    trainer: Trainer | None = None
    runtime_patches: list[dict[str, Any]] | None = None
    active_deadline_seconds: int | None = Field(default=None, ge=1)


class TrainJob(_Api):
    api_version: Literal["trainer.kubeflow.org/v1alpha1"] = API_VERSION
    kind: Literal["TrainJob"] = "TrainJob"
    metadata: ObjectMeta
    spec: TrainJobSpec

    def to_manifest(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ClusterTrainingRuntime(_Api):
    api_version: Literal["trainer.kubeflow.org/v1alpha1"] = API_VERSION
    kind: Literal["ClusterTrainingRuntime"] = "ClusterTrainingRuntime"
    metadata: ObjectMeta
    spec: dict[str, Any]  # mlPolicy and a JobSetTemplateSpec (the tests check it against the CRD)

    def to_manifest(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclass(frozen=True)
class TrainJobExport:
    """A TrainJob, the runtime it needs applied first (None: a runtime Trainer ships), and what a
    person must know: `notes` go into the manifest as comments, `warnings` to stderr."""

    trainjob: TrainJob
    runtime: ClusterTrainingRuntime | None
    notes: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    def comment(self) -> str:
        return "".join(f"# {note}\n" for note in self.notes)

    def documents(self) -> list[dict[str, Any]]:
        """The manifests to apply, in order: the runtime before the TrainJob that names it."""
        return [*([self.runtime.to_manifest()] if self.runtime else []), self.trainjob.to_manifest()]


def roles_of(planned: Planned, primary: str, torch: bool) -> list[Role]:
    """The roles in the plan's order (TF_CONFIG's key order). The torch runtime has one
    replicated job, `node`: the master is its pod 0, worker i its pod i + 1."""
    if torch:
        return [Role(MASTER, NODE, 1), *([Role(WORKER, NODE, planned.counts[WORKER], 1)] if WORKER in planned.counts
                                         else [])]
    return [Role(task_type, primary if task_type == MASTER else task_type, count)
            for task_type, count in planned.counts.items()]


def resource_name(job: Job, roles: list[Role]) -> str:
    """The TrainJob's name (and its JobSet's, and the pods' subdomain): the job ID in DNS form,
    short enough that every pod name `<name>-<replicated job>-0-<index>` is one DNS label."""
    longest = max(len(f"-{r.name}-0-{r.first + r.count - 1}") for r in roles)
    return dns_label_within(job.job_id, HOSTNAME_MAX - longest).strip("-")


def _downward(name: str, label: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}


def bootstrap_env(spec: ContainerSpec, cluster: str) -> list[dict[str, Any]]:
    """The replica's variables, and what BOOTSTRAP_PY reads (JOB_COMPLETION_INDEX comes from the
    Indexed Job)."""
    return [*({"name": k, "value": v} for k, v in spec.env.items()), {"name": "AIPTRAIN_CLUSTER", "value": cluster},
            _downward("JOBSET_NAME", LABEL_JOBSET), _downward("REPLICATED_JOB_NAME", LABEL_REPLICATED_JOB)]


def fits_torch(planned: Planned, runtime: Runtime) -> bool:
    """Whether the job runs on torch-distributed: a master and workers alike (one image, command,
    environment and machine: a TrainJob's trainer has one of each), nothing to fetch (the shipped
    runtime has no init container), and PyTorch by its image's name unless `trainjob[torch]` says so."""
    if runtime is Runtime.TENSORFLOW or set(planned.counts) - {MASTER, WORKER} or planned.fetched:
        return False
    master, master_replica = planned.firsts[MASTER]
    if WORKER in planned.firsts:
        worker, worker_replica = planned.firsts[WORKER]
        if (worker.image, worker.entrypoint, worker.command, worker.env) != (
                master.image, master.entrypoint, master.command, master.env) \
                or resources(worker_replica) != resources(master_replica):
            return False
    return runtime is Runtime.TORCH or "torch" in master.image.lower()


def _role_template(planned: Planned, role: Role, job_dir: str | None, name: str, cluster: str,
                   entrypoints: dict[str, list[str]]) -> dict[str, Any]:
    spec, replica = planned.firsts[role.task_type]
    template = pod_template(spec, replica, job_dir, name, planned.fetched, NODE, ("tf", TF_PORT), planned.buckets)
    container = template["spec"]["containers"][0]
    container.pop("args", None)
    container["command"] = bootstrap_command(spec, entrypoints.get(spec.image))
    container["env"] = bootstrap_env(spec, cluster)
    template["spec"]["restartPolicy"] = "Never"  # the Job's podFailurePolicy needs it
    return template


def _replicated_job(role: Role, primary: str, template: dict[str, Any]) -> dict[str, Any]:
    job_spec = {
        "parallelism": role.count, "completions": role.count, "completionMode": "Indexed", "backoffLimit": 0,
        "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": {
            "containerName": NODE, "operator": "In", "values": TRAINER_ERRORS}}]},
        "template": template,
    }
    # The primary is the trainer step: Trainer's webhook wants it one replica with a `node` container.
    metadata = {"labels": {LABEL_ANCESTOR: "trainer"}} if role.name == primary else None
    return {"name": role.name, "replicas": 1,
            "template": {**({"metadata": metadata} if metadata else {}), "spec": job_spec}}


def _tensorflow_runtime(job: Job, planned: Planned, roles: list[Role], name: str, backoff_limit: int,
                        entrypoints: dict[str, list[str]]) -> ClusterTrainingRuntime:
    primary = planned.cluster.primary
    cluster = cluster_variable(planned.cluster, roles)
    replicated = [_replicated_job(role, primary,
                                  _role_template(planned, role, planned.job_dir, name, cluster, entrypoints))
                  for role in roles]
    jobset = {
        # The primary's end is the job's end, as here: the other roles are stopped then.
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [primary]},
        # An exit 1-127 fails the JobSet; a pod killed by a signal restarts it, up to the budget.
        "failurePolicy": {"maxRestarts": backoff_limit, "rules": [
            {"name": "trainer-error", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]},
        "replicatedJobs": replicated,
    }
    meta = object_meta(job, f"aiptrain-tensorflow-{name}")
    meta = meta.model_copy(update={"labels": {LABEL_FRAMEWORK: "tensorflow"}})
    return ClusterTrainingRuntime(metadata=meta, spec={"mlPolicy": {"numNodes": 1}, "template": {"spec": jobset}})


def _torch_trainer(planned: Planned, roles: list[Role], name: str,
                   entrypoints: dict[str, list[str]]) -> tuple[Trainer, dict[str, Any]]:
    """The trainer step on torch-distributed, and the runtime patch that adds aiptrain's volumes
    and security settings (a TrainJob cannot set them otherwise)."""
    spec, replica = planned.firsts[MASTER]
    template = pod_template(spec, replica, planned.job_dir, name, [], NODE, buckets=planned.buckets)
    pod, container = template["spec"], template["spec"]["containers"][0]
    trainer = Trainer(image=spec.image, command=bootstrap_command(spec, entrypoints.get(spec.image)),
                      env=bootstrap_env(spec, cluster_variable(planned.cluster, roles)),
                      num_nodes=sum(r.count for r in roles), num_proc_per_node=1,
                      resources_per_node=resources(replica))
    pod_patch = {"volumes": pod["volumes"], "securityContext": pod["securityContext"],
                 "containers": [{"name": NODE, "volumeMounts": container["volumeMounts"],
                                 "securityContext": container["securityContext"]}]}
    node = {"name": NODE, "template": {"spec": {"template": {"metadata": template["metadata"], "spec": pod_patch}}}}
    patch = {"manager": "aiptrain", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node]}}}}
    return trainer, patch


def build_trainjob(job: Job, replicas: list[Replica], runtime_image: str | None, package_uris: list[str],
                   backoff_limit: int, max_running_seconds: float | None = None, runtime: Runtime = Runtime.AUTO,
                   entrypoints: dict[str, list[str]] | None = None,
                   contract: ReplicaContract | None = None) -> TrainJobExport:
    """The TrainJob of `job` and its runtime. `entrypoints` are the ENTRYPOINTs of custom images
    that run without containerCommand (the bootstrap must run them itself); `contract`: what the
    job (of another dialect) tells its replicas."""
    refuse_tuning(job, "TrainJob")
    entrypoints = entrypoints or {}
    planned = plan_for_pods(job, replicas, runtime_image, package_uris, contract)
    torch = fits_torch(planned, runtime)
    roles = roles_of(planned, planned.cluster.primary, torch)
    name = resource_name(job, roles)
    deadline = max(1, math.ceil(max_running_seconds)) if max_running_seconds is not None else None
    if torch:
        trainer, patch = _torch_trainer(planned, roles, name, entrypoints)
        spec = TrainJobSpec(runtime_ref=RuntimeRef(name=TORCH_RUNTIME), trainer=trainer, runtime_patches=[patch],
                            active_deadline_seconds=deadline)
        cluster_runtime = None
    else:
        cluster_runtime = _tensorflow_runtime(job, planned, roles, name, backoff_limit, entrypoints)
        spec = TrainJobSpec(runtime_ref=RuntimeRef(name=cluster_runtime.metadata.name),
                            active_deadline_seconds=deadline)
    trainjob = TrainJob(metadata=object_meta(job, name), spec=spec)
    images = sorted({spec.image for spec, _ in planned.firsts.values()})
    return TrainJobExport(trainjob, cluster_runtime, _notes(job, planned, torch, images, name),
                          _warnings(job, planned, runtime, torch, entrypoints))


def _notes(job: Job, planned: Planned, torch: bool, images: list[str], name: str) -> tuple[str, ...]:
    if torch:
        how = (f"on Trainer's {TORCH_RUNTIME} runtime: MASTER_ADDR, MASTER_PORT ({TORCH_PORT}), WORLD_SIZE and RANK "
               "come from its PET_* variables (one process per pod, numProcPerNode 1).")
    else:
        how = (f"on its own ClusterTrainingRuntime aiptrain-tensorflow-{name} (apply it first: this file lists it "
               "first): one JobSet replicated job per task type; the job ends when the primary ends.")
    notes = [
        f"Kubeflow Trainer v2 TrainJob of aiptrain job {job.job_id}, {how} Apply with `kubectl apply -f FILE`; needs "
        "Kubeflow Trainer v2.3 (and JobSet).",
        "Each pod computes TF_CONFIG and CLUSTER_SPEC as aiptrain does, from its JobSet pod name and "
        "JOB_COMPLETION_INDEX (python3 must be in the image).",
        f"The cluster must be able to pull {', '.join(images)}: push to a registry it reads (or load into it).",
    ]
    return (*notes, *storage_notes(planned, name))


def _warnings(job: Job, planned: Planned, runtime: Runtime, torch: bool,
              entrypoints: dict[str, list[str]]) -> tuple[str, ...]:
    warnings = list(unreachable_warnings(job, planned.unreachable))
    if runtime is Runtime.TORCH and not torch:
        warnings.append(f"Job [{job.job_id}] does not fit {TORCH_RUNTIME} (it needs a master and identical workers "
                        "with the packages in the image): exported on aiptrain-tensorflow instead.")
    unknown = unknown_entrypoints([spec for spec, _ in planned.firsts.values()], entrypoints)
    if unknown:
        warnings.append(unknown_entrypoint_warning(unknown))
    return tuple(warnings)
