"""A Vertex AI job as the ml v1 job the controller runs, and the replica contract Vertex gives
its replicas (planning.ReplicaContract). Pure: no I/O.

Worker pools 0-3 are the primary, the workers, the parameter servers (or Reduction Server) and
the evaluators (cloud.google.com/vertex-ai/docs/training/distributed-training): AI Platform's
master, workers, parameter servers and evaluators, with the primary called `chief` in
TF_CONFIG. CLUSTER_SPEC names them `workerpoolN` and carries the job spec as a JSON string;
`baseOutputDirectory` becomes AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR
(per trial in a study); the job's buckets appear under /gcs as Cloud Storage FUSE shows them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from aiptrain.errors import ValidationError
from aiptrain.lifecycle import RunRules
from aiptrain.model import AcceleratorConfig, Job, ReplicaConfig, ScaleTier, Scheduling, TrainingInput
from aiptrain.planning import ReplicaContract
from aiptrain.storage import is_gcs
from aiptrain.topology import EVALUATOR, MASTER, PS, WORKER
from aiptrain.validation import parse_duration_seconds
from aiptrain.vertex.images import executor
from aiptrain.vertex.resources import CustomJobSpec, EnvVar, Strategy, WorkerPoolSpec
from aiptrain.vertex.scripts import offline_env

POOL_TASK_TYPES = (MASTER, WORKER, PS, EVALUATOR)  # worker pool N runs AI Platform's task type N
SPEC_NAMES = {task_type: f"workerpool{index}" for index, task_type in enumerate(POOL_TASK_TYPES)}
# What AI Platform's replicas were called in task names, log lines and errors -> Vertex's pools.
REPLICA_NAMES = {"master-replica": "workerpool0", "worker-replica": "workerpool1", "ps-replica": "workerpool2",
                 "evaluator-replica": "workerpool3"}
OUTPUT_ENV = {"AIP_MODEL_DIR": "model/", "AIP_CHECKPOINT_DIR": "checkpoints/", "AIP_TENSORBOARD_LOG_DIR": "logs/"}
BUCKETS_DIR = "/gcs"
DEFAULT_MACHINE_TYPE = "n1-standard-4"
MAX_POOLS = len(POOL_TASK_TYPES)
# scheduling.maxWaitDuration of a FLEX_START job when none is given (custom_job.proto).
DEFAULT_FLEX_START_WAIT = "86400s"
WEB_ACCESS_NOTICE = ("NOTE: enableWebAccess: no interactive shell is served here, so the job has no webAccessUris; "
                     "`docker exec -it CONTAINER sh` opens a shell in a replica (`docker ps` names them).")
SPOT_NOTICE = ("NOTE: scheduling.strategy SPOT: nothing preempts replicas on this machine; a replica killed by a "
               "signal (as a preempted one is) is restarted in place, up to the restart budget.")
# The ml v1 job's words for its limits (the controller's messages) -> Vertex AI's.
SCHEDULING_NAMES = {"scheduling.maxRunningTime": "scheduling.timeout",
                    "scheduling.maxWaitTime": "scheduling.maxWaitDuration"}


@dataclass(frozen=True)
class Translation:
    job: Job  # the ml v1 job the controller runs
    contract: ReplicaContract
    notices: tuple[str, ...] = ()
    rules: RunRules = RunRules(limits_fail=True)  # how the controller runs it (Vertex AI's scheduling)


def translate(job_id: str, numeric_id: str, spec: CustomJobSpec, labels: dict[str, str] | None = None,
              where: str = "jobSpec", mapped_runtimes: dict[str, dict] | None = None) -> Translation:
    """The ml v1 job `job_id` that runs `spec`, and its replicas' contract; ValidationError (one
    line naming the field) for a spec the service refuses or aiptrain cannot run."""
    pools = _pools(spec, where)
    kinds = {"container" if pool.container_spec else "package" for pool in pools.values()}
    if len(kinds) > 1:
        raise ValidationError(f"{where}.workerPoolSpecs mix containerSpec and pythonPackageSpec: aiptrain runs one "
                              "kind per job; give every pool a containerSpec, or every pool a pythonPackageSpec.")
    ti = TrainingInput(scale_tier=ScaleTier.CUSTOM, use_chief_in_tf_config=True)
    task_env: dict[str, dict[str, str]] = {}
    task_args: dict[str, list[str]] = {}
    notices: list[str] = []
    for task_type, pool in pools.items():
        _set_machine(ti, task_type, pool)
        if pool.container_spec:
            container = pool.container_spec
            config = _replica_config(ti, task_type)
            config.image_uri = container.image_uri
            config.container_command = container.command or None
            config.container_args = container.args or None
            task_env[task_type] = {**offline_env(container), **_env(container.env)}
        else:
            note = _package(ti, task_type, pool, task_args, where, mapped_runtimes)
            if note and note not in notices:
                notices.append(note)
            task_env[task_type] = _env(pool.python_package_spec.env if pool.python_package_spec else None)
    rules = _schedule(ti, spec, where, notices)
    ti.enable_web_access = spec.enable_web_access or None
    if spec.enable_web_access:
        notices.append(WEB_ACCESS_NOTICE)
    output_dir = spec.base_output_directory.output_uri_prefix if spec.base_output_directory else None
    if output_dir and not is_gcs(output_dir):
        raise ValidationError(f"{where}.baseOutputDirectory.outputUriPrefix [{output_dir}] is not a gs:// URI: "
                              "name a Cloud Storage prefix, e.g. gs://BUCKET/output.")
    contract = ReplicaContract(
        cluster_spec_names=dict(SPEC_NAMES),
        cluster_spec_job=json.dumps(spec.model_dump(mode="json", exclude_none=True)),
        env={"CLOUD_ML_JOB_ID": numeric_id},
        task_env={task: env for task, env in task_env.items() if env},
        task_args=task_args,
        output_dir=output_dir,
        output_env=dict(OUTPUT_ENV) if output_dir else {},
        bucket_mount_dir=BUCKETS_DIR,
    )
    return Translation(Job(job_id=job_id, labels=labels or None, training_input=ti), contract, tuple(notices),
                       rules)


def _pools(spec: CustomJobSpec, where: str) -> dict[str, WorkerPoolSpec]:
    """The pools that run replicas, by task type; empty placeholder pools (`{}`) are skipped."""
    given = spec.worker_pool_specs or []
    if not given or given[0].is_placeholder:
        raise ValidationError(f"{where}.workerPoolSpecs[0] is required: the primary pool, with one replica and a "
                              "containerSpec or pythonPackageSpec.")
    if len(given) > MAX_POOLS:
        raise ValidationError(f"{where}.workerPoolSpecs holds {len(given)} pools; Vertex AI takes at most "
                              f"{MAX_POOLS} (primary, workers, parameter servers, evaluators).")
    pools = {}
    for index, pool in enumerate(given):
        field = f"{where}.workerPoolSpecs[{index}]"
        if pool.is_placeholder:
            continue
        if (pool.container_spec is None) == (pool.python_package_spec is None):
            raise ValidationError(f"{field} needs exactly one of containerSpec and pythonPackageSpec.")
        count = 1 if pool.replica_count is None else pool.replica_count
        if index == 0 and count != 1:
            raise ValidationError(f"{field}.replicaCount must be 1: the primary pool runs one replica; put the "
                                  "others in workerPoolSpecs[1].")
        if count < 1:
            raise ValidationError(f"{field}.replicaCount must be at least 1 (leave the pool empty, {{}}, for none).")
        if pool.container_spec and not pool.container_spec.image_uri:
            raise ValidationError(f"{field}.containerSpec.imageUri is required.")
        pools[POOL_TASK_TYPES[index]] = pool.model_copy(update={"replica_count": count})
    return pools


def _set_machine(ti: TrainingInput, task_type: str, pool: WorkerPoolSpec) -> None:
    machine = pool.machine_spec.machine_type if pool.machine_spec and pool.machine_spec.machine_type else None
    machine = machine or DEFAULT_MACHINE_TYPE
    if task_type == MASTER:
        ti.master_type = machine
    elif task_type == WORKER:
        ti.worker_type, ti.worker_count = machine, pool.replica_count
    elif task_type == PS:
        ti.parameter_server_type, ti.parameter_server_count = machine, pool.replica_count
    else:
        ti.evaluator_type, ti.evaluator_count = machine, pool.replica_count
    spec = pool.machine_spec
    if spec and spec.accelerator_type and spec.accelerator_type.value and spec.accelerator_count:
        _replica_config(ti, task_type).accelerator_config = AcceleratorConfig(
            count=spec.accelerator_count, type=spec.accelerator_type.name)


def _replica_config(ti: TrainingInput, task_type: str) -> ReplicaConfig:
    field = {MASTER: "master_config", WORKER: "worker_config", PS: "parameter_server_config",
             EVALUATOR: "evaluator_config"}[task_type]
    config = getattr(ti, field)
    if config is None:
        config = ReplicaConfig()
        setattr(ti, field, config)
    return config


def _package(ti: TrainingInput, task_type: str, pool: WorkerPoolSpec, task_args: dict[str, list[str]],
             where: str, mapped: dict[str, dict] | None) -> str | None:
    """One pool's pythonPackageSpec: the primary's sets the job's runtime, packages and module;
    another pool must run the same ones (one runtime image per job here), with its own args."""
    package = pool.python_package_spec
    assert package is not None
    field = f"{where}.workerPoolSpecs[{POOL_TASK_TYPES.index(task_type)}].pythonPackageSpec"
    if not package.executor_image_uri:
        raise ValidationError(f"{field}.executorImageUri is required: a prebuilt training image such as "
                              "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-11.py310:latest.")
    if not package.package_uris:
        raise ValidationError(f"{field}.packageUris is required: the gs:// URIs of the trainer's packages.")
    if not package.python_module:
        raise ValidationError(f"{field}.pythonModule is required, e.g. trainer.task.")
    try:
        found = executor(package.executor_image_uri, mapped)
    except ValidationError as exc:  # its words name the field; the path to it is ours
        raise ValidationError(f"{field}.{exc}") from None
    if task_type == MASTER:
        ti.runtime_version, ti.package_uris, ti.python_module = found.runtime_version, package.package_uris, \
            package.python_module
        ti.args = package.args or None
        return found.note
    if (found.runtime_version, package.package_uris, package.python_module) != (
            ti.runtime_version, ti.package_uris, ti.python_module):
        raise ValidationError(f"{field} differs from workerPoolSpecs[0]'s executorImageUri, packageUris or "
                              "pythonModule: aiptrain runs every pool of a job from the same ones; give each pool "
                              "its own args instead.")
    if (package.args or None) != ti.args:
        task_args[task_type] = list(package.args or [])
    return found.note


def _env(variables: list[EnvVar] | None) -> dict[str, str]:
    return {variable.name: variable.value for variable in variables or ()}


def _schedule(ti: TrainingInput, spec: CustomJobSpec, where: str, notices: list[str]) -> RunRules:
    """`scheduling` as the ml v1 job's limits and the controller's rules (lifecycle.RunRules):
    - `timeout` is maxRunningTime; past it (or past a FLEX_START job's wait) the job FAILS, where
      AI Platform cancelled it;
    - `restartJobOnWorkerRestart`: a replica restarted restarts every replica of the job;
      `disableRetries`: no replica is restarted (and it overrides the former, as the proto says);
    - SPOT runs as STANDARD (nothing preempts a replica here; one killed by a signal, as a
      preempted one is, is restarted in place, as any is);
    - FLEX_START queues the job for at most `maxWaitDuration` (default 24 hours, `0s` forever)
      through the ml v1 maxWaitTime; without FLEX_START the service ignores maxWaitDuration."""
    scheduling = spec.scheduling
    if scheduling is None:
        return RunRules(limits_fail=True)
    field = f"{where}.scheduling"
    timeout = scheduling.timeout
    if timeout:
        parse_duration_seconds(timeout, f"{field}.timeout")
    max_wait = None
    if scheduling.strategy is Strategy.FLEX_START:
        max_wait = scheduling.max_wait_duration or DEFAULT_FLEX_START_WAIT
        if not parse_duration_seconds(max_wait, f"{field}.maxWaitDuration"):
            max_wait = None  # 0: wait for as long as it takes
    elif scheduling.strategy is Strategy.SPOT:
        notices.append(SPOT_NOTICE)
    if timeout or max_wait:
        ti.scheduling = Scheduling(max_running_time=timeout or None, max_wait_time=max_wait)
    if scheduling.disable_retries:
        return RunRules(max_restarts=0, limits_fail=True)
    return RunRules(restart_together=bool(scheduling.restart_job_on_worker_restart), limits_fail=True)


def vertex_task_name(task_name: str) -> str:
    """`master-replica-0` (AI Platform's) -> `workerpool0-0` (Vertex's)."""
    for ours, theirs in REPLICA_NAMES.items():
        if task_name.startswith(ours + "-"):
            return theirs + task_name[len(ours):]
    return task_name


# How ml v1 messages name a replica: "The replica master 0 exited ...", or by its task name.
_REPLICA_IN_MESSAGE = re.compile(r"\breplica (master|worker|ps|evaluator) (\d+)\b|\b(?:master|worker|ps|evaluator)-replica-\d+\b")


def vertex_message(text: str) -> str:
    """An error message of the ml v1 job in Vertex's words: its replicas by their pool names
    ("The replica workerpool0-0 exited with a non-zero status of 1."), its limits by the scheduling
    fields that set them."""
    def named(match: re.Match) -> str:
        if match.group(1):
            pool = SPEC_NAMES[match.group(1)]
            return f"replica {pool}-{match.group(2)}"
        return vertex_task_name(match.group(0))
    text = _REPLICA_IN_MESSAGE.sub(named, text)
    for ours, theirs in SCHEDULING_NAMES.items():
        text = text.replace(ours, theirs)
    return text
