"""An Estimator trainer in the style of the AI Platform era: a linear regressor on synthetic
data through `tf.estimator.train_and_evaluate`, its checkpoints in --job-dir. Under a
parameter-server cluster (TF_CONFIG from the scale tier) the Estimator itself runs the chief,
the workers and the parameter servers."""

import argparse
import json
import os

import numpy as np
import tensorflow as tf


def input_fn(seed, batch_size=32):
    def make():
        rng = np.random.RandomState(seed)
        x = rng.uniform(-1, 1, size=(1024, 1)).astype(np.float32)
        y = 3.0 * x + 1.0
        return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat().batch(batch_size)

    return make


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--train-steps", type=int, default=200)
    args = parser.parse_args()
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    print(f"TensorFlow {tf.__version__}, task {task.get('type')} {task.get('index')}", flush=True)
    config = tf.estimator.RunConfig(model_dir=os.path.join(args.job_dir, "model"), save_checkpoints_steps=50)
    estimator = tf.estimator.LinearRegressor(
        feature_columns=[tf.feature_column.numeric_column("x")], config=config,
        optimizer=lambda: tf.keras.optimizers.SGD(learning_rate=0.1))
    train = tf.estimator.TrainSpec(input_fn(1), max_steps=args.train_steps)
    evaluate = tf.estimator.EvalSpec(input_fn(2), steps=5, start_delay_secs=0, throttle_secs=1)
    result = tf.estimator.train_and_evaluate(estimator, train, evaluate)
    print(f"train_and_evaluate returned {result!r}", flush=True)
    if task.get("type") in ("chief", "master", None):
        print(f"Latest checkpoint: {estimator.latest_checkpoint()}", flush=True)


if __name__ == "__main__":
    main()
