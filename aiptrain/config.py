"""Turn `jobs submit training` flags and a `--config` file into a Job, the way gcloud does.

Merge rule (gcloud's BuildTrainingJob): the config file is the base, the positional
JOB always sets jobId, `--labels` replaces labels, and every flag that was given
overrides the matching field. `args` after `--` override the config's args only
when there are some, so a config-file `args:` list is not wiped by an empty `--`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiptrain.errors import ValidationError
from aiptrain.model import (
    AcceleratorConfig,
    EncryptionConfig,
    Job,
    ReplicaConfig,
    TrainingInput,
    api_enum_name,
    training_fields_lifted,
)
from aiptrain.topology import normalize_scale_tier, scale_tier_choices


@dataclass
class SubmitFlags:
    """The flags of `jobs submit training` as given (None = not given)."""

    job_id: str
    config: str | None = None
    job_dir: str | None = None
    labels: dict[str, str] | None = None
    module_name: str | None = None
    package_path: str | None = None
    packages: list[str] = field(default_factory=list)
    staging_bucket: str | None = None
    region: str | None = None
    scale_tier: str | None = None
    runtime_version: str | None = None
    python_version: str | None = None
    master_machine_type: str | None = None
    master_accelerator: str | None = None
    master_image_uri: str | None = None
    worker_machine_type: str | None = None
    worker_count: int | None = None
    worker_accelerator: str | None = None
    worker_image_uri: str | None = None
    parameter_server_machine_type: str | None = None
    parameter_server_count: int | None = None
    parameter_server_accelerator: str | None = None
    parameter_server_image_uri: str | None = None
    use_chief_in_tf_config: bool | None = None
    service_account: str | None = None
    enable_web_access: bool = False
    limit_resources: bool = False  # aiptrain's own: enforce machine types' cpus/memory, scaled to the host
    project: str | None = None  # gcloud's --project: recorded beside the job, not in its REST body
    kms_key: str | None = None  # the full key name by the time build_job sees it
    kms_keyring: str | None = None
    kms_location: str | None = None
    kms_project: str | None = None
    network: str | None = None
    tpu_tf_version: str | None = None
    backend: str | None = None  # aiptrain's own: docker or swarm (default AIPTRAIN_BACKEND)
    user_args: list[str] = field(default_factory=list)


def pydantic_error_line(error: Any, source: str) -> str:
    """One line out of a pydantic ValidationError:
    `source: trainingInput.hyperparameters.params[1] (lr): message.`"""
    first = error.errors()[0]
    location = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"])
    cause = first.get("ctx", {}).get("error")
    if getattr(cause, "path", None):  # model.FieldError: the validator knows the exact sub-field
        location += f".{cause.path}"
    message = first["msg"].removeprefix("Value error, ").rstrip(".")
    more = len(error.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{source}: {location.lstrip('.')}: {message}{suffix}."


def read_document(path: str, flag: str) -> Any:
    """A YAML or JSON file named by `flag` (JSON is YAML), or one line saying why it cannot be read."""
    import yaml

    try:
        return yaml.safe_load(Path(path).expanduser().read_text())
    except FileNotFoundError:
        raise ValidationError(f"{flag} file [{path}] does not exist.") from None
    except IsADirectoryError:
        raise ValidationError(f"{flag} file [{path}] is a directory: name the YAML or JSON file.") from None
    except OSError as exc:
        raise ValidationError(f"{flag} file [{path}] cannot be read: {exc.strerror}.") from None
    except UnicodeDecodeError:
        raise ValidationError(f"{flag} file [{path}] is not UTF-8 text: save it as UTF-8 YAML or JSON.") from None
    except RecursionError:
        raise ValidationError(f"{flag} file [{path}] nests too deeply to be a job: fix its structure.") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ValidationError(f"{flag} file [{path}] is not valid YAML or JSON{where}: fix the syntax.") from None


def load_config(path: str) -> Job:
    """Read a gcloud `--config` YAML/JSON file (a Job resource) with yaml.safe_load."""
    from pydantic import ValidationError as PydanticError

    data = read_document(path, "--config")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValidationError(
            f"--config file [{path}] must hold a Job resource (a mapping with a `trainingInput:` key)."
        )
    _check_scale_tier_spelling(data, path)
    try:
        return Job.model_validate(data)
    except PydanticError as exc:
        raise ValidationError(pydantic_error_line(exc, f"Invalid --config file [{path}]")) from None


def config_scale_tier(path: str | None) -> object:
    """trainingInput.scaleTier of a --config file as written, as gcloud reads it to check
    `--master-machine-type` (a top-level scaleTier it does not read); None when there is none."""
    import yaml

    if not path:
        return None
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, ValueError, RecursionError, yaml.YAMLError):  # load_config said why already
        return None
    training_input = data.get("trainingInput") if isinstance(data, dict) else None
    return training_input.get("scaleTier") if isinstance(training_input, dict) else None


def _check_scale_tier_spelling(data: dict, path: str) -> None:
    """The model forgives blanks around a tier; the API's enum decoder does not (`'BASIC '`)."""
    training_input = training_fields_lifted(data).get("trainingInput")
    tier = training_input.get("scaleTier") if isinstance(training_input, dict) else None
    if isinstance(tier, str) and (not tier or tier != tier.strip()):
        raise ValidationError(
            f"Invalid --config file [{path}]: trainingInput.scaleTier [{tier}] is not a scale tier: "
            f"choose one of {scale_tier_choices()} (no blanks)."
        )


def _refuse_empty_values(flags: SubmitFlags) -> None:
    """`--region ''` and the like are mistakes (an unset shell variable), not requests for a default."""
    for name, value in vars(flags).items():
        if isinstance(value, str) and not value.strip() and name != "job_id":
            flag = "--" + name.replace("_", "-")
            raise ValidationError(f"argument {flag}: give a non-empty value, or leave the flag out.")


def parse_accelerator(value: str, flag: str) -> AcceleratorConfig:
    """`type=nvidia-tesla-t4,count=2` -> AcceleratorConfig(type=NVIDIA_TESLA_T4, count=2)."""
    parts: dict[str, str] = {}
    for item in value.split(","):
        key, sep, val = item.partition("=")
        if not sep or key.strip() not in ("type", "count"):
            raise ValidationError(f"Invalid {flag} [{value}]: write it as `type=nvidia-tesla-t4,count=1`.")
        parts[key.strip()] = val.strip()
    if "type" not in parts or "count" not in parts:
        raise ValidationError(f"{flag} needs both keys: `type=nvidia-tesla-t4,count=1`.")
    try:
        count = int(parts["count"])
    except ValueError:
        raise ValidationError(f"Invalid {flag} count [{parts['count']}]: give a whole number.") from None
    if count <= 0:
        raise ValidationError("The count of the accelerator must be greater than 0.")
    return AcceleratorConfig(type=api_enum_name(parts["type"]), count=count)


def _override_replica(
    ti: TrainingInput, config_field: str, image_uri: str | None, accelerator: str | None, flag: str
) -> None:
    if not image_uri and not accelerator:
        return
    config = getattr(ti, config_field) or ReplicaConfig()
    if image_uri:
        config.image_uri = image_uri
    if accelerator:
        config.accelerator_config = parse_accelerator(accelerator, flag)
    setattr(ti, config_field, config)


def build_job(flags: SubmitFlags, base: Job | None = None) -> Job:
    """The Job the flags describe, merged over `base` (a Job resource a REST client sent) or
    else the `--config` file. No validation of meaning here."""
    _refuse_empty_values(flags)
    if flags.tpu_tf_version:
        raise ValidationError("--tpu-tf-version configures Cloud TPU workers, which aiptrain cannot emulate: drop it.")
    if base is not None:  # noqa: SIM108 - two ternaries in one line read worse
        job = base.model_copy(deep=True)
    else:
        job = load_config(flags.config) if flags.config else Job()
    job.job_id = flags.job_id
    if flags.labels is not None:
        job.labels = flags.labels
    ti = job.training_input

    simple = {
        "python_module": flags.module_name,
        "region": flags.region,
        "job_dir": flags.job_dir,
        "scale_tier": normalize_scale_tier(flags.scale_tier) if flags.scale_tier else None,
        "runtime_version": flags.runtime_version,
        "python_version": flags.python_version,
        "service_account": flags.service_account,
        "master_type": flags.master_machine_type,
        "worker_type": flags.worker_machine_type,
        "worker_count": flags.worker_count,
        "parameter_server_type": flags.parameter_server_machine_type,
        "parameter_server_count": flags.parameter_server_count,
        "use_chief_in_tf_config": flags.use_chief_in_tf_config,
        # gcloud sends the switch's value whatever the --config file says (enableWebAccess: false
        # on every line without it); a REST body is taken as sent.
        "enable_web_access": flags.enable_web_access if base is None else flags.enable_web_access or None,
        "network": flags.network,
        "args": flags.user_args or None,
    }
    updates = {name: value for name, value in simple.items() if value is not None}
    try:
        ti = TrainingInput.model_validate({**ti.model_dump(exclude_none=True), **updates})
    except Exception as exc:  # pydantic's ValidationError; imported lazily above
        raise ValidationError(pydantic_error_line(exc, "Invalid flags")) from None

    _override_replica(ti, "master_config", flags.master_image_uri, flags.master_accelerator, "--master-accelerator")
    _override_replica(ti, "worker_config", flags.worker_image_uri, flags.worker_accelerator, "--worker-accelerator")
    _override_replica(
        ti,
        "parameter_server_config",
        flags.parameter_server_image_uri,
        flags.parameter_server_accelerator,
        "--parameter-server-accelerator",
    )
    if flags.kms_key:
        ti.encryption_config = EncryptionConfig(kms_key_name=flags.kms_key)
    job.training_input = ti
    return job
