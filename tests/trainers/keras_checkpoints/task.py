"""A Keras trainer in the style of the AI Platform 2.x samples: its CSVs come from gs:// paths it
builds from --bucket (no flag names them), read through TensorFlow's filesystem (tf.io.gfile,
tf.data) and pandas (gcsfs); a checkpoint per epoch, TensorBoard events and the final SavedModel
go to the --job-dir (gs:// too)."""

import argparse
import os

import numpy as np
import pandas as pd
import tensorflow as tf

COLUMNS = ["x1", "x2", "label"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    print(f"TensorFlow {tf.__version__}", flush=True)
    data = "gs://" + args.bucket + "/data"
    files = sorted(tf.io.gfile.glob(data + "/train-*.csv"))
    print(f"train files {len(files)}", flush=True)
    rows = tf.data.experimental.CsvDataset(files, [0.0, 0.0, 0.0], header=True)
    dataset = rows.map(lambda x1, x2, label: (tf.stack([x1, x2]), label)).shuffle(256, seed=0).batch(32)
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(2,)),
                                 tf.keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    checkpoints = os.path.join(args.job_dir, "checkpoints", "epoch-{epoch:02d}")
    model.fit(dataset, epochs=args.epochs, verbose=2, callbacks=[
        tf.keras.callbacks.ModelCheckpoint(checkpoints, save_weights_only=True),
        tf.keras.callbacks.TensorBoard(os.path.join(args.job_dir, "logs")),
    ])
    model.save(os.path.join(args.job_dir, "model"))
    frame = pd.read_csv(data + "/eval.csv")  # pandas reads gs:// through gcsfs
    accuracy = model.evaluate(frame[COLUMNS[:2]].values, frame["label"].values, verbose=0)[1]
    print(f"eval rows {len(frame)}", flush=True)
    again = tf.keras.models.load_model(os.path.join(args.job_dir, "model"))
    same = np.allclose(again.predict(frame[COLUMNS[:2]].values), model.predict(frame[COLUMNS[:2]].values))
    print(f"reloaded from gs:// and predicts the same: {same}; accuracy {accuracy:.2f}", flush=True)


if __name__ == "__main__":
    main()
