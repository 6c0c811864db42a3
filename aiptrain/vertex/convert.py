"""An AI Platform job as the Vertex AI job it would be, and back: the migration table of
docs/guide/vertex.md, as `aiptrain jobs convert` and `jobs export --format vertex` apply it.
Pure: no I/O.

`to_vertex` turns an ml v1 Job (a job in the store, or a gcloud `--config` merged with submit
flags by aiptrain.config.build_job) into a CustomJob, or a HyperparameterTuningJob when it has
`hyperparameters`, as the REST API and the SDK take them (`Conversion.gcloud_config` is what
`gcloud ai custom-jobs|hp-tuning-jobs create --config` takes). `to_ai_platform` turns a CustomJob,
a CustomJobSpec or a HyperparameterTuningJob into the ml v1 Job that `gcloud ai-platform jobs
submit training --config` takes, through translate.translate (the job aiptrain runs for a Vertex
job). Whatever has no equivalent on the other side becomes one line in `Conversion.notes`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError as PydanticError
from pydantic.alias_generators import to_camel

from aiptrain.config import pydantic_error_line
from aiptrain.errors import ValidationError
from aiptrain.model import (
    Algorithm,
    DiskConfig,
    EncryptionConfig,
    HyperparameterSpec,
    Job,
    ParameterSpec,
    ParameterType,
    ReplicaConfig,
    ScaleTier,
    TrainingInput,
)
from aiptrain.model import ScaleType as MlScaleType
from aiptrain.planning import primary_task_type
from aiptrain.storage import is_gcs
from aiptrain.topology import (
    ACCELERATOR_TYPES,
    CE_FAMILIES,
    EVALUATOR,
    MASTER,
    PS,
    TPU_MACHINE_TYPE,
    WORKER,
    MachineType,
    Replica,
    machine_type,
    replicas_for,
)
from aiptrain.validation import JOB_ID_PATTERN
from aiptrain.vertex import resources as vx
from aiptrain.vertex.images import is_prebuilt, prebuilt_image
from aiptrain.vertex.study import VALUE_SPECS as VALUE_SPEC_FIELDS
from aiptrain.vertex.study import ml_parameter
from aiptrain.vertex.translate import OUTPUT_ENV, POOL_TASK_TYPES, translate

CUSTOM_JOB, TUNING_JOB, ML_JOB = "CustomJob", "HyperparameterTuningJob", "Job"
# What AI Platform called each replica type's fields, for the notes.
TYPE_FIELDS = {MASTER: "masterType", WORKER: "workerType", PS: "parameterServerType", EVALUATOR: "evaluatorType"}
CONFIG_FIELDS = {MASTER: "master_config", WORKER: "worker_config", PS: "parameter_server_config",
                 EVALUATOR: "evaluator_config"}
# The legacy machine types were N1 machines: the family whose memory per vCPU they had.
N1_FAMILIES = {family: ratio for family, (_, ratio) in CE_FAMILIES.items() if family.startswith("n1-")}
TPU_ADVICE = ("on Vertex AI a TPU is a worker pool's machineSpec: set it by hand "
              "(cloud.google.com/vertex-ai/docs/training/configure-compute)")
DEFAULT_STOPPING = {"useElapsedDuration": False}  # enableTrialEarlyStopping: Vertex AI names its rule
# Fields of a CustomJobSpec, WorkerPoolSpec and MachineSpec that have no ml v1 field: each is a note.
SPEC_ONLY = ("persistent_resource_id", "reserved_ip_ranges", "psc_interface_config", "protected_artifact_location_id",
             "tensorboard", "enable_dashboard_access", "experiment", "experiment_run", "models")
POOL_ONLY = ("nfs_mounts", "lustre_mounts")
MACHINE_ONLY = ("gpu_partition_size", "tpu_topology", "reservation_affinity")


@dataclass(frozen=True)
class Conversion:
    kind: str  # CustomJob, HyperparameterTuningJob or (ml v1) Job
    resource: dict[str, Any]  # camelCase, as the REST API takes it
    notes: tuple[str, ...]  # one line per thing with no equivalent
    name: str  # the displayName, or the ml v1 jobId
    region: str | None = None  # trainingInput.region, the Vertex location

    @property
    def gcloud_config(self) -> dict[str, Any]:
        """What gcloud's `create --config` takes: a CustomJob's jobSpec (`gcloud ai custom-jobs`);
        a tuning job (`gcloud ai hp-tuning-jobs`) and an ml v1 job (`gcloud ai-platform jobs
        submit training`) whole."""
        return self.resource.get("jobSpec", {}) if self.kind == CUSTOM_JOB else self.resource


class Notes(list[str]):
    def add(self, line: str) -> None:
        line = line.removeprefix("NOTE: ")
        if line not in self:
            self.append(line)


# -- AI Platform -> Vertex AI -------------------------------------------------------------------

def to_vertex(job: Job, default_runtime: str) -> Conversion:
    """The Vertex AI job that runs what `job` ran; ValidationError (one line) for a job that
    AI Platform would have refused or that names nothing to run."""
    ti = job.training_input
    notes = Notes()
    spec = _job_spec(job, default_runtime, notes)
    name = job.job_id or "job"
    encryption = ({"kmsKeyName": ti.encryption_config.kms_key_name}
                  if ti.encryption_config and ti.encryption_config.kms_key_name else None)
    common: dict[str, Any] = {"display_name": name, "labels": job.labels or None, "encryption_spec": encryption}
    if ti.hyperparameters:
        study, counts = _study(ti.hyperparameters, notes)
        resource: vx.VertexMessage = vx.HyperparameterTuningJob(study_spec=study, trial_job_spec=spec, **counts,
                                                                **common)
        kind = TUNING_JOB
    else:
        resource, kind = vx.CustomJob(job_spec=spec, **common), CUSTOM_JOB
    return Conversion(kind, resource.to_resource(), tuple(notes), name, ti.region)


def _job_spec(job: Job, default_runtime: str, notes: Notes) -> vx.CustomJobSpec:
    ti = job.training_input
    runnable = _without_tpus(ti, notes)
    replicas = replicas_for(runnable)
    _note_cluster_names(job, notes)
    program = _program_kind(ti, notes)
    runtime = ti.runtime_version or default_runtime
    if program == "package":
        _note_runtime(ti, default_runtime, notes)
    pools: list[vx.WorkerPoolSpec] = []
    for task_type in POOL_TASK_TYPES:
        group = [replica for replica in replicas if replica.task_type == task_type]
        pools.append(_pool(runnable, group, program, runtime, notes) if group else vx.WorkerPoolSpec())
    while pools and pools[-1].is_placeholder:
        pools.pop()
    return vx.CustomJobSpec(
        worker_pool_specs=pools,
        scheduling=_scheduling(ti, notes),
        service_account=ti.service_account,
        network=ti.network,
        base_output_directory=_output_directory(ti, notes),
        enable_web_access=ti.enable_web_access or None,
    )


def _without_tpus(ti: TrainingInput, notes: Notes) -> TrainingInput:
    """The training input without its Cloud TPUs (each one a note): what is left has workerPoolSpecs."""
    runnable = ti.model_copy(deep=True)
    if runnable.scale_tier is ScaleTier.BASIC_TPU:
        runnable.scale_tier = ScaleTier.BASIC
        notes.add(f"scaleTier BASIC_TPU: its Cloud TPU is left out, the master kept; {TPU_ADVICE}.")
    for task_type in (WORKER, PS, EVALUATOR):
        prefix = CONFIG_FIELDS[task_type].removesuffix("_config")
        if getattr(runnable, f"{prefix}_type") == TPU_MACHINE_TYPE:
            setattr(runnable, f"{prefix}_type", None)
            setattr(runnable, f"{prefix}_count", None)
            setattr(runnable, CONFIG_FIELDS[task_type], None)
            notes.add(f"{TYPE_FIELDS[task_type]} {TPU_MACHINE_TYPE}: the Cloud TPU workers are left out; {TPU_ADVICE}.")
    for field in CONFIG_FIELDS.values():
        config: ReplicaConfig | None = getattr(runnable, field)
        if config is None:
            continue
        accelerator = config.accelerator_config
        if accelerator and (accelerator.type or "").upper().startswith("TPU"):
            config.accelerator_config = None
            notes.add(f"{to_camel(field)}.acceleratorConfig {accelerator.type}: the TPU is left out; {TPU_ADVICE}.")
        if config.tpu_tf_version:
            config.tpu_tf_version = None
            notes.add(f"{to_camel(field)}.tpuTfVersion has no equivalent: the TPU runtime comes with the TPU machine.")
    return runnable


def _note_cluster_names(job: Job, notes: Notes) -> None:
    ti = job.training_input
    if ti.scale_tier not in (None, ScaleTier.CUSTOM):
        notes.add(f"scaleTier {ti.scale_tier.value} has no equivalent on Vertex AI: its replicas are written out as "
                  "workerPoolSpecs.")
    if ti.use_chief_in_tf_config is not None:
        notes.add("useChiefInTfConfig has no equivalent: Vertex AI always names workerpool0 `chief` in TF_CONFIG.")
    if primary_task_type(job) != "chief":
        notes.add("TF_CONFIG named this job's primary `master`; Vertex AI names it `chief` (CLUSTER_SPEC: "
                  "workerpool0): a trainer that looks for `master` must look for `chief`.")


def _program_kind(ti: TrainingInput, notes: Notes) -> str:
    """container (a custom image) or package (pythonModule and packageUris on an executor image)."""
    has_image = ti.uses_custom_container
    if has_image and not (ti.python_module and ti.package_uris):
        return "container"
    if not ti.python_module:
        raise ValidationError("The job names no program to run: give pythonModule (--module-name) with packageUris "
                              "(--packages), or masterConfig.imageUri (--master-image-uri).")
    if not ti.package_uris:
        notes.add("packageUris is empty: Vertex AI installs the trainer from gs:// packages: add them "
                  "(--packages gs://BUCKET/trainer-0.1.tar.gz).")
    local = [uri for uri in ti.package_uris or () if not is_gcs(uri)]
    if local:
        notes.add(f"packageUris {', '.join(local)} are not gs:// URIs: Vertex AI installs packages from Cloud "
                  "Storage; copy them there and change the URIs.")
    return "package"


def _note_runtime(ti: TrainingInput, default_runtime: str, notes: Notes) -> None:
    if ti.uses_custom_container:
        return
    if not ti.runtime_version:
        notes.add(f"runtimeVersion is not given: aiptrain's default, {default_runtime}, names the executor image.")
    if ti.python_version and ti.python_version != "3.7":
        notes.add(f"pythonVersion {ti.python_version} has no image of its own: Vertex AI's prebuilt images for AI "
                  "Platform's runtime versions run Python 3.7.")


def _pool(ti: TrainingInput, replicas: list[Replica], program: str, runtime: str, notes: Notes) -> vx.WorkerPoolSpec:
    first = replicas[0]
    config = first.config
    disk = config.disk_config if config else None
    spec = vx.WorkerPoolSpec(
        machine_spec=_machine_spec(first, notes),
        replica_count=len(replicas),
        disk_spec=vx.DiskSpec(boot_disk_type=disk.boot_disk_type, boot_disk_size_gb=disk.boot_disk_size_gb)
        if disk and (disk.boot_disk_type or disk.boot_disk_size_gb) else None,
    )
    image = (config.image_uri if config else None) or (ti.master_config.image_uri if ti.master_config else None)
    if program == "container":
        explicit = bool(config and (config.container_command or config.container_args))
        spec.container_spec = vx.ContainerSpec(
            image_uri=image,
            command=(config.container_command if config else None) or None,
            args=(config.container_args if explicit and config else ti.args) or None,
        )
        return spec
    if image and not is_prebuilt(image):
        notes.add(f"executorImageUri {image}: Vertex AI runs Python packages on its prebuilt images only: put the "
                  "package in the image and give it as containerSpec, or pick a prebuilt image.")
    executor = image
    if not executor:
        found = prebuilt_image(runtime, gpu=first.accelerator is not None)
        executor = found.uri
        if found.note:
            notes.add(found.note)
    spec.python_package_spec = vx.PythonPackageSpec(executor_image_uri=executor, package_uris=ti.package_uris or None,
                                                    python_module=ti.python_module, args=ti.args or None)
    return spec


def _machine_spec(replica: Replica, notes: Notes) -> vx.MachineSpec:
    machine = replica.machine
    name = machine.name
    if machine.legacy:
        name = compute_engine_type(machine)
        notes.add(f"{TYPE_FIELDS[replica.task_type]} {machine.name} is a legacy machine type: {name}"
                  + (f" with {machine.gpus} {machine.gpu_type}" if machine.gpus else "")
                  + ", the Compute Engine machine it was.")
    accelerator = replica.accelerator
    if accelerator is None:
        return vx.MachineSpec(machine_type=name)
    return vx.MachineSpec(machine_type=name, accelerator_type=vx.AcceleratorType[accelerator.type],
                          accelerator_count=accelerator.count)


def compute_engine_type(machine: MachineType) -> str:
    """`complex_model_m` -> `n1-highcpu-16`: the N1 machine with a legacy type's vCPUs and memory."""
    for family, gb_per_vcpu in N1_FAMILIES.items():
        if math.isclose(machine.vcpus * gb_per_vcpu, machine.memory_gb, rel_tol=0.01):
            return f"{family}-{machine.vcpus}"
    raise ValueError(f"no N1 machine has the {machine.vcpus} vCPUs and {machine.memory_gb} GB of [{machine.name}]")


def _scheduling(ti: TrainingInput, notes: Notes) -> vx.Scheduling | None:
    given = ti.scheduling
    if given is None:
        return None
    if given.priority is not None:
        notes.add("scheduling.priority has no equivalent on Vertex AI: left out.")
    if given.max_wait_time:
        notes.add("scheduling.maxWaitTime -> strategy FLEX_START with maxWaitDuration: Vertex AI waits that long "
                  "for the machines (Dynamic Workload Scheduler), then fails the job.")
    if not (given.max_running_time or given.max_wait_time):
        return None
    return vx.Scheduling(timeout=given.max_running_time,
                         strategy=vx.Strategy.FLEX_START if given.max_wait_time else None,
                         max_wait_duration=given.max_wait_time)


def _output_directory(ti: TrainingInput, notes: Notes) -> vx.GcsDestination | None:
    if not ti.job_dir:
        return None
    per_trial = " (per trial, DIR/TRIAL_ID/model/ and so on)" if ti.hyperparameters else ""
    variables = f"AIP_MODEL_DIR (DIR/{OUTPUT_ENV['AIP_MODEL_DIR']}), AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR"
    if not is_gcs(ti.job_dir):
        notes.add(f"jobDir {ti.job_dir} is not a gs:// URI, which baseOutputDirectory must be: left out; `--job-dir` "
                  f"is no longer passed as an argument either: the trainer reads {variables}{per_trial}.")
        return None
    notes.add(f"jobDir -> baseOutputDirectory: `--job-dir DIR` is no longer passed as an argument; the trainer reads "
              f"{variables}{per_trial}.")
    return vx.GcsDestination(output_uri_prefix=ti.job_dir)


def _study(hp: HyperparameterSpec, notes: Notes) -> tuple[vx.StudySpec, dict[str, Any]]:
    """hyperparameters -> (studySpec, maxTrialCount/parallelTrialCount/maxFailedTrialCount)."""
    if hp.resume_previous_job_id:
        if not hp.params:
            raise ValidationError(f"hyperparameters.resumePreviousJobId {hp.resume_previous_job_id} without params: "
                                  "Vertex AI cannot resume an AI Platform study; list the params.")
        notes.add(f"hyperparameters.resumePreviousJobId {hp.resume_previous_job_id} has no equivalent: the study "
                  "starts afresh on Vertex AI.")
    study = vx.StudySpec(
        metrics=[vx.MetricSpec(metric_id=hp.metric_tag, goal=vx.GoalType[hp.effective_goal.value])],
        parameters=[_parameter(param) for param in hp.parameters],
        algorithm=None if hp.search is Algorithm.ALGORITHM_UNSPECIFIED else vx.Algorithm[hp.search.value],
        decay_curve_stopping_spec=dict(DEFAULT_STOPPING) if hp.early_stopping else None,
    )
    return study, {"max_trial_count": hp.trials_limit, "parallel_trial_count": hp.parallel_limit,
                   "max_failed_trial_count": hp.max_failed_trials}


def _parameter(param: ParameterSpec) -> vx.ParameterSpec:
    """One parameter of a validated HyperparameterSpec as a studySpec parameter."""
    scale = vx.ScaleType[param.scale.value] if param.scale is not MlScaleType.NONE else None
    spec = vx.ParameterSpec(parameter_id=param.name, scale_type=scale)
    if param.type is ParameterType.DOUBLE:
        spec.double_value_spec = vx.DoubleValueSpec(min_value=param.bounds[0], max_value=param.bounds[1])
    elif param.type is ParameterType.INTEGER:
        spec.integer_value_spec = vx.IntegerValueSpec(min_value=int(param.bounds[0]), max_value=int(param.bounds[1]))
    elif param.type is ParameterType.CATEGORICAL:
        spec.categorical_value_spec = vx.CategoricalValueSpec(values=[str(value) for value in param.choices])
    else:  # DISCRETE, in the order given
        spec.discrete_value_spec = vx.DiscreteValueSpec(values=list(param.discrete_values or ()))
    return spec


# -- Vertex AI -> AI Platform -------------------------------------------------------------------

def to_ai_platform(data: Any, source: str, default_name: str, region: str | None = None,
                   mapped_runtimes: dict[str, dict] | None = None) -> Conversion:
    """The ml v1 Job that runs what a CustomJob, a CustomJobSpec (gcloud's `--config`) or a
    HyperparameterTuningJob runs; ValidationError (one line naming `source` and the field) for
    what the service would refuse or aiptrain cannot run."""
    parsed = _parse_vertex(data, source)
    notes = Notes()
    name: str | None = None
    labels: dict[str, str] | None = None
    encryption: dict[str, Any] | None = None
    spec: vx.CustomJobSpec | None
    if isinstance(parsed, vx.CustomJobSpec):
        spec, where = parsed, "CustomJobSpec"
    elif isinstance(parsed, vx.CustomJob):
        name, labels, encryption, spec, where = (parsed.display_name, parsed.labels, parsed.encryption_spec,
                                                 parsed.job_spec, "jobSpec")
    else:
        name, labels, encryption, spec, where = (parsed.display_name, parsed.labels, parsed.encryption_spec,
                                                 parsed.trial_job_spec, "trialJobSpec")
    if spec is None:
        raise ValidationError(f"{source}: {where} is required: the worker pools to run.")
    job_id = job_id_for(name or default_name)
    if name and job_id != name:
        notes.add(f"displayName {name!r} -> jobId {job_id}: a job ID takes letters, digits and underscores only.")
    try:
        translation = translate(job_id, "0", spec, labels, where=where, mapped_runtimes=mapped_runtimes)
    except ValidationError as exc:
        raise ValidationError(f"{source}: {exc}") from None
    for notice in translation.notices:
        notes.add(notice)
    job = translation.job
    ti = job.training_input
    ti.use_chief_in_tf_config = None  # set below only where the primary would be `master` without it
    if primary_task_type(job) != "chief":
        ti.use_chief_in_tf_config = True
    ti.region = region
    ti.service_account = spec.service_account
    ti.network = spec.network
    _from_output_directory(ti, spec, notes)
    _from_pools(ti, spec, translation.contract, notes)
    _from_scheduling(spec, notes)
    _note_spec_only(spec, notes)
    if encryption and encryption.get("kmsKeyName"):
        ti.encryption_config = EncryptionConfig(kms_key_name=encryption["kmsKeyName"])
    if isinstance(parsed, vx.HyperparameterTuningJob):
        ti.hyperparameters = _hyperparameters(parsed, notes)
    return Conversion(ML_JOB, job.to_resource(), tuple(notes), job_id, region)


def _parse_vertex(data: Any, source: str) -> vx.CustomJob | vx.CustomJobSpec | vx.HyperparameterTuningJob:
    if not isinstance(data, dict):
        raise ValidationError(f"{source} must hold a CustomJob, a CustomJobSpec or a HyperparameterTuningJob (a "
                              "mapping with jobSpec:, workerPoolSpecs: or studySpec:).")
    model: type[vx.CustomJob] | type[vx.CustomJobSpec] | type[vx.HyperparameterTuningJob]
    if "jobSpec" in data or "job_spec" in data:
        kind, model = CUSTOM_JOB, vx.CustomJob
    elif {"studySpec", "trialJobSpec", "study_spec", "trial_job_spec"} & data.keys():
        kind, model = TUNING_JOB, vx.HyperparameterTuningJob
    elif "workerPoolSpecs" in data or "worker_pool_specs" in data:
        kind, model = "CustomJobSpec", vx.CustomJobSpec
    elif "trainingTaskInputs" in data:
        raise ValidationError(f"{source} holds a TrainingPipeline: convert its trainingTaskInputs (a CustomJobSpec) "
                              "instead.")
    else:
        raise ValidationError(f"{source} holds no jobSpec, workerPoolSpecs or studySpec: give a CustomJob, a "
                              "CustomJobSpec (what `gcloud ai custom-jobs create --config` takes) or a "
                              "HyperparameterTuningJob.")
    try:
        return model.model_validate(data)
    except PydanticError as exc:
        raise ValidationError(pydantic_error_line(exc, f"Invalid {kind} in {source}")) from None


def job_id_for(name: str) -> str:
    """A displayName as a job ID: letters, digits and underscores, starting with a letter."""
    text = re.sub(r"[^A-Za-z0-9_]+", "_", name.strip()).strip("_") or "job"
    if not text[0].isascii() or not text[0].isalpha():
        text = f"job_{text}"
    text = text[:128]
    assert JOB_ID_PATTERN.fullmatch(text)
    return text


def _from_output_directory(ti: TrainingInput, spec: vx.CustomJobSpec, notes: Notes) -> None:
    output = spec.base_output_directory.output_uri_prefix if spec.base_output_directory else None
    if not output:
        return
    ti.job_dir = output
    notes.add(f"baseOutputDirectory -> jobDir: the trainer gets `--job-dir {output}` instead of AIP_MODEL_DIR "
              f"({output.rstrip('/')}/{OUTPUT_ENV['AIP_MODEL_DIR']}), AIP_CHECKPOINT_DIR and AIP_TENSORBOARD_LOG_DIR.")


def _from_pools(ti: TrainingInput, spec: vx.CustomJobSpec, contract: Any, notes: Notes) -> None:
    """What translate leaves in the replica contract or drops, per pool: env, args, disks, machines."""
    for index, pool in enumerate(spec.worker_pool_specs or ()):
        if pool.is_placeholder:
            continue
        task_type = POOL_TASK_TYPES[index]
        field = f"workerPoolSpecs[{index}]"
        if contract.task_env.get(task_type):
            names = ", ".join(contract.task_env[task_type])
            notes.add(f"{field} env {names}: ml v1 has no environment variables per replica: set them in the image, "
                      "or pass them as arguments.")
        if task_type in contract.task_args:
            notes.add(f"{field} args differ from workerPoolSpecs[0]'s: ml v1 gives every replica the same args: "
                      "the trainer must tell the pools apart by TF_CONFIG.")
        if pool.disk_spec:
            config = _replica_config(ti, task_type)
            config.disk_config = DiskConfig(boot_disk_type=pool.disk_spec.boot_disk_type,
                                            boot_disk_size_gb=pool.disk_spec.boot_disk_size_gb)
        for name in POOL_ONLY:
            if getattr(pool, name):
                notes.add(f"{field}.{to_camel(name)} has no equivalent in ml v1: left out.")
        _note_machine(field, pool.machine_spec, notes)


def _replica_config(ti: TrainingInput, task_type: str) -> ReplicaConfig:
    field = CONFIG_FIELDS[task_type]
    config = getattr(ti, field) or ReplicaConfig()
    setattr(ti, field, config)
    return config


def _note_machine(field: str, machine: vx.MachineSpec | None, notes: Notes) -> None:
    if machine is None:
        return
    if machine.machine_type:
        try:
            machine_type(machine.machine_type)
        except ValidationError:
            notes.add(f"{field}.machineSpec.machineType {machine.machine_type} was not offered by AI Platform "
                      "Training: choose one of its machine types before submitting.")
    accelerator = machine.accelerator_type
    if accelerator and accelerator.value and accelerator.name not in ACCELERATOR_TYPES:
        notes.add(f"{field}.machineSpec.acceleratorType {accelerator.name} was not offered by AI Platform Training: "
                  "choose one of its GPUs before submitting.")
    for name in MACHINE_ONLY:
        if getattr(machine, name):
            notes.add(f"{field}.machineSpec.{to_camel(name)} has no equivalent in ml v1: left out.")


def _from_scheduling(spec: vx.CustomJobSpec, notes: Notes) -> None:
    scheduling = spec.scheduling
    if scheduling is None:
        return
    strategy = scheduling.strategy
    if strategy is not None and strategy not in (vx.Strategy.STRATEGY_UNSPECIFIED, vx.Strategy.ON_DEMAND,
                                                 vx.Strategy.STANDARD, vx.Strategy.FLEX_START):
        notes.add(f"scheduling.strategy {strategy.name} has no equivalent: AI Platform ran on standard machines.")
    if scheduling.max_wait_duration and strategy is not vx.Strategy.FLEX_START:
        notes.add("scheduling.maxWaitDuration applies to FLEX_START only: left out.")
    for name, why in (("restart_job_on_worker_restart", "AI Platform restarted the replica that failed only"),
                      ("disable_retries", "AI Platform retried a job's replicas as it saw fit")):
        if getattr(scheduling, name):
            notes.add(f"scheduling.{to_camel(name)} has no equivalent: {why}.")


def _note_spec_only(spec: vx.CustomJobSpec, notes: Notes) -> None:
    for name in SPEC_ONLY:
        if getattr(spec, name):
            notes.add(f"{to_camel(name)} has no equivalent in ml v1: left out.")


def _hyperparameters(job: vx.HyperparameterTuningJob, notes: Notes) -> HyperparameterSpec:
    study = job.study_spec
    if study is None or not study.metrics:
        raise ValidationError("studySpec.metrics is required: the metricId the trainer reports and its goal.")
    metric = study.metrics[0]
    if len(study.metrics) > 1:
        notes.add(f"studySpec.metrics holds {len(study.metrics)} metrics; AI Platform tuned one: "
                  f"{metric.metric_id} is kept.")
    params = [_ml_parameter(index, param, notes) for index, param in enumerate(study.parameters or ())]
    for name, why in (("measurement_selection_type", "the metric's last report is the trial's"),
                      ("observation_noise", "left out"),
                      ("convex_automated_stopping_spec", "left out"),
                      ("study_stopping_config", "left out")):
        if getattr(study, name) is not None:
            notes.add(f"studySpec.{to_camel(name)} has no equivalent in ml v1: {why}.")
    algorithm = study.algorithm.name if study.algorithm and study.algorithm.value else None
    goal = metric.goal.name if metric.goal and metric.goal.value else None
    data = {"params": params, "goal": goal, "hyperparameterMetricTag": metric.metric_id, "algorithm": algorithm,
            "maxTrials": job.max_trial_count, "maxParallelTrials": job.parallel_trial_count,
            "maxFailedTrials": job.max_failed_trial_count, "enableTrialEarlyStopping": study.stops_early or None}
    try:
        return HyperparameterSpec.model_validate({key: value for key, value in data.items() if value is not None})
    except PydanticError as exc:
        raise ValidationError(pydantic_error_line(exc, "studySpec as trainingInput.hyperparameters")) from None


def _ml_parameter(index: int, param: vx.ParameterSpec, notes: Notes) -> dict[str, Any]:
    """A studySpec parameter as ml v1's (aiptrain.vertex.study's mapping), saying what is left out."""
    field = f"studySpec.parameters[{index}]" + (f" ({param.parameter_id})" if param.parameter_id else "")
    try:
        mapped = ml_parameter(param, field)
    except PydanticError as exc:
        raise ValidationError(pydantic_error_line(exc, field)) from None
    given = next(name for name in VALUE_SPEC_FIELDS if getattr(param, name) is not None)
    if getattr(getattr(param, given), "default_value", None) is not None:
        notes.add(f"{field}.{to_camel(given)}.defaultValue has no equivalent in ml v1: left out.")
    if param.conditional_parameter_specs:
        children = ", ".join(child.parameter_spec.parameter_id or "?" for child in param.conditional_parameter_specs
                             if child.parameter_spec)
        notes.add(f"{field}.conditionalParameterSpecs ({children}): AI Platform had no conditional parameters: left "
                  "out.")
    return mapped.to_resource()
