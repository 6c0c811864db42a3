"""tf.estimator.train_and_evaluate on a chief, workers, parameter servers and an evaluator:
fits y = 3x + 1 by linear regression.

Every replica runs this module; the Estimator reads TF_CONFIG and plays its part:

- the chief and the workers train asynchronously (between-graph replication, variables on
  the parameter servers) until the global step reaches `--steps`; the chief writes the
  checkpoints to `<job-dir>/model`;
- `ps` serves the variables until it is stopped (it never finishes by itself);
- the evaluator is outside the training cluster: it evaluates each new checkpoint in the
  job dir, records each evaluation as `<job-dir>/model/export/metrics/metrics-<step>.json`,
  and exits on its own after evaluating the final checkpoint (global step >= `--steps`).
  That last evaluation happens after the chief has exited: aiptrain gives evaluators a
  grace period (AIPTRAIN_EVALUATOR_GRACE_SECONDS) to finish it before stopping them.
"""

import argparse
import json
import os
import signal
import sys
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf  # noqa: E402

TRUE_WEIGHT, TRUE_BIAS = 3.0, 1.0
tf.get_logger().setLevel("ERROR")  # tf.estimator and tf.compat.v1 warn of their deprecation at every call


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", required=True, help="where the checkpoints and evaluations go")
    parser.add_argument("--steps", type=int, default=200, help="global steps to train")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--eval-steps", type=int, default=10)
    return parser.parse_args(argv)


def log(message):
    print(message, flush=True)


def input_fn(batch_size, seed):
    def batch(_):
        x = tf.random.uniform([batch_size], -1.0, 1.0, seed=seed)
        return {"x": x}, TRUE_WEIGHT * x + TRUE_BIAS

    return lambda: tf.data.Dataset.from_tensors(0).repeat().map(batch)


def model_fn(features, labels, mode, params):
    weight = tf.compat.v1.get_variable("weight", [], initializer=tf.compat.v1.zeros_initializer())
    bias = tf.compat.v1.get_variable("bias", [], initializer=tf.compat.v1.zeros_initializer())
    predictions = weight * features["x"] + bias
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"y": predictions})
    loss = tf.reduce_mean(tf.square(predictions - labels))
    if mode == tf.estimator.ModeKeys.EVAL:
        metrics = {
            "mae": tf.compat.v1.metrics.mean_absolute_error(labels, predictions),
            "weight": tf.compat.v1.metrics.mean(weight),
            "bias": tf.compat.v1.metrics.mean(bias),
        }
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(params["learning_rate"])
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class MetricsExporter(tf.estimator.Exporter):
    """Records every evaluation the evaluator makes as JSON beside the checkpoints."""

    @property
    def name(self):
        return "metrics"

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        step = int(eval_result[tf.compat.v1.GraphKeys.GLOBAL_STEP])
        record = {key: float(value) for key, value in eval_result.items()}
        record.update(checkpoint=os.path.basename(checkpoint_path), final=bool(is_the_final_export))
        tf.io.gfile.makedirs(export_path)
        path = os.path.join(export_path, f"metrics-{step}.json")
        with tf.io.gfile.GFile(path, "w") as handle:
            handle.write(json.dumps(record, sort_keys=True))
        log(f"evaluated {record['checkpoint']}: step={step} loss={record['loss']:.5f} "
            f"weight={record['weight']:.3f} bias={record['bias']:.3f}")
        return path


def train_and_evaluate(args, task):
    config = tf.estimator.RunConfig(
        model_dir=os.path.join(args.job_dir, "model"),
        save_checkpoints_steps=max(1, args.steps // 4),
        save_checkpoints_secs=None,
        log_step_count_steps=max(1, args.steps // 4),
    )
    estimator = tf.estimator.Estimator(model_fn, config=config, params={"learning_rate": args.learning_rate})
    train_spec = tf.estimator.TrainSpec(input_fn(args.batch_size, seed=None), max_steps=args.steps)
    eval_spec = tf.estimator.EvalSpec(
        input_fn(args.batch_size, seed=1), steps=args.eval_steps, exporters=[MetricsExporter()],
        start_delay_secs=0, throttle_secs=1,
    )
    tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    log(f"{task['type']} {task['index']}: done")


def main(argv=None):
    args = parse_args(argv)
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"type": "chief", "index": 0})
    log(f"{task['type']} {task['index']} starting")
    # A Python PID 1 ignores SIGTERM without a handler, and a parameter server blocks in C++
    # for ever: the Estimator runs in a thread and the main thread exits when stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(128 + signum))
    failed = []

    def run():
        try:
            train_and_evaluate(args, task)
        except BaseException as exc:  # noqa: BLE001 - reported, then the process fails
            failed.append(exc)
            raise

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
    sys.stdout.flush()
    sys.stderr.flush()
    # A normal exit can hang on gRPC channels to the other replicas: leave at once.
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()
