"""Errors the CLI turns into one line on stderr and a documented exit status.

Exit statuses (also in docs/reference/exit-codes.md):
  0  success
  1  the job failed or was cancelled (when the command waited on it)
  2  usage or validation error, a bucket that is missing or unreachable included: nothing was created
  3  the environment is not ready (no Docker engine, runtime image not built, no GPU runtime)
  4  aiptrain itself failed (a bug, or Docker refused something it should not have)
  130 interrupted with Ctrl-C
"""

from __future__ import annotations

from aiptrain.logs import printable

EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130


def first_line(text: object, otherwise: str = "no details") -> str:
    """The first line of an error's text, for a one-line message that quotes it."""
    lines = str(text).strip().splitlines()
    return lines[0].strip() if lines else otherwise


class AiptrainError(Exception):
    """An error with a message meant for the user, one line naming the problem and the fix."""

    exit_code = EXIT_INTERNAL


class ValidationError(AiptrainError):
    """Bad input from the user: flags, config file, package, job ID."""

    exit_code = EXIT_USAGE


class JobNotFound(ValidationError):
    def __init__(self, job_id: str):
        super().__init__(f"Job [{printable(job_id, one_line=True)}] not found; `aiptrain jobs list` shows the jobs that exist.")


class JobExists(ValidationError):
    """The job ID is taken (the REST API answers 409 ALREADY_EXISTS)."""


class EnvironmentNotReady(AiptrainError):
    """Something outside aiptrain is missing: the Docker engine, an image, a GPU runtime."""

    exit_code = EXIT_ENVIRONMENT


class EnvironmentLacks(EnvironmentNotReady):
    """What this installation lacks until someone changes it (no GPU runtime, a runtime whose
    base image cannot be had): still exit 3 on the command line, but through the API 400
    FAILED_PRECONDITION rather than 503, which clients (gcloud, googleapiclient) retry for
    half a minute as if it would pass."""
