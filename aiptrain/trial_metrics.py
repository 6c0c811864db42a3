"""A trial's reports of its hyperparameterMetricTag, read the two ways the service read them:
cloudml-hypertune's metric file, else TensorFlow summary events in the trial's output dir
(`<jobDir>/<trialId>`, recursively). Both live in directories the trainer writes, so they are
read through aiptrain.safe_files: no links, no FIFOs, bounded sizes.

A report is (step, value); lists are oldest first.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from aiptrain import safe_files

METRIC_FILE_LIMIT = 1 << 20  # cloudml-hypertune keeps its last 100 reports: a few KB
EVENT_FILE_LIMIT = 64 << 20  # scalars, a graph, some histograms; past this a file is left out
EVENT_FILE_MARK = "tfevents"  # events.out.tfevents.<time>.<host>[.<suffix>], as tf.summary names them


def parse_hypertune(text: str, tag: str) -> list[tuple[int, float]]:
    """Reports under `tag` in a cloudml-hypertune metric file: JSON lines, values and steps as
    strings; the library rewrites the whole file on each report (keeping the last 100), so a
    read may catch it half-written: such lines are skipped."""
    reports = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
            value = float(entry[tag])
            step = int(float(entry.get("global_step") or 0))
        except (ValueError, KeyError, TypeError, OverflowError):
            continue
        if math.isfinite(value):
            reports.append((step, value))
    return reports


def read_hypertune(directory: Path, name: str, tag: str) -> list[tuple[int, float]]:
    """The reports in the metric file `directory/name`; [] when there is none. UnsafePath when
    the name is a link, not a regular file, or too big."""
    data = safe_files.read_file(directory, name, METRIC_FILE_LIMIT)
    return parse_hypertune(data.decode(errors="replace"), tag) if data else []


def read_summary_events(job_dir: Path, trial_id: str, tag: str) -> list[tuple[int, float]]:
    """The scalar summaries under `tag` in the event files below `job_dir/trial_id`: TF2's
    tf.summary.scalar (a tensor) and TF1's or Keras's simple_value. A summary in a subdirectory
    (Keras writes train/ and validation/) also answers to `<subdirectory>/<tag>`. Reports are
    ordered by step, then by when they were written: the last is the newest of the last step."""
    timed: list[tuple[int, float, float]] = []
    for relative, dir_fd, name in safe_files.find_files(job_dir, trial_id, lambda n: EVENT_FILE_MARK in n):
        run = os.path.dirname(relative)
        tags = {tag} | ({tag[len(run) + 1:]} if run and tag.startswith(run + "/") else set())
        try:
            with safe_files.open_regular(dir_fd, name, EVENT_FILE_LIMIT) as fd:
                data = safe_files.read_bounded(fd, EVENT_FILE_LIMIT)
        except (OSError, safe_files.UnsafePath):
            continue  # gone meanwhile, or not a file to read
        timed.extend(_scalars(data, tags))
    timed.sort(key=lambda report: (report[0], report[1]))
    return [(step, value) for step, _, value in timed]


def _scalars(data: bytes, tags: set[str]) -> list[tuple[int, float, float]]:
    """(step, wall time, value) of the scalar summaries under `tags` in one event file's bytes,
    read by tensorboard's own reader from an in-memory copy (the copy is the bound: the
    trainer may still be appending to the file)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    found = []
    memory = os.memfd_create("aiptrain-events", os.MFD_CLOEXEC)
    try:
        with open(memory, "wb", closefd=False) as copy:
            copy.write(data)
        try:
            for event in EventFileLoader(f"/proc/self/fd/{memory}").Load():
                for value in event.summary.value:
                    if value.tag in tags:
                        number = _scalar(value)
                        if number is not None:
                            found.append((event.step, event.wall_time, number))
        except Exception:  # noqa: BLE001 - a damaged or hostile file: what was read before it counts
            pass
    finally:
        os.close(memory)
    return found


def _scalar(value) -> float | None:
    """The number a summary value holds: simple_value (TF1, older Keras) or a one-element
    tensor (TF2's tf.summary.scalar); None for images, histograms, text."""
    if value.HasField("simple_value"):
        number = float(value.simple_value)
    elif value.HasField("tensor"):
        from tensorboard.util import tensor_util

        if any(dim.size != 1 for dim in value.tensor.tensor_shape.dim):
            return None  # not a scalar (and a claimed shape is not something to allocate)
        array = tensor_util.make_ndarray(value.tensor)
        if array.size != 1 or array.dtype.kind not in "fiub":
            return None
        number = float(array.reshape(()))
    else:
        return None
    return number if math.isfinite(number) else None
