"""MultiWorkerMirroredStrategy with a custom training loop: fits y = 3x + 1.

Every replica (chief and workers) runs this same program in lock step: each holds a copy
of the variables and the gradients are all-reduced across replicas at every step. All
replicas must also take part in saving the checkpoint, so the chief writes it to
`<job-dir>/checkpoints/ckpt-<steps>` and each worker writes its copy to a temporary
directory that it deletes afterwards (TensorFlow's documented pattern).

The loop is a custom one (no Keras `fit`, which fails under this strategy with Keras 3)
and updates the variables by hand, so it needs no Keras at all.
"""

import argparse
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf  # noqa: E402

TRUE_WEIGHT, TRUE_BIAS = 3.0, 1.0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", required=True, help="where the chief writes its checkpoint")
    parser.add_argument("--steps", type=int, default=100, help="training steps, the same on every replica")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per replica")
    parser.add_argument("--learning-rate", type=float, default=0.2)
    return parser.parse_args(argv)


def log(message):
    print(message, flush=True)


def dataset_fn(per_replica_batch_size):
    def make(input_context):
        # Each worker reads its own synthetic stream: y = 3x + 1 plus a little noise.
        seed = input_context.input_pipeline_id
        x = tf.random.stateless_uniform([4096, 1], seed=[seed, 1], minval=-1.0, maxval=1.0)
        noise = tf.random.stateless_normal([4096, 1], seed=[seed, 2], stddev=0.01)
        y = TRUE_WEIGHT * x + TRUE_BIAS + noise
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096, seed=seed)
        return dataset.repeat().batch(per_replica_batch_size)

    return make


def is_chief(resolver):
    """The chief saves the real checkpoint; without a `chief` in the cluster, worker 0 does."""
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None or task_type == "chief":
        return True
    return task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().as_dict()


def main(argv=None):
    args = parse_args(argv)
    # The strategy must exist before any other TensorFlow op runs.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type not in (None, "chief", "worker"):
        log(f"{task_type} {task_id}: not part of the training cluster, nothing to do")
        return
    me = f"{task_type} {task_id}"
    log(f"{me}: {strategy.num_replicas_in_sync} replicas in sync")

    with strategy.scope():
        # SUM: each replica's update is its share of the global-batch gradient.
        weight = tf.Variable(0.0, name="weight", aggregation=tf.VariableAggregation.SUM)
        bias = tf.Variable(0.0, name="bias", aggregation=tf.VariableAggregation.SUM)
        step = tf.Variable(0, dtype=tf.int64, name="step")

    learning_rate = args.learning_rate
    global_batch_size = args.batch_size * strategy.num_replicas_in_sync
    dataset = strategy.distribute_datasets_from_function(dataset_fn(args.batch_size))
    iterator = iter(dataset)

    @tf.function
    def train_step(iterator):
        def replica_fn(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                per_example = tf.square(weight * x + bias - y)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
            grad_w, grad_b = tape.gradient(loss, [weight, bias])
            weight.assign_sub(learning_rate * grad_w)
            bias.assign_sub(learning_rate * grad_b)
            return loss

        losses = strategy.run(replica_fn, args=(next(iterator),))
        step.assign_add(1)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    report_every = max(1, args.steps // 5)
    for i in range(1, args.steps + 1):
        loss = train_step(iterator)
        if i % report_every == 0:
            log(f"{me}: step {i}: loss={float(loss):.6f} weight={float(weight.numpy()):.4f} "
                f"bias={float(bias.numpy()):.4f}")

    # Every replica saves (saving may need collective ops); only the chief's copy is kept.
    chief = is_chief(resolver)
    if chief:
        checkpoint_dir = os.path.join(args.job_dir, "checkpoints")
        tf.io.gfile.makedirs(checkpoint_dir)
    else:
        checkpoint_dir = tempfile.mkdtemp(prefix=f"workertemp_{task_id}_")
    checkpoint = tf.train.Checkpoint(weight=weight, bias=bias, step=step)
    manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=1)
    path = manager.save(checkpoint_number=args.steps)
    if chief:
        log(f"{me}: trained {int(step.numpy())} steps: weight={float(weight.numpy()):.4f} "
            f"bias={float(bias.numpy()):.4f} (want {TRUE_WEIGHT}, {TRUE_BIAS})")
        log(f"{me}: saved checkpoint {path}")
        wait_for_workers(resolver, task_type, task_id)
    else:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        log(f"{me}: done")
        announce_done(task_type, task_id)
    leave(0)


# Leaving. The chief hosts TensorFlow's coordination service: a replica that is still
# tearing down when the chief's process ends loses its heartbeat and fails, and a chief
# that ends after the others can hang on gRPC for about a minute. So every replica
# leaves with os._exit once its work is done, and the chief leaves last: each worker
# puts a key in the coordination service's key-value store as its very last act, and
# the chief waits for all of those keys.
DONE_KEY = "trainer/done/{}/{}"


def announce_done(task_type, task_id):
    from tensorflow.python.eager import context

    try:
        context.context().set_config_key_value(DONE_KEY.format(task_type, task_id), "1")
    except Exception as exc:  # noqa: BLE001 - the chief may already be gone: the work is done
        log(f"{task_type} {task_id}: could not tell the chief it is done: {exc}")


def wait_for_workers(resolver, task_type, task_id):
    from tensorflow.python.eager import context

    cluster = resolver.cluster_spec().as_dict()
    others = [
        (job, index)
        for job in ("chief", "worker")
        for index in range(len(cluster.get(job, [])))
        if (job, index) != (task_type, task_id)
    ]
    for job, index in others:
        context.context().get_config_key_value(DONE_KEY.format(job, index))  # blocks until set
    if others:
        log(f"{task_type} {task_id}: all {len(others)} other replicas are done")


def leave(status):
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - report, then leave without gRPC's shutdown
        import traceback

        traceback.print_exc()
        leave(1)
