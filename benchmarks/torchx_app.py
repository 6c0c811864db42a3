#!/usr/bin/env python3
"""The TorchX side of figure 9: what a TorchX user's launch script does with the
`local_docker` scheduler, run as its own process (so interpreter and imports count, as
aiptrain's CLI start-up does).

    python benchmarks/torchx_app.py --workspace DIR --replicas 1 --until succeeded
    python benchmarks/torchx_app.py --workspace DIR --replicas 8 --until running

The trainer's source directory is bind-mounted read-only at /workspace (specs.BindMount)
and put on PYTHONPATH: TorchX's cheapest way to run local code, with no image build (its
workspace feature would `docker build` an image per run). `--until succeeded` follows the
replica's log until it exits (runner.log_lines with should_tail, as `torchx run --log`
does), then asks for the final state; `--until running` returns once every replica's
container runs (runner.run returns after starting them). Prints the app handle and state
on stdout; exit status 0 on SUCCEEDED (or RUNNING), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys

WORKSPACE = "/workspace"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace", required=True, help="the trainer's source directory (holds the package)")
    parser.add_argument("--image", default="aiptrain/runtime:minimal")
    parser.add_argument("--module", default="benchtrainer.task")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--until", choices=("succeeded", "running"), default="succeeded")
    parser.add_argument("--name", default="bench")
    parser.add_argument("trainer_args", nargs="*")
    args = parser.parse_args()

    from torchx import specs
    from torchx.runner import get_runner

    role = specs.Role(
        name="trainer",
        image=args.image,
        entrypoint="python3",
        args=["-m", args.module, *args.trainer_args],
        env={"PYTHONPATH": WORKSPACE, "PYTHONUNBUFFERED": "1"},
        num_replicas=args.replicas,
        mounts=[specs.BindMount(src_path=args.workspace, dst_path=WORKSPACE, read_only=True)],
    )
    app = specs.AppDef(name=args.name, roles=[role])
    with get_runner() as runner:
        handle = runner.run(app, scheduler="local_docker")
        print(handle, flush=True)
        if args.until == "running":
            state = runner.status(handle).state
            print(state.name)
            return 0 if state == specs.AppState.RUNNING else 1
        for line in runner.log_lines(handle, role.name, k=0, should_tail=True):
            sys.stderr.write(line)
        status = runner.wait(handle, wait_interval=0.05)
        print(status.state.name if status else "UNKNOWN")
        return 0 if status and status.state == specs.AppState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
