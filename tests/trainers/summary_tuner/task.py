"""A tuning trainer that reports its metric only through TensorFlow summaries, as the
service's TensorFlow trainers did (no cloudml-hypertune): --epochs scalars named --tag, by
tf.summary.scalar (TF2, a tensor, into <job-dir>/validation) or, with --style tf1, as simple
values into <job-dir>/eval. The
value at epoch e is lr * (e + 1): the final one is lr * epochs. --pause seconds after the
last report (a trainer saving its model), during which the study may look at the reports.
"""

import argparse
import os
import time

import tensorflow as tf


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--tag", default="epoch_accuracy")
    parser.add_argument("--style", choices=["tf1", "tf2"], default="tf2")
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--job-dir", required=True)
    args = parser.parse_args()

    for epoch in range(args.epochs):
        value = args.lr * (epoch + 1)
        if args.style == "tf1":  # a TF1/Keras-1 style Summary proto with simple_value, in a subdirectory
            with tf.compat.v1.Graph().as_default():  # TF1's FileWriter is a graph-mode API
                writer = tf.compat.v1.summary.FileWriter(os.path.join(args.job_dir, "eval"))
                summary = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=args.tag, simple_value=value)])
                writer.add_summary(summary, epoch)
                writer.close()
        else:
            writer = tf.summary.create_file_writer(os.path.join(args.job_dir, "validation"))
            with writer.as_default():
                tf.summary.scalar(args.tag, value, step=epoch)
            writer.close()
        print(f"epoch {epoch}: {args.tag}={value}", flush=True)
        time.sleep(0.2)
    time.sleep(args.pause)


if __name__ == "__main__":
    main()
