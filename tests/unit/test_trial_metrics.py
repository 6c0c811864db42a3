"""A trial's metric from TensorFlow summary events (issue 16, item 5), read with tensorboard's
reader: TF2 scalars (tensors), TF1/Keras simple values, Keras's train/ and validation/ runs; and
the trainer's hostile files (links, FIFOs) left unread. Event files are written here with
tensorboard's own writer, no TensorFlow needed."""

import os

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util

from aiptrain.trial_metrics import read_summary_events


def write_events(directory, scalars, kind="tensor", start=1000.0):
    """Scalars as tf.summary writes them: [(tag, step, value)], wall times in order."""
    writer = EventFileWriter(str(directory))
    for offset, (tag, step, value) in enumerate(scalars):
        if kind == "tensor":  # TF2 tf.summary.scalar
            summary_value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(
                np.float32(value)))
        else:  # TF1 tf.summary.scalar, Keras before TF2
            summary_value = summary_pb2.Summary.Value(tag=tag, simple_value=value)
        writer.add_event(event_pb2.Event(wall_time=start + offset, step=step,
                                         summary=summary_pb2.Summary(value=[summary_value])))
    writer.close()


@pytest.mark.parametrize("kind", ["tensor", "simple_value"])
def test_scalars_of_the_tag_in_step_order(tmp_path, kind):
    write_events(tmp_path / "3", [("accuracy", 0, 0.25), ("loss", 0, 2.0), ("accuracy", 1, 0.5)], kind)
    assert read_summary_events(tmp_path, "3", "accuracy") == [(0, 0.25), (1, 0.5)]
    assert read_summary_events(tmp_path, "3", "missing") == []
    assert read_summary_events(tmp_path, "4", "accuracy") == []


def test_keras_runs_in_subdirectories_the_newest_of_the_last_step_is_last(tmp_path):
    write_events(tmp_path / "1" / "train", [("epoch_accuracy", 0, 0.5), ("epoch_accuracy", 1, 0.6)], start=10)
    write_events(tmp_path / "1" / "validation", [("epoch_accuracy", 0, 0.4), ("epoch_accuracy", 1, 0.55)],
                 start=10.5)
    reports = read_summary_events(tmp_path, "1", "epoch_accuracy")
    assert reports[-1] == pytest.approx((1, 0.55))
    assert read_summary_events(tmp_path, "1", "train/epoch_accuracy") == [
        (0, pytest.approx(0.5)), (1, pytest.approx(0.6))]


def test_links_and_fifos_among_the_events_are_left_unread(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    write_events(elsewhere, [("accuracy", 5, 0.99)])
    trial = tmp_path / "jobdir" / "2"
    write_events(trial, [("accuracy", 1, 0.5)])
    (trial / "linked").symlink_to(elsewhere)
    (trial / "events.out.tfevents.9.linked").symlink_to(next(elsewhere.iterdir()))
    os.mkfifo(trial / "events.out.tfevents.9.fifo")
    (trial / "events.out.tfevents.9.garbage").write_bytes(b"\xff" * 64)
    assert read_summary_events(tmp_path / "jobdir", "2", "accuracy") == [(1, 0.5)]
    (tmp_path / "jobdir" / "3").symlink_to(elsewhere)
    assert read_summary_events(tmp_path / "jobdir", "3", "accuracy") == []
