"""Plan, then execute: turn a validated Job into a LaunchPlan, a plain value describing
every container (image, command, env, mounts, network, labels, limits).

`plan()` does no I/O: everything it needs about the host comes in PlanInputs. The
backends (one Docker engine, or a Docker Swarm) are the only code that turns a plan into
containers, and `--dry-run` prints the plan instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiptrain.jobpaths import metric_file_name
from aiptrain.labels import LABEL_INSTALLATION, LABEL_JOB, LABEL_TASK, LABEL_TASK_INDEX, LABEL_TASK_TYPE, LABEL_TRIAL
from aiptrain.lifecycle import RunRules
from aiptrain.model import Job, ReplicaConfig, TrainingInput
from aiptrain.storage.endpoint import (
    AWAIT_ENDPOINT,
    AWAIT_THEN_RUN_MODULE,
    REPLICA_CREDENTIALS,
    TLS_DIR_NAME,
    ProjectCredential,
    StorageEndpoint,
    replica_env,
)
from aiptrain.topology import EVALUATOR, MASTER, PS, WORKER, Replica

if TYPE_CHECKING:
    from aiptrain.settings import Settings

TF_PORT = 2222
PACKAGES_DIR = "/opt/aiptrain/packages"  # read-only inside every runtime replica
# Where a trial's replicas write their cloudml-hypertune metric files (one per task), read-write.
HYPERTUNE_DIR = "/opt/aiptrain/hypertune"

USER_BASE = "/tmp/.local"  # PYTHONUSERBASE of every replica: where `pip install --user` puts packages
INSTALL_TARGET = "/opt/aiptrain/install"  # the install container's PYTHONUSERBASE, read-write

# Installs the staged packages offline, as the user (`--user`: a site dir, so .pth files
# work), with the wheelhouse's wheels: their dependencies as the host resolved them against the
# image (aiptrain.dependencies), which holds the rest. --no-deps: pip here decides nothing, so a
# trainer's `tensorflow==2.8.0` served by the wheelhouse's tensorflow-cpu 2.8.0 is not refused
# for want of a `tensorflow` distribution. (The unquoted $deps expands the wheels' glob.)
INSTALL = (
    'deps=; [ -n "$AIPTRAIN_WHEELHOUSE" ] && deps="$AIPTRAIN_WHEELHOUSE/*.whl"; '
    "python3 -m pip install --user --no-index --no-deps --no-build-isolation --no-cache-dir "
    "--disable-pip-version-check --no-warn-script-location --quiet $deps $AIPTRAIN_PACKAGES"
)
# Runs in each replica: install the packages unless they were installed once for the whole
# job (aiptrain.installs: then they are mounted read-only at USER_BASE and AIPTRAIN_PACKAGES
# is unset), then become the trainer. `sh -c SCRIPT MODULE ARGS...` keeps the user's
# arguments out of any shell quoting.
BOOTSTRAP = (
    'if [ -n "$AIPTRAIN_PACKAGES" ]; then echo "Installing the package: $AIPTRAIN_PACKAGES"; '
    f"{INSTALL} || exit 1; fi; "
    'echo "Running command: python3 -m $0 $*"; '
    f'[ -z "${AWAIT_ENDPOINT}" ] || exec python3 -c "{AWAIT_THEN_RUN_MODULE}" "$0" "$@"; '
    'exec python3 -m "$0" "$@"'
)


@dataclass(frozen=True)
class Mount:
    source: str  # host path
    target: str  # path inside the container
    read_only: bool = True


# A hostname is one DNS label: the kernel refuses longer ones (sethostname).
NOBODY_ID = 65534
NOBODY = f"{NOBODY_ID}:{NOBODY_ID}"

HOSTNAME_MAX = 63
DIGEST_CHARS = 8


@dataclass(frozen=True)
class ContainerSpec:
    name: str  # unique on the engine: <base>-<type>-<index>-<installation>
    hostname: str  # DNS name on the job's network, used in TF_CONFIG
    task_name: str  # master-replica-0, as in logs
    task_type: str
    task_index: int
    image: str
    entrypoint: list[str] | None  # None: the image's ENTRYPOINT
    command: list[str]
    env: dict[str, str]
    mounts: tuple[Mount, ...]
    labels: dict[str, str]
    user: str
    gpus: int = 0
    nano_cpus: int | None = None
    memory_bytes: int | None = None
    shm_bytes: int = 1 << 30
    pids_limit: int | None = None  # None: the engine's default (unlimited)
    # Runtime replicas start in the writable /tmp; a custom container keeps its image's WORKDIR
    # (None), which entrypoints such as `python3 main.py` rely on.
    working_dir: str | None = "/tmp"

    @property
    def runs_bootstrap(self) -> bool:
        """Whether the replica runs BOOTSTRAP, which can wait for the storage endpoint itself."""
        return BOOTSTRAP in (*(self.entrypoint or ()), *self.command)


@dataclass(frozen=True)
class NetworkSpec:
    name: str
    labels: dict[str, str]
    addresses: int = 1  # how many replicas the network holds: the backend sizes its subnet by it


# Two numbers are the same value of a condition when this close, as the service matched them.
CONDITION_TOLERANCE = 1e-10


@dataclass(frozen=True)
class SearchCondition:
    """When a conditional parameter is searched: only in a trial whose `parent` parameter took
    one of `values` (written as a trial receives them: `4`, `0.5`, `adam`)."""

    parent: str  # a parameter listed before the conditional one
    values: tuple[str, ...]


@dataclass(frozen=True)
class StudyRules:
    """What a study of another dialect asks beyond a HyperparameterSpec, as data the study
    applies without knowing the dialect (aiptrain.search, aiptrain.runner.study)."""

    conditions: dict[str, SearchCondition] = field(default_factory=dict)  # parameter -> when it is searched
    best_report_is_final: bool = False  # a trial's final metric is its best report, not its last


def study_rules_from_dict(data: dict[str, Any] | None) -> StudyRules | None:
    if not data:
        return None
    conditions = {name: SearchCondition(condition["parent"], tuple(condition["values"]))
                  for name, condition in data.get("conditions", {}).items()}
    return StudyRules(conditions, bool(data.get("best_report_is_final")))


@dataclass(frozen=True)
class ReplicaContract:
    """What a job of another dialect (Vertex AI's) tells its replicas where AI Platform's
    differs, as data the planner applies without knowing the dialect: CLUSTER_SPEC's names for
    the task types and the job it carries, variables for every replica and per task type, each
    task type's own args, directories under an output prefix (per trial in a study), and the
    buckets seen as files; for a tuning job, how its study searches (StudyRules). Built by the
    dialect (aiptrain.vertex.translate); saved with the plan inputs, so the controller plans
    every trial with it."""

    cluster_spec_names: dict[str, str]  # task type -> its CLUSTER_SPEC name (master -> workerpool0)
    cluster_spec_job: Any = None  # CLUSTER_SPEC's and TF_CONFIG's `job`, as the dialect gives it
    env: dict[str, str] = field(default_factory=dict)  # every replica
    task_env: dict[str, dict[str, str]] = field(default_factory=dict)  # per task type, after `env`
    task_args: dict[str, list[str]] = field(default_factory=dict)  # per task type: replaces the job's args
    output_dir: str | None = None  # a gs:// prefix; a trial's is `<prefix>/<trial id>`
    output_env: dict[str, str] = field(default_factory=dict)  # variable -> the directory under output_dir
    bucket_mount_dir: str | None = None  # where buckets appear as directories (/gcs)
    buckets: tuple[tuple[str, bool], ...] = ()  # (bucket, writable): the job's project's, at submit
    study: StudyRules | None = None  # a tuning job's search beyond its HyperparameterSpec

    def output_variables(self, trial: Trial | None) -> dict[str, str]:
        if not self.output_dir:
            return {}
        base = trial_job_dir(self.output_dir, trial).rstrip("/")
        return {name: f"{base}/{below}" for name, below in self.output_env.items()}

    def replica_env(self, task_type: str, trial: Trial | None) -> dict[str, str]:
        return {**self.env, **self.output_variables(trial), **self.task_env.get(task_type, {})}

    def bucket_mounts(self, gcs_root: str | None) -> list[Mount]:
        if not (self.bucket_mount_dir and gcs_root):
            return []
        root = gcs_root.rstrip("/")
        return [Mount(f"{root}/{bucket}", f"{self.bucket_mount_dir}/{bucket}", read_only=not writable)
                for bucket, writable in self.buckets]


def contract_from_dict(data: dict[str, Any] | None) -> ReplicaContract | None:
    if not data:
        return None
    return ReplicaContract(**{**data, "buckets": tuple(tuple(pair) for pair in data.get("buckets", ())),
                              "study": study_rules_from_dict(data.get("study"))})


@dataclass(frozen=True)
class ClusterConfig:
    """What TF_CONFIG and CLUSTER_SPEC (and PyTorch's MASTER_ADDR, MASTER_PORT, WORLD_SIZE and
    RANK, see pytorch_env) hold in common on every replica, built once per plan so that a plan
    grows linearly with its replicas; each replica's variables are assembled at launch.

    TF_CONFIG's cluster never lists evaluators (they are not part of the training cluster);
    CLUSTER_SPEC lists every replica and always calls the primary `master`. `job` is the
    TrainingInput with the proto's snake_case names, as seen on the service."""

    primary: str  # chief | master: the master's type in TF_CONFIG
    tf_config_cluster: dict[str, list[str]]
    cluster_spec_cluster: dict[str, list[str]]
    job: dict[str, Any]
    trial_id: str | None = None
    primary_host: str = ""  # PyTorch's MASTER_ADDR
    workers: int = 0  # PyTorch's WORLD_SIZE is the primary and the workers
    spec_names: dict[str, str] = field(default_factory=dict)  # a contract's CLUSTER_SPEC task types

    def env(self, task_type: str, index: int) -> dict[str, str]:
        trial_key = {"trial": self.trial_id} if self.trial_id else {}
        tf_type = self.primary if task_type == MASTER else task_type
        tf_config = {
            "cluster": self.tf_config_cluster,
            "task": {"type": tf_type, "index": index, **trial_key},
            "job": self.job,
            "environment": "cloud",
        }
        cluster_spec = {
            "cluster": self.cluster_spec_cluster,
            "task": {"type": self.spec_names.get(task_type, task_type), "index": index, **trial_key},
            "job": self.job,
            "environment": "cloud",
        }
        return {
            "TF_CONFIG": json.dumps(tf_config),
            "CLUSTER_SPEC": json.dumps(cluster_spec),
            **pytorch_env(self.primary_host, TF_PORT, self.workers, task_type, index),
        }


@dataclass(frozen=True)
class LaunchPlan:
    job_id: str
    network: NetworkSpec | None  # None: one replica, on the backend's shared network for lone replicas
    containers: tuple[ContainerSpec, ...]
    trial_id: str | None = None  # set when the plan is one trial of a tuning job
    cluster: ClusterConfig | None = None
    # The installation's Cloud Storage endpoint that gs:// reaches in these replicas (the backend
    # starts it if needed and resolves Google's API host names to it); None: no gs:// endpoint.
    storage: StorageEndpoint | None = None

    def environment(self, spec: ContainerSpec) -> dict[str, str]:
        """The replica's whole environment: TF_CONFIG and CLUSTER_SPEC, then its own variables."""
        shared = self.cluster.env(spec.task_type, spec.task_index) if self.cluster else {}
        return {**shared, **spec.env}

    def to_dict(self) -> dict[str, Any]:
        """A printable form (what --dry-run shows): every container with its whole environment,
        TF_CONFIG included, as it will run; env values that look like secrets are hidden."""
        data = dataclasses.asdict(self)
        data.pop("cluster")  # in each container's env below
        for container, spec in zip(data["containers"], self.containers, strict=True):
            container["env"] = {k: mask_value(k, v) for k, v in self.environment(spec).items()}
        return data


# Env names holding any of these words are printed masked (credentials, tokens).
SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "CREDENTIAL")


def mask_value(name: str, value: str, words: tuple[str, ...] = SECRET_WORDS) -> str:
    return "*****" if any(word in name.upper() for word in words) else value


@dataclass(frozen=True)
class Trial:
    """One hyperparameter trial: every replica of the job, run once more with these values."""

    trial_id: str  # "1", "2", ... as TF_CONFIG's task.trial and CLOUD_ML_TRIAL_ID carry it
    hyperparameters: dict[str, str]  # parameterName -> value, passed as --name=value
    metrics_dir: str | None = None  # host directory for the replicas' metric files (HYPERTUNE_DIR)

    def user_args(self) -> list[str]:
        return [f"--{name}={value}" for name, value in self.hyperparameters.items()]


@dataclass(frozen=True)
class PlanInputs:
    """What planning needs to know about the world, gathered by the caller."""

    runtime_image: str | None  # image for replicas without an imageUri
    package_files: tuple[str, ...] = ()  # basenames in the host package dir, install order
    package_dir: str | None = None  # host directory mounted read-only at PACKAGES_DIR
    wheelhouse: str | None = None  # subdirectory of package_dir holding the packages' dependencies
    job_dir_mount: str | None = None  # local job dir (host path), mounted read-write at the same path
    user: str = "65534:65534"
    host_cpus: int = 2
    host_memory_bytes: int = 8 << 30
    limit_resources: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. STORAGE_EMULATOR_HOST
    extra_mounts: tuple[Mount, ...] = ()  # e.g. credentials, read-only
    installation: str = ""  # Settings.installation_id: labels and names scope the job to one aiptrain home
    pids_limit: int | None = None  # processes and threads per replica (Settings); None or 0: no limit
    # AIPTRAIN_GCS=local: where gs:// paths are kept on this machine; gs:// URLs in the user's
    # args become paths there, and their buckets' directories are mounted read-write.
    gcs_root: str | None = None
    # The packages installed once for the job's image (aiptrain.installs): a host user base
    # mounted read-only at USER_BASE, so replicas start the trainer at once.
    installed: str | None = None
    # gs:// kept on this machine, served to replicas by the installation's storage endpoint:
    # replicas see gs:// URLs unchanged, as on the service (aiptrain.storage.endpoint). Without
    # one (a backend that cannot run it), gs:// URLs in args become paths under gcs_root.
    gcs_endpoint: StorageEndpoint | None = None
    # The job's project's credential its replicas carry to that endpoint (aiptrain.storage.projects).
    storage_credential: ProjectCredential | None = None
    # What a job of another dialect tells its replicas where AI Platform's differs (Vertex AI's).
    contract: ReplicaContract | None = None
    # How the controller runs the job where that dialect's rules differ (lifecycle.RunRules).
    rules: RunRules | None = None


def inputs_to_dict(inputs: PlanInputs) -> dict[str, Any]:
    """PlanInputs as JSON-ready data: the controller plans the job (a study its trials) from it."""
    return dataclasses.asdict(inputs)


def inputs_from_dict(data: dict[str, Any]) -> PlanInputs:
    return PlanInputs(
        **{
            **data,
            "package_files": tuple(data.get("package_files", ())),
            "extra_mounts": tuple(Mount(**mount) for mount in data.get("extra_mounts", ())),
            "gcs_endpoint": _endpoint_from_dict(data.get("gcs_endpoint")),
            "storage_credential": ProjectCredential(**data["storage_credential"])
            if data.get("storage_credential") else None,
            "contract": contract_from_dict(data.get("contract")),
            "rules": RunRules(**data["rules"]) if data.get("rules") else None,
        }
    )


def _endpoint_from_dict(data: dict[str, Any] | None) -> StorageEndpoint | None:
    return StorageEndpoint(**{**data, "images": tuple(data["images"])}) if data else None


def dns_label(text: str) -> str:
    """A DNS-safe form of a job ID: gRPC and DNS resolvers dislike `_` and capitals."""
    return text.lower().replace("_", "-")


def primary_task_type(job: Job) -> str:
    """`chief` or `master` in TF_CONFIG. Runtime versions 2.1 and later use `chief` (TF2's
    strategies do not know `master`); custom containers use `chief` only when asked to
    with useChiefInTfConfig, as on AI Platform."""
    ti = job.training_input
    if ti.uses_custom_container:
        return "chief" if ti.use_chief_in_tf_config else MASTER
    if ti.use_chief_in_tf_config:
        return "chief"
    major, _, minor = (ti.runtime_version or "2.11").partition(".")
    try:
        return "chief" if (int(major), int(minor or 0)) >= (2, 1) else MASTER
    except ValueError:
        return "chief"


def _cluster(hostnames: list[str], replicas: list[Replica], primary: str,
             include_evaluators: bool) -> dict[str, list[str]]:
    cluster: dict[str, list[str]] = {}
    names = {MASTER: primary, WORKER: WORKER, PS: PS, EVALUATOR: EVALUATOR}
    for host, replica in zip(hostnames, replicas, strict=True):
        if replica.task_type == EVALUATOR and not include_evaluators:
            continue
        cluster.setdefault(names[replica.task_type], []).append(f"{host}:{TF_PORT}")
    return cluster


def base_name(job_id: str, trial: Trial | None = None) -> str:
    """What engine-side names start with: the job ID, and the trial for a tuning job's trial."""
    return f"{job_id}-trial-{trial.trial_id}" if trial else job_id


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def hostname(base: str, replica: Replica) -> str:
    """`<base>-<type>-<index>` in DNS form. A base too long for one DNS label is cut and
    followed by a digest of the whole base: short, the same on every plan, and distinct for
    distinct bases (job IDs of up to 128 characters are valid)."""
    suffix = f"-{replica.task_type}-{replica.index}"
    return dns_label_within(base, HOSTNAME_MAX - len(suffix)) + suffix


def dns_label_within(base: str, room: int) -> str:
    """`base` in DNS form in at most `room` characters: cut and followed by a digest of the
    whole base when longer (see hostname)."""
    label = dns_label(base)
    if len(label) > room:
        keep = room - DIGEST_CHARS - 1
        label = f"{label[:keep].rstrip('-')}-{_digest(base)}"
    return label


def engine_name(name: str, installation: str) -> str:
    """A container or network name on the shared engine: readable, then the installation, so
    two aiptrain homes can both run a job `x`."""
    return f"{name}-{installation[:DIGEST_CHARS]}" if installation else name


def cluster_config(job: Job, replicas: list[Replica], hostnames: list[str],
                   trial: Trial | None = None, contract: ReplicaContract | None = None) -> ClusterConfig:
    """TF_CONFIG's and CLUSTER_SPEC's shared parts, as AI Platform sets them (see ClusterConfig),
    or as a contract names them."""
    primary = primary_task_type(job)
    spec_cluster = _cluster(hostnames, replicas, MASTER, include_evaluators=True)
    spec_names = contract.cluster_spec_names if contract else {}
    job_seen = job.training_input.model_dump(mode="json", exclude_none=True)
    if contract and contract.cluster_spec_job is not None:
        job_seen = contract.cluster_spec_job
    return ClusterConfig(
        primary=primary,
        tf_config_cluster=_cluster(hostnames, replicas, primary, include_evaluators=False),
        cluster_spec_cluster={spec_names.get(name, name): hosts for name, hosts in spec_cluster.items()},
        job=job_seen,
        spec_names=spec_names,
        trial_id=trial.trial_id if trial else None,
        primary_host=hostnames[next(i for i, r in enumerate(replicas) if r.task_type == MASTER)],
        workers=sum(1 for r in replicas if r.task_type == WORKER),
    )


def pytorch_env(primary_host: str, primary_port: int, workers: int, task_type: str, index: int) -> dict[str, str]:
    """torch.distributed's env:// variables, derived from the same cluster as TF_CONFIG (as
    Vertex AI sets them): the primary is rank 0 and worker i is rank i + 1, so a plain
    `init_process_group()` works. Parameter servers and evaluators are not in the process
    group: they see where it is and how big, but get no RANK, so a trainer that calls
    init_process_group() there fails at once instead of joining a group it does not belong to."""
    env = {"MASTER_ADDR": primary_host, "MASTER_PORT": str(primary_port), "WORLD_SIZE": str(1 + workers)}
    if task_type == MASTER:
        env["RANK"] = "0"
    elif task_type == WORKER:
        env["RANK"] = str(index + 1)
    return env


def trial_job_dir(job_dir: str, trial: Trial | None) -> str:
    """A trial's --job-dir: the job dir scoped by the trial ID, so trials never clobber each other."""
    return f"{job_dir.rstrip('/')}/{trial.trial_id}" if trial else job_dir


def installs_packages(job: Job, inputs: PlanInputs) -> bool:
    """Whether the replicas install the staged packages and run `python3 -m MODULE`: always in a
    runtime image, and in a custom image given together with a module and packages (as with
    AI Platform's pre-built framework containers)."""
    ti = job.training_input
    return not ti.uses_custom_container or bool(ti.python_module and inputs.package_files)


def _image_and_command(
    job: Job, replica: Replica, inputs: PlanInputs, trial: Trial | None
) -> tuple[str, list[str] | None, list[str]]:
    """(image, entrypoint, command) of one replica; an entrypoint of None keeps the image's ENTRYPOINT.
    A trial's values come after the user's args, and `--job-dir` last, as the service appends it."""
    ti = job.training_input
    hyperparameters = trial.user_args() if trial else []
    job_dir = ["--job-dir", trial_job_dir(ti.job_dir, trial)] if ti.job_dir else []
    contract = inputs.contract
    args = contract.task_args.get(replica.task_type, ti.args) if contract else ti.args
    user_args = [*(args or []), *hyperparameters, *job_dir]
    if not ti.uses_custom_container:
        return inputs.runtime_image or "", None, ["sh", "-c", BOOTSTRAP, ti.python_module or "", *user_args]
    if installs_packages(job, inputs):
        # The image's ENTRYPOINT gives way to the bootstrap, as the service's pre-built containers run it.
        return _replica_image(ti, replica.config), ["sh", "-c", BOOTSTRAP], [ti.python_module or "", *user_args]
    return _custom_container(ti, replica.config, user_args, hyperparameters)


def _custom_container(
    ti: TrainingInput, config: ReplicaConfig | None, user_args: list[str], hyperparameters: list[str]
) -> tuple[str, list[str] | None, list[str]]:
    """A custom container runs as `docker run IMAGE ARGS...` would: the user's args (and
    `--job-dir`) replace the image's CMD, so they reach its ENTRYPOINT. containerCommand and
    containerArgs, when set, are the whole command line instead, with Docker's rules
    (containerCommand replaces ENTRYPOINT and runs without the image's CMD; containerArgs
    alone replaces CMD), so nothing is added to them. Only the image defaults to the
    master's: on AI Platform the other ReplicaConfig fields are per replica type. A trial's
    values still follow containerArgs: they are how the program learns them."""
    image = _replica_image(ti, config)
    if config and (config.container_command or config.container_args):
        # Empty lists are unset fields in the proto, hence `or None` rather than an empty ENTRYPOINT.
        return image, config.container_command or None, [*(config.container_args or []), *hyperparameters]
    return image, None, user_args


def _replica_image(ti: TrainingInput, config: ReplicaConfig | None) -> str:
    """A replica type's imageUri, defaulting to the master's as on the service."""
    master = ti.master_config.image_uri if ti.master_config else None
    return (config.image_uri if config else None) or master or ""


def _totals(replicas: list[Replica]) -> tuple[int, float]:
    """The job's vCPUs and memory bytes, summed once per plan."""
    return sum(r.machine.vcpus for r in replicas), sum(r.machine.memory_gb for r in replicas) * (1 << 30)


def _limits(replica: Replica, totals: tuple[int, float], inputs: PlanInputs) -> tuple[int | None, int | None, int]:
    """(nano_cpus, memory_bytes, shm_bytes). With limit_resources, each replica gets its machine
    type's share scaled so that the whole job fits on this host."""
    machine_memory = int(replica.machine.memory_gb * (1 << 30))
    generous_shm = min(machine_memory, inputs.host_memory_bytes // 2)
    if not inputs.limit_resources:
        return None, None, generous_shm
    total_cpus, total_memory = totals
    cpu_scale = min(1.0, inputs.host_cpus / total_cpus)
    memory_scale = min(1.0, inputs.host_memory_bytes / total_memory)
    memory = int(machine_memory * memory_scale)
    return int(replica.machine.vcpus * cpu_scale * 1e9), memory, min(memory, generous_shm)


def _trial_env(trial: Trial | None, replica: Replica) -> dict[str, str]:
    """What cloudml-hypertune reads in a trial's replica: its trial ID and where to write the metric."""
    if trial is None:
        return {}
    return {
        "CLOUD_ML_TRIAL_ID": trial.trial_id,
        "CLOUD_ML_HP_METRIC_FILE": f"{HYPERTUNE_DIR}/{metric_file_name(replica.task_name)}",
    }


def _mounts(job: Job, inputs: PlanInputs, trial: Trial | None) -> tuple[Mount, ...]:
    mounts: list[Mount] = []
    if inputs.package_dir:
        mounts.append(Mount(inputs.package_dir, PACKAGES_DIR, read_only=True))
    if inputs.job_dir_mount:
        mounts.append(Mount(inputs.job_dir_mount, inputs.job_dir_mount, read_only=False))
    if inputs.installed:
        mounts.append(Mount(inputs.installed, USER_BASE, read_only=True))
    if inputs.gcs_endpoint:  # the CA replicas trust, and gsutil / gcloud storage
        mounts.extend(Mount(source, target) for source, target in inputs.gcs_endpoint.replica_mounts())
        if inputs.storage_credential:
            mounts.append(Mount(inputs.storage_credential.file, REPLICA_CREDENTIALS))
    elif inputs.gcs_root:  # buckets the user's args name: their data in, their outputs out
        for bucket in gcs_buckets_in(job.training_input.args):
            path = f"{inputs.gcs_root.rstrip('/')}/{bucket}"
            mounts.append(Mount(path, path, read_only=False))
    if trial and trial.metrics_dir:
        mounts.append(Mount(trial.metrics_dir, HYPERTUNE_DIR, read_only=False))
    if inputs.contract:
        mounts.extend(inputs.contract.bucket_mounts(inputs.gcs_root))
    mounts.extend(inputs.extra_mounts)
    return tuple(mounts)


# A gs:// URL inside a user arg: a whole token, `--flag=gs://b/x`, or one of a comma list.
GCS_URL = re.compile(r"(?<![\w+.-])gs://([a-z0-9][a-z0-9._-]*[a-z0-9])(?:/[^\s,;]*)?")


def gcs_urls_in(args: list[str] | None) -> list[str]:
    return [match.group(0) for arg in args or () for match in GCS_URL.finditer(arg)]


def gcs_buckets_in(args: list[str] | None) -> list[str]:
    return sorted({match.group(1) for arg in args or () for match in GCS_URL.finditer(arg)})


def as_replicas_see_it(job: Job, inputs: PlanInputs) -> Job:
    """The job that replicas are told about (--job-dir, args, TF_CONFIG's job): with gs:// kept
    on this machine (AIPTRAIN_GCS=local), a gs:// job dir is its local directory there and
    gs:// URLs in the args are local paths; the record keeps the URLs."""
    ti = job.training_input
    moves_job_dir = bool(inputs.job_dir_mount) and ti.job_dir not in (None, inputs.job_dir_mount)
    moves_args = bool(inputs.gcs_root) and not inputs.gcs_endpoint and bool(gcs_buckets_in(ti.args))
    if not (moves_job_dir or moves_args):
        return job
    seen = job.model_copy(deep=True)
    if moves_job_dir:
        seen.training_input.job_dir = inputs.job_dir_mount
    if moves_args:
        root = (inputs.gcs_root or "").rstrip("/")
        seen.training_input.args = [GCS_URL.sub(lambda m: root + "/" + m.group(0)[len("gs://"):], arg)
                                    for arg in ti.args or []]
    return seen


def replica_user() -> str:
    """Replicas run as the calling user, or as nobody when that is root."""
    uid, gid = os.getuid(), os.getgid()
    return NOBODY if uid == 0 else f"{uid}:{gid}"


def storage_endpoint_for(settings: Settings, gcs_root: Path, runtime_image: str | None = None) -> StorageEndpoint:
    """The installation's storage endpoint (one per home), run by the first image the engine
    has: the job's runtime image (present: the job runs in it), then the base every runtime is built on."""
    images = tuple(dict.fromkeys(filter(None, (runtime_image, settings.base_image))))
    return StorageEndpoint(gcs_root=str(gcs_root), tls_dir=str(settings.home / TLS_DIR_NAME), user=replica_user(),
                           installation=settings.installation_id, images=images)


def install_env(package_paths: str, wheelhouse: str | None) -> dict[str, str]:
    """What INSTALL reads: the packages, in install order, and the wheelhouse of their dependencies."""
    env = {"AIPTRAIN_PACKAGES": package_paths}
    if wheelhouse:
        env["AIPTRAIN_WHEELHOUSE"] = f"{PACKAGES_DIR}/{wheelhouse}"
    return env


def install_container(image: str, package_dir: str, package_files: tuple[str, ...], wheelhouse: str | None,
                      target: str, user: str, labels: dict[str, str] | None = None) -> ContainerSpec:
    """The one short container that installs a job's packages for its image into `target`
    (a host directory), which every replica then mounts read-only at USER_BASE: the same
    `pip install --user` a replica would run, once. No network: everything is staged."""
    package_paths = " ".join(f"{PACKAGES_DIR}/{name}" for name in package_files)
    return ContainerSpec(
        name="", hostname="", task_name="install", task_type="install", task_index=0,
        image=image, entrypoint=None, command=["sh", "-c", INSTALL],
        env={"HOME": "/tmp", "PYTHONUSERBASE": INSTALL_TARGET, **install_env(package_paths, wheelhouse)},
        mounts=(Mount(package_dir, PACKAGES_DIR, read_only=True), Mount(target, INSTALL_TARGET, read_only=False)),
        labels=dict(labels or {}), user=user,
    )


# A lone replica's hostname, the same in every job: its network may be made ready before its
# job is known (the docker backend's network holders), and no neighbour needs to tell it apart.
LONE_HOSTNAME = "master-replica-0"


def own_network(replicas: list[Replica]) -> bool:
    """Replicas that must find each other get a bridge network of their own. A lone replica
    resolves only its own hostname, which the engine writes into its /etc/hosts on any network:
    it joins the installation's network for lone replicas, on which replicas cannot reach each
    other (the docker backend's SOLO network), and its job neither creates nor removes a network
    (on a small machine that was a third of a BASIC job's start-up and teardown)."""
    return len(replicas) > 1


def plan(job: Job, replicas: list[Replica], inputs: PlanInputs, trial: Trial | None = None,
         key: str | None = None) -> LaunchPlan:
    """The launch plan of the job, or of one hyperparameter trial of it (its own network,
    names carrying the trial ID, the trial's values and job dir). `key`: the job's key in the
    installation (aiptrain.jobkeys; default: its ID), which engine names and labels carry;
    hostnames, which only the job's own replicas see, come from its ID."""
    mounts = _mounts(job, inputs, trial)
    job = as_replicas_see_it(job, inputs)
    job_id = key or job.job_id
    base = base_name(job_id, trial)
    owner = {LABEL_INSTALLATION: inputs.installation} if inputs.installation else {}
    scope = {LABEL_JOB: job_id, **owner, **({LABEL_TRIAL: trial.trial_id} if trial else {})}
    network = NetworkSpec(engine_name(f"aiptrain-{base}", inputs.installation), scope, len(replicas)) \
        if own_network(replicas) else None
    package_paths = " ".join(f"{PACKAGES_DIR}/{name}" for name in inputs.package_files)
    host_base = base_name(job.job_id, trial)
    hostnames = [hostname(host_base, replica) for replica in replicas] if network else [LONE_HOSTNAME]
    totals = _totals(replicas)
    installs = installs_packages(job, inputs)

    containers = []
    for replica, host in zip(replicas, hostnames, strict=True):
        image, entrypoint, command = _image_and_command(job, replica, inputs, trial)
        nano_cpus, memory, shm = _limits(replica, totals, inputs)
        env = {
            **_trial_env(trial, replica),
            "PYTHONUNBUFFERED": "1",
            "HOME": "/tmp",
            "PYTHONUSERBASE": USER_BASE,
            **inputs.extra_env,
        }
        if package_paths and installs and not inputs.installed:
            env.update(install_env(package_paths, inputs.wheelhouse))
        if inputs.gcs_endpoint:
            # A custom container keeps its own PATH: only runtime images get the tools on theirs.
            env.update({k: v for k, v in replica_env(inputs.storage_credential).items() if k != "PATH" or installs})
        if inputs.contract:
            env.update(inputs.contract.replica_env(replica.task_type, trial))
        containers.append(
            ContainerSpec(
                name=engine_name(f"{base}-{replica.task_type}-{replica.index}", inputs.installation),
                hostname=host,
                task_name=replica.task_name,
                task_type=replica.task_type,
                task_index=replica.index,
                image=image,
                entrypoint=entrypoint,
                command=command,
                env=env,
                mounts=mounts,
                labels={
                    **scope,
                    LABEL_TASK: replica.task_name,
                    LABEL_TASK_TYPE: replica.task_type,
                    LABEL_TASK_INDEX: str(replica.index),
                },
                user=inputs.user,
                gpus=replica.accelerator.count if replica.accelerator else 0,
                nano_cpus=nano_cpus,
                memory_bytes=memory,
                shm_bytes=shm,
                pids_limit=inputs.pids_limit or None,
                working_dir="/tmp" if installs else None,
            )
        )
    return LaunchPlan(job_id, network, tuple(containers), trial.trial_id if trial else None,
                      cluster_config(job, replicas, hostnames, trial, inputs.contract), inputs.gcs_endpoint)


# -- what submit leaves for the job's driver ----------------------------------------------------


def save_plan_inputs(path: Path, inputs: PlanInputs) -> None:
    """Write the inputs to `path` (the job's JobPaths.plan_inputs), making its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(inputs_to_dict(inputs)))


def load_plan_inputs(path: Path) -> PlanInputs:
    return inputs_from_dict(json.loads(path.read_text()))


def save_contract(path: Path, contract: ReplicaContract) -> None:
    """Keep a job's contract at `path` (its JobPaths.contract), making its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(contract)))


def load_contract(path: Path) -> ReplicaContract | None:
    """The contract kept at `path`; None for a job that has none (AI Platform's)."""
    try:
        return contract_from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
