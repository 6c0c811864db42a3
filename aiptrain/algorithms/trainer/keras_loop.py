"""Training a TensorFlow algorithm's model as the service's estimators did: --max_steps batches of
--batch_size rows, an evaluation (with a checkpoint and the metrics reported for tuning) every
--eval_frequency_secs and at the end, checkpoints and summaries in --job-dir/experiment (a replica
restarted picks up from the last checkpoint), and the SavedModel in --job-dir/model.

The SavedModel's serving signature takes CSV rows without the target column (`csv_row`, a batch
of strings, blanks filled as in training) and answers `classes` and `scores` (classification) or
`predictions` (regression).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging as absl_logging

from . import files, outputs
from .flags import Flags
from .models import BUILDERS, Built
from .preprocess import NUMERICAL, Prepared, Schema, feature_columns, targets

SHUFFLE_SEED = 7
LOG_LINES = 10  # training-loss lines over a run


def dataset(schema: Schema, rows: list[list[str]]):
    columns = feature_columns(schema, rows)
    features = {name: np.asarray(values, dtype=np.float32 if isinstance(values[0], float) else object)
                for name, values in columns.items()}
    return tf.data.Dataset.from_tensor_slices((features, np.asarray(targets(schema, rows), dtype=np.float32)))


def optimizer(flags: Flags, prefix: str, learning_rate: Any):
    """The optimizer a flag prefix names (`` or `dnn_`), with ftrl's own regularization."""
    values = flags.values
    kind = values.get(f"{prefix}optimizer_type", "adam")
    if kind == "ftrl":
        return tf.keras.optimizers.Ftrl(
            learning_rate, l1_regularization_strength=values[f"{prefix}l1_regularization_strength"],
            l2_regularization_strength=values[f"{prefix}l2_regularization_strength"],
            l2_shrinkage_regularization_strength=values.get(f"{prefix}l2_shrinkage_regularization_strength", 0.0))
    if kind == "sgd":
        return tf.keras.optimizers.SGD(learning_rate)
    if kind == "adagrad":
        return tf.keras.optimizers.Adagrad(learning_rate)
    if prefix:  # the deep part's adam: the defaults
        return tf.keras.optimizers.Adam(learning_rate)
    return tf.keras.optimizers.Adam(learning_rate, beta_1=values.get("beta_1", 0.9), beta_2=values.get("beta_2", 0.999))


def learning_rate(flags: Flags, prefix: str) -> Any:
    rate = flags.values[f"{prefix}learning_rate"]
    if "decay_every" in flags.values:  # TabNet decays it
        return tf.keras.optimizers.schedules.ExponentialDecay(rate, flags.decay_every, flags.decay_rate, staircase=True)
    return rate


class Trainer:
    def __init__(self, algorithm: str, flags: Flags, prepared: Prepared, log: Callable[[str], None]):
        self.flags, self.prepared, self.log = flags, prepared, log
        self.schema = schema = prepared.schema
        self.classification = schema.model_type == "classification"
        tf.random.set_seed(0)
        self.built: Built = BUILDERS[algorithm](schema, flags, len(schema.classes) if self.classification else 1)
        self.model = self.built.model
        self.optimizers = []
        for prefix, layers in self.built.groups:
            variables = [v for layer in layers for v in layer.trainable_variables]
            if variables:
                self.optimizers.append((optimizer(flags, prefix, learning_rate(flags, prefix)), variables))
        grouped = {id(v) for _, variables in self.optimizers for v in variables}
        left = [v for v in self.model.trainable_variables if id(v) not in grouped]
        if left:  # trained by the first optimizer (none should be left: the builders group every layer)
            self.optimizers[0][1].extend(left)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        experiment = files.join(flags.job_dir, outputs.EXPERIMENT_DIR)
        checkpoint = tf.train.Checkpoint(model=self.model, step=self.step,
                                         **{f"optimizer_{i}": o for i, (o, _) in enumerate(self.optimizers)})
        self.checkpoints = tf.train.CheckpointManager(checkpoint, experiment, max_to_keep=3)
        self.train_writer = tf.summary.create_file_writer(files.join(experiment, "train"))
        self.eval_writer = tf.summary.create_file_writer(files.join(experiment, "eval"))
        self.reporter = outputs.Reporter()

    # -- one step, one evaluation ---------------------------------------------------------------

    def loss(self, labels, output):
        if self.classification:
            return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(tf.cast(labels, tf.int32), output,
                                                                                  from_logits=True))
        standardized = (labels - self.schema.target_mean) / self.schema.target_std
        return tf.reduce_mean(tf.square(output[:, 0] - standardized))

    @tf.function
    def train_step(self, features, labels):
        with tf.GradientTape() as tape:
            output = self.model(features, training=True)
            loss = self.loss(labels, output)
            total = loss + tf.add_n(self.model.losses) if self.model.losses else loss
        every = [v for _, variables in self.optimizers for v in variables]
        gradients = tape.gradient(total, every)
        start = 0
        for chosen, variables in self.optimizers:
            chosen.apply_gradients(zip(gradients[start:start + len(variables)], variables))  # noqa: B905
            start += len(variables)
        self.step.assign_add(1)
        return loss

    @tf.function
    def eval_step(self, features, labels):
        """Sums over a batch: (loss, correct predictions or squared error, rows)."""
        output = self.model(features, training=False)
        rows = tf.cast(tf.shape(labels)[0], tf.float32)
        if self.classification:
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(output, axis=1, output_type=tf.int32),
                                                     tf.cast(labels, tf.int32)), tf.float32))
            return self.loss(labels, output) * rows, correct, rows
        predictions = output[:, 0] * self.schema.target_std + self.schema.target_mean
        squared = tf.reduce_sum(tf.square(predictions - labels))
        return squared, squared, rows

    def evaluate(self, data, steps: int | None) -> dict[str, float]:
        loss = measure = rows = 0.0
        for features, labels in data.take(steps) if steps else data:
            batch = self.eval_step(features, labels)
            loss, measure, rows = loss + float(batch[0]), measure + float(batch[1]), rows + float(batch[2])
        rows = rows or 1.0
        if self.classification:
            return {"accuracy": measure / rows, "loss": loss / rows}
        return {"rmse": math.sqrt(measure / rows), "loss": loss / rows}

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> outputs.Outcome:
        flags, prepared = self.flags, self.prepared
        batch = flags.batch_size
        max_steps = flags.max_steps or max(1, math.ceil(10 * len(prepared.training) / batch))
        training = dataset(self.schema, prepared.training).shuffle(min(len(prepared.training), 10000),
                                                                   seed=SHUFFLE_SEED).repeat().batch(batch)
        evaluated = prepared.validation or prepared.training
        if not prepared.validation:
            self.log("No validation data (--validation_data_path, or --preprocess with --validation_split): "
                     "the metrics are measured on the training data.")
        evaluation = dataset(self.schema, evaluated).batch(batch)
        restored = self.checkpoints.restore_or_initialize()
        if restored:
            self.log(f"Resumed from {restored} at step {int(self.step.numpy())}")
        self.log(f"Training for {max_steps} steps of {batch} rows")
        every = max(1, max_steps // LOG_LINES)
        last_evaluation, metrics, measured_at = time.monotonic(), None, -1
        batches = iter(training)
        while int(self.step.numpy()) < max_steps:
            features, labels = next(batches)
            loss = float(self.train_step(features, labels))
            step = int(self.step.numpy())
            if step % every == 0 or step == max_steps:
                self.log(f"step {step}: loss = {loss:.4g}")
                with self.train_writer.as_default():
                    tf.summary.scalar("loss", loss, step=step)
            if time.monotonic() - last_evaluation >= flags.eval_frequency_secs and step < max_steps:
                metrics, measured_at = self.evaluation(evaluation, step), step
                last_evaluation = time.monotonic()
        step = int(self.step.numpy())
        if measured_at != step:
            metrics = self.evaluation(evaluation, step)
        assert metrics is not None
        if prepared.test:
            tested = self.evaluate(dataset(self.schema, prepared.test).batch(batch), None)
            self.log("Test data: " + ", ".join(f"{name} = {value:.4g}" for name, value in tested.items()))
        self.export()
        return outputs.Outcome(metrics, step)

    def evaluation(self, data, step: int) -> dict[str, float]:
        metrics = self.evaluate(data, self.flags.eval_steps)
        self.log(f"Evaluation at step {step}: " + ", ".join(f"{name} = {value:.4g}" for name, value in metrics.items()))
        with self.eval_writer.as_default():
            for name, value in metrics.items():
                tf.summary.scalar(name, value, step=step)
        self.checkpoints.save(checkpoint_number=step)
        self.reporter.report(metrics, step)
        return metrics

    def export(self) -> None:
        # Saving names the Keras layers' own call functions it does not trace: only the serving
        # signature is the model's interface, so that warning would only alarm the job's log.
        absl_logging.set_verbosity(absl_logging.ERROR)
        path = files.join(self.flags.job_dir, outputs.MODEL_DIR)
        module = serving_module(self.model, self.schema)
        tf.saved_model.save(module, path, signatures={"serving_default": module.serve})


def serving_module(model, schema: Schema):
    """The exported model: CSV rows (the CSV's columns less the target) in, predictions out.
    The columns' rules are Python values the function closes over: only the model is tracked."""
    module = tf.Module()
    module.model = model
    module.classes = tf.constant(schema.classes or [""])
    features = {c.name for c in schema.features}
    columns = [(c.name, c.kind == NUMERICAL, repr(c.mean), c.name in features) for c in schema.columns[1:]]
    classification, mean, std = schema.model_type == "classification", schema.target_mean, schema.target_std

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="csv_row")])
    def serve(csv_row):
        fields = tf.io.decode_csv(csv_row, record_defaults=[[""]] * len(columns))
        inputs = {}
        for (name, numerical, fill, used), field in zip(columns, fields):  # noqa: B905 - Python 3.9 in the image
            if not used:
                continue
            value = tf.strings.strip(field)
            inputs[name] = tf.strings.to_number(tf.where(value == "", fill, value), tf.float32) if numerical else value
        output = module.model(inputs, training=False)
        if classification:
            return {"classes": tf.gather(module.classes, tf.argmax(output, axis=1)), "scores": tf.nn.softmax(output)}
        return {"predictions": output[:, 0] * std + mean}

    module.serve = serve
    return module


def train(algorithm: str, flags: Flags, prepared: Prepared, log: Callable[[str], None]) -> tuple[outputs.Outcome, dict]:
    """Train the algorithm's model; (what it measured, what artifacts/metadata.json adds)."""
    outcome = Trainer(algorithm, flags, prepared, log).run()
    return outcome, {"serving": {"signature": "serving_default", "input": "csv_row",
                                 "outputs": ["classes", "scores"] if prepared.schema.model_type == "classification"
                                 else ["predictions"]}}
