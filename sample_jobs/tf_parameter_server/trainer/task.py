"""ParameterServerStrategy with a ClusterCoordinator: fits y = 3x + 1 by linear regression.

AI Platform runs the same command on every replica, so this module looks at TF_CONFIG:

- `worker` and `ps` start a tf.distribute.Server and serve until they are stopped
  (TensorFlow gives them no "job finished" signal; the service stops them once the
  chief has exited 0);
- `chief` builds the model (its variables live on the parameter servers), schedules
  `--steps` training steps on the workers through the coordinator, and saves a
  checkpoint to `<job-dir>/checkpoints/ckpt-<steps>`;
- an `evaluator` is not part of the training cluster: this sample has nothing for it.

The training loop is a custom one (no Keras `fit`, which fails under this strategy with
Keras 3) and updates the variables by hand, so it needs no Keras at all.
"""

import argparse
import json
import os
import signal
import sys
import threading
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf  # noqa: E402

TRUE_WEIGHT, TRUE_BIAS = 3.0, 1.0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", required=True, help="where the chief writes its checkpoint")
    parser.add_argument("--steps", type=int, default=200, help="training steps the coordinator schedules")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    return parser.parse_args(argv)


def log(message):
    print(message, flush=True)


def serve(resolver):
    """Run this replica's gRPC server until the process is stopped.

    The server's join() never returns. It runs in a daemon thread so that the main thread
    stays in Python and can act on SIGTERM (a Python PID 1 ignores SIGTERM without a
    handler, which would make every `docker stop` wait for its grace period)."""
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    log(f"{resolver.task_type} {resolver.task_id} serving at {server.target}")

    def stopped(signum, frame):
        log(f"{resolver.task_type} {resolver.task_id} stopping on signal {signum}")
        sys.stdout.flush()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    thread = threading.Thread(target=server.join, name="tf-server", daemon=True)
    thread.start()
    thread.join()  # interruptible by signals: the handler above ends the process


def dataset_fn(batch_size):
    def make(input_context):
        # Each worker gets its own synthetic stream: y = 3x + 1 plus a little noise.
        seed = input_context.input_pipeline_id if input_context else 0
        x = tf.random.stateless_uniform([4096, 1], seed=[seed, 1], minval=-1.0, maxval=1.0)
        noise = tf.random.stateless_normal([4096, 1], seed=[seed, 2], stddev=0.01)
        y = TRUE_WEIGHT * x + TRUE_BIAS + noise
        per_replica = input_context.get_per_replica_batch_size(batch_size) if input_context else batch_size
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096, seed=seed).repeat().batch(per_replica)

    return make


def train(resolver, args):
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    cluster = resolver.cluster_spec().as_dict()
    log(f"chief: connected to {len(cluster.get('worker', []))} workers "
        f"and {len(cluster.get('ps', []))} parameter servers")

    with strategy.scope():
        weight = tf.Variable(0.0, name="weight")
        bias = tf.Variable(0.0, name="bias")
        step = tf.Variable(0, dtype=tf.int64, name="step")

    learning_rate = args.learning_rate

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn(args.batch_size))

    per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
    per_worker_iterator = iter(per_worker_dataset)

    @tf.function
    def train_step(iterator):
        def replica_fn(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(weight * x + bias - y))
            grad_w, grad_b = tape.gradient(loss, [weight, bias])
            weight.assign_sub(learning_rate * grad_w)
            bias.assign_sub(learning_rate * grad_b)
            step.assign_add(1)
            return loss

        losses = strategy.run(replica_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    report_every = max(1, args.steps // 5)
    for i in range(1, args.steps + 1):
        loss = coordinator.schedule(train_step, args=(per_worker_iterator,))
        if i % report_every == 0:
            coordinator.join()
            log(f"step {i}: loss={float(loss.fetch()):.6f} weight={float(weight.numpy()):.4f} "
                f"bias={float(bias.numpy()):.4f}")
    coordinator.join()

    checkpoint_dir = os.path.join(args.job_dir, "checkpoints")
    tf.io.gfile.makedirs(checkpoint_dir)
    checkpoint = tf.train.Checkpoint(weight=weight, bias=bias, step=step)
    manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=1)
    path = manager.save(checkpoint_number=args.steps)
    log(f"chief: trained {int(step.numpy())} steps: weight={float(weight.numpy()):.4f} "
        f"bias={float(bias.numpy()):.4f} (want {TRUE_WEIGHT}, {TRUE_BIAS})")
    log(f"chief: saved checkpoint {path}")


def main(argv=None):
    args = parse_args(argv)
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    if not tf_config.get("cluster"):
        sys.exit("TF_CONFIG has no cluster: this sample needs a distributed (CUSTOM) job with workers and ps.")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    task_type = resolver.task_type
    if task_type in ("worker", "ps"):
        # As in TensorFlow's guide: let the chief, not gRPC, decide what a lost peer means.
        os.environ["GRPC_FAIL_FAST"] = "use_caller"
        serve(resolver)
        return
    if task_type != "chief":
        log(f"{task_type} {resolver.task_id}: not part of the training cluster, nothing to do")
        return
    try:
        train(resolver, args)
    except Exception:  # noqa: BLE001 - report, then leave without gRPC's shutdown
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    # A normal interpreter exit can hang for about a minute on gRPC channels to the
    # workers and ps; everything is written, so leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
