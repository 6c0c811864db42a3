"""Checks of user input that need no Docker, bucket or store. Each failure is one
ValidationError whose message names the problem and the fix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from aiptrain.errors import ValidationError
from aiptrain.logs import printable
from aiptrain.storage import is_gcs, local_path

if TYPE_CHECKING:
    from aiptrain.model import TrainingInput

JOB_ID_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
MODULE_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
LABEL_KEY_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE_PATTERN = re.compile(r"[a-z0-9_-]{0,63}")
MAX_LABELS = 64  # the service's limit on labels per resource
# google.protobuf.Duration's range (about 10,000 years), which the REST API's durations are:
# the service cannot be given more, and a timedelta of it still fits (a bigger one overflows).
MAX_DURATION_SECONDS = 315_576_000_000


def validate_job_id(job_id: str) -> str:
    if JOB_ID_PATTERN.fullmatch(job_id or ""):
        return job_id
    if not job_id:
        problem = "is empty"
    elif len(job_id) > 128:
        problem = f"is {len(job_id)} characters long (at most 128)"
    elif not job_id[0].isascii() or not job_id[0].isalpha():
        problem = "must start with a letter"
    else:
        problem = "may contain only letters, digits and underscores"
    raise ValidationError(
        f"Invalid job ID [{printable(job_id, one_line=True)}]: it {problem}; use e.g. `my_job_1` "
        "(a letter, then letters, digits or underscores, 128 at most)."
    )


def validate_module_name(module: str) -> str:
    if MODULE_PATTERN.fullmatch(module or ""):
        return module
    raise ValidationError(
        f"Invalid --module-name [{module}]: give a dotted Python module name such as `trainer.task`."
    )


def validate_package_path(path: str) -> Path:
    package = Path(path).expanduser()
    if not package.is_dir():
        raise ValidationError(
            f"--package-path [{path}] is not a directory: point it at the directory of your "
            "Python package (the one that holds __init__.py)."
        )
    if not (package / "__init__.py").is_file():
        raise ValidationError(
            f"[{path}] is not a valid Python package because it does not contain an `__init__.py` "
            "file. Please create one and try again. Also, please ensure that --package-path refers "
            "to a local directory."
        )
    return package.resolve()


def validate_labels(labels: dict[str, str]) -> dict[str, str]:
    """The service's label rules: at most 64; keys of 1 to 63 characters starting with a lowercase
    letter, values of up to 63; only lowercase letters, digits, `-` and `_` (so no blank or newline)."""
    check_label_count(labels)
    for key, value in labels.items():
        shown_key = printable(key, one_line=True)
        if not LABEL_KEY_PATTERN.fullmatch(key):
            raise ValidationError(
                f"Invalid label key [{shown_key}]: keys have 1 to 63 characters, start with a lowercase letter and "
                "use only lowercase letters, digits, `-` and `_`."
            )
        if not LABEL_VALUE_PATTERN.fullmatch(value):
            raise ValidationError(
                f"Invalid label value [{printable(value, one_line=True)}] for [{shown_key}]: values have at most 63 "
                "characters and use only lowercase letters, digits, `-` and `_`."
            )
    return labels


def check_label_count(labels: dict[str, str]) -> None:
    if len(labels) > MAX_LABELS:
        raise ValidationError(
            f"{len(labels)} labels given: a job has at most {MAX_LABELS}; drop {len(labels) - MAX_LABELS} of them."
        )


def parse_duration_seconds(value: str, field: str) -> float:
    """Durations as the REST API writes them: '7200s', '1.5s' (at most nine fractional digits,
    at most MAX_DURATION_SECONDS, as google.protobuf.Duration)."""
    shown = printable(str(value), one_line=True)
    match = re.fullmatch(r"(\d+(?:\.\d{1,9})?)s", value.strip())
    if not match:
        raise ValidationError(
            f"Invalid {field} [{shown}]: write a duration in seconds such as `7200s` (at most nine fractional digits)."
        )
    seconds = float(match.group(1))
    if seconds > MAX_DURATION_SECONDS:
        raise ValidationError(
            f"Invalid {field} [{shown}]: at most {MAX_DURATION_SECONDS}s (about 10,000 years), as the service's "
            "durations: give a shorter one."
        )
    return seconds


def scheduling_seconds(job, field: str) -> float | None:
    """The job's scheduling.maxRunningTime or maxWaitTime (`field` in snake_case) in seconds;
    None when unset. A malformed value is one line naming the field."""
    scheduling = job.training_input.scheduling
    value = getattr(scheduling, field, None) if scheduling else None
    if not value:
        return None
    first, *rest = field.split("_")
    return parse_duration_seconds(value, f"scheduling.{first}{''.join(part.title() for part in rest)}")


RUNTIME_VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Docker's image reference grammar (distribution/reference): [domain[:port]/]path[:tag][@digest],
# where the first part is a domain only if it has a `.` or a `:` or is `localhost`.
_DOMAIN = re.compile(r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
                     r"(?::[0-9]+)?")
_PATH = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
                   r"(?::\w[\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")


def _is_image_reference(image: str) -> bool:
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return _DOMAIN.fullmatch(first) is not None and _PATH.fullmatch(rest) is not None
    return _PATH.fullmatch(image) is not None


def validate_runtime_version_name(version: str) -> str:
    """A name `runtimes add` maps: it becomes a --runtime-version value and a key of runtimes.json."""
    if RUNTIME_VERSION_PATTERN.fullmatch(version or ""):
        return version
    raise ValidationError(
        f"Invalid runtime version [{printable(version, one_line=True)}]: use 1 to 64 letters, digits, `.`, `-` "
        "or `_`, starting with a letter or digit, such as `2.11` or `team-tf`."
    )


def validate_image_reference(image: str) -> str:
    """An image name as Docker parses it (`repository[:tag][@digest]`, the repository in lowercase)."""
    if image and len(image) <= 255 and _is_image_reference(image):
        return image
    raise ValidationError(
        f"Invalid image name [{printable(image, one_line=True)}]: write it as Docker does, e.g. "
        "`registry.example.com/team/trainer:1.0` (repository in lowercase; tag of letters, digits, `.`, `-`, `_`)."
    )


def check_local_bucket(bucket: str | None) -> None:
    """A local staging bucket is a directory (made if missing), never an existing file."""
    if bucket and not is_gcs(bucket):
        path = Path(local_path(bucket))
        if path.exists() and not path.is_dir():
            raise ValidationError(f"--staging-bucket [{bucket}] is a file, not a directory: name a directory.")


# Each ReplicaConfig: its field, its name in the REST resource, and where users set its image.
_REPLICA_CONFIGS = (
    ("master_config", "masterConfig", "--master-image-uri"),
    ("worker_config", "workerConfig", "--worker-image-uri"),
    ("parameter_server_config", "parameterServerConfig", "--parameter-server-image-uri"),
    ("evaluator_config", "evaluatorConfig", "evaluatorConfig.imageUri"),
)


def check_custom_container(ti: TrainingInput) -> None:
    """gcloud's and the REST API's rules for custom containers (reference §1.3, §3.3)."""
    if ti.uses_custom_container and ti.runtime_version:
        raise ValidationError("Only one of --master-image-uri, --runtime-version can be set.")
    for field, name, image_flag in _REPLICA_CONFIGS:
        config = getattr(ti, field)
        if config is None:
            continue
        sets_command = bool(config.container_command or config.container_args)
        if not ti.uses_custom_container and config.image_uri:
            # Other replica types default to the master's image; a runtime-version master has none.
            raise ValidationError(f"{image_flag} needs --master-image-uri: set the master's image too.")
        if not ti.uses_custom_container and sets_command:
            raise ValidationError(
                f"{name}.containerCommand and containerArgs need a custom container: set --master-image-uri."
            )
        if sets_command and ti.args:
            raise ValidationError(
                f"User args (after `--` or `args:` in --config) cannot be combined with {name}.containerCommand "
                "or containerArgs: put them in containerArgs instead."
            )


def check_package_in_image(ti: TrainingInput) -> None:
    """A custom image with packages runs `python3 -m MODULE` after installing them (AI Platform's
    pre-built framework containers): that needs the module, and leaves no room for
    containerCommand or containerArgs."""
    if not ti.python_module:
        raise ValidationError(
            "--module-name is required to run a package in the --master-image-uri image: name the module "
            "(e.g. `trainer.task`), or drop the packages to run the image's own entrypoint."
        )
    validate_module_name(ti.python_module)
    for field, name, _ in _REPLICA_CONFIGS:
        config = getattr(ti, field)
        if config and (config.container_command or config.container_args):
            raise ValidationError(
                f"{name}.containerCommand and containerArgs cannot be combined with a package and --module-name: "
                "the package's module is the command; drop one or the other."
            )


def split_packages(packages: list[str]) -> tuple[list[Path], list[str]]:
    local, remote = [], []
    for entry in packages:
        if is_gcs(entry):
            remote.append(entry)
            continue
        path = Path(entry).expanduser()
        if not path.is_file():
            raise ValidationError(f"--packages entry [{entry}] is not a file: give a path to a .tar.gz or .whl.")
        local.append(path.resolve())
    check_unique_names([p.name for p in local] + [u.rsplit("/", 1)[-1] for u in remote])
    return local, remote


def check_unique_names(names: list[str]) -> None:
    """Packages share one directory in the replicas, as they share one upload in gcloud."""
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValidationError(f"Cannot upload multiple packages with the same filename: [{', '.join(duplicates)}]")
