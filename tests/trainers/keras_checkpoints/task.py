"""A Keras trainer in the style of the AI Platform 2.x samples: fit a small model on synthetic
data, a checkpoint per epoch and the final SavedModel in --job-dir."""

import argparse
import os

import numpy as np
import tensorflow as tf


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    print(f"TensorFlow {tf.__version__}", flush=True)
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, size=(512, 2)).astype(np.float32)
    y = (x[:, :1] - 2.0 * x[:, 1:] > 0).astype(np.float32)
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(2,)),
                                 tf.keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    checkpoints = os.path.join(args.job_dir, "checkpoints", "epoch-{epoch:02d}")
    model.fit(x, y, epochs=args.epochs, batch_size=32, verbose=2,
              callbacks=[tf.keras.callbacks.ModelCheckpoint(checkpoints, save_weights_only=True)])
    model.save(os.path.join(args.job_dir, "model"))
    print(f"Saved {args.epochs} checkpoints and the model to {args.job_dir}", flush=True)


if __name__ == "__main__":
    main()
