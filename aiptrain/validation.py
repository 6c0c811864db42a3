"""Checks of user input that need no Docker, bucket or store. Each failure is one
ValidationError whose message names the problem and the fix."""

from __future__ import annotations

import re
from pathlib import Path

from aiptrain.errors import ValidationError
from aiptrain.logs import printable

JOB_ID_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
MODULE_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
LABEL_KEY_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE_PATTERN = re.compile(r"[a-z0-9_-]{0,63}")


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
    for key, value in labels.items():
        if not LABEL_KEY_PATTERN.fullmatch(key):
            raise ValidationError(
                f"Invalid label key [{key}]: keys start with a lowercase letter and use only "
                "lowercase letters, digits, `-` and `_`."
            )
        if not LABEL_VALUE_PATTERN.fullmatch(value):
            raise ValidationError(
                f"Invalid label value [{value}] for [{key}]: use only lowercase letters, digits, `-` and `_`."
            )
    return labels


def parse_duration_seconds(value: str, field: str) -> float:
    """Durations as the REST API writes them: '7200s', '1.5s'."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)s", value.strip())
    if not match:
        raise ValidationError(f"Invalid {field} [{value}]: write a duration in seconds such as `7200s`.")
    return float(match.group(1))


def scheduling_seconds(job, field: str) -> float | None:
    """The job's scheduling.maxRunningTime or maxWaitTime (`field` in snake_case) in seconds;
    None when unset. A malformed value is one line naming the field."""
    scheduling = job.training_input.scheduling
    value = getattr(scheduling, field, None) if scheduling else None
    if not value:
        return None
    first, *rest = field.split("_")
    return parse_duration_seconds(value, f"scheduling.{first}{''.join(part.title() for part in rest)}")
