"""PyTorch DistributedDataParallel on CPU (gloo): fits y = 3x + 1 with a one-weight model.

The process group comes from the environment alone: `init_process_group("gloo")` reads
MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK, which aiptrain sets on every replica from
the cluster (the primary is rank 0, worker i is rank i + 1). Each rank trains on its own
synthetic shard; DDP all-reduces the gradients, so every rank ends with the same weights.
Rank 0 checks that every rank took part (an all_reduce of the ranks) and writes
`<job-dir>/result.json`. Parameter servers and evaluators get no RANK: they have nothing
to do here and exit at once.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

TRUE_WEIGHT, TRUE_BIAS = 3.0, 1.0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-dir", required=True, help="where rank 0 writes result.json")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--learning-rate", type=float, default=0.2)
    return parser.parse_args(argv)


def log(message):
    print(message, flush=True)


def main(argv=None):
    args = parse_args(argv)
    if "RANK" not in os.environ:
        log("not part of the process group (no RANK): nothing to do")
        return
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK
    rank, world_size = dist.get_rank(), dist.get_world_size()
    log(f"rank {rank} of {world_size}: joined the group at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")

    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    for step in range(1, args.steps + 1):
        x = torch.rand(args.batch_size, 1, generator=data) * 2 - 1
        y = TRUE_WEIGHT * x + TRUE_BIAS
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        if step % max(1, args.steps // 5) == 0:
            log(f"rank {rank}: step {step}: loss={loss.item():.6f}")

    # Every rank contributes rank + 1: the sum proves they all took part.
    ranks = torch.tensor([float(rank + 1)])
    dist.all_reduce(ranks)
    weight, bias = model.module.weight.item(), model.module.bias.item()
    log(f"rank {rank}: trained {args.steps} steps: weight={weight:.4f} bias={bias:.4f} "
        f"(want {TRUE_WEIGHT}, {TRUE_BIAS})")
    if rank == 0:
        os.makedirs(args.job_dir, exist_ok=True)
        result = {"world_size": world_size, "rank_sum": ranks.item(), "weight": weight, "bias": bias,
                  "steps": args.steps}
        with open(os.path.join(args.job_dir, "result.json"), "w") as handle:
            json.dump(result, handle)
        log(f"rank 0: wrote {os.path.join(args.job_dir, 'result.json')}")
    # Leave together, and without the process group's C++ teardown: rank 0 hosts the group's
    # store, and a rank that is still tearing down when it goes can abort ("terminate called
    # without an active exception"). Everything is written by now.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
