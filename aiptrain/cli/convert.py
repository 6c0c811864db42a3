"""What `aiptrain jobs convert` and `jobs export --format vertex` do around the pure conversion
(aiptrain.vertex.convert): read a Vertex AI file, print the converted job on stdout and its notes
and the command that creates it on stderr. Imported when one of them runs."""

from __future__ import annotations

import shlex
from typing import Any

import click

from aiptrain.vertex.convert import CUSTOM_JOB, TUNING_JOB, Conversion
from aiptrain.vertex.records import CUSTOM_JOBS, JOB_PREFIX, TUNING_JOBS

QUIET_VERBOSITIES = ("error", "critical", "none")


def recorded_vertex_job(client: Any, job_id: str) -> Conversion | None:
    """A stored job that runs a Vertex AI job (custom_job_ID, hp_tuning_job_ID) converts to that
    job as its client created it; None for any other job, or where the store is not at hand
    (client mode: the server keeps the records)."""
    if not job_id.startswith(tuple(JOB_PREFIX.values())) or not hasattr(client, "store"):
        return None
    from aiptrain.vertex.records import VertexRecords

    record = VertexRecords(client.store).of_job(client.key(job_id))
    kinds = {CUSTOM_JOBS: CUSTOM_JOB, TUNING_JOBS: TUNING_JOB}
    if record is None or record.kind not in kinds:
        return None
    note = f"Job {job_id} runs the Vertex AI job {record.name}: this is that job as it was created."
    return Conversion(kinds[record.kind], record.body, (note,), record.body.get("displayName") or job_id,
                      record.location)


def creation_hint(conversion: Conversion, region: str) -> str:
    """The command that creates the converted job, where it goes."""
    name = shlex.quote(conversion.name)
    if conversion.kind == CUSTOM_JOB:
        return (f"Create it with `gcloud ai custom-jobs create --region={region} --display-name={name} "
                "--config=FILE` (FILE: the jobSpec alone, as `aiptrain jobs convert JOB --gcloud-config` prints it), "
                f"or POST it to projects/PROJECT/locations/{region}/customJobs (the SDK: aiplatform.CustomJob).")
    if conversion.kind == TUNING_JOB:
        return (f"Create it with `gcloud ai hp-tuning-jobs create --region={region} --display-name={name} "
                f"--config=FILE`, or POST it to projects/PROJECT/locations/{region}/hyperparameterTuningJobs.")
    return (f"Submit it with `aiptrain jobs submit training {conversion.name} --config=FILE --region={region}` "
            "(or `gcloud ai-platform jobs submit training`).")


def print_conversion(conversion: Conversion, format_spec: str | None, gcloud_config: bool, verbosity: str,
                     default_region: str) -> None:
    """The converted job on stdout (YAML unless --format says otherwise), its notes and the
    command that creates it on stderr."""
    from aiptrain.cli.formats import dump_yaml, render

    data = conversion.gcloud_config if gcloud_config else conversion.resource
    click.echo(render(data, format_spec) if format_spec else dump_yaml(data), nl=False)
    if verbosity in QUIET_VERBOSITIES:
        return
    for note in conversion.notes:
        click.echo(f"NOTE: {note}", err=True)
    click.echo(creation_hint(conversion, conversion.region or default_region), err=True)
