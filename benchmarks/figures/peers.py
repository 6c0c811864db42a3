"""The closest peer: BASIC and STANDARD_1 jobs beside TorchX's local_docker scheduler (9), which
the `bench` extra brings; without it the figure says "skipped"."""

from __future__ import annotations

import time

from harness import BENCH_EXTRA_MISSING, SLEEP_SECONDS, STANDARD_1_REPLICAS, Bench, BenchError, Row, interleaved

# Figure 9 pauses after each sample (and its untimed clean-up): the engine goes on cleaning up
# removed containers for a moment, which slowed whichever sample came next (measured here: a
# submit right after TorchX's container was removed took up to twice as long to start up).
ENGINE_SETTLE_SECONDS = 1.0


def torchx_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchx") is not None


def bench_torchx(b: Bench) -> list[Row]:
    warm = Row(
        "9a", "BASIC submit -> SUCCEEDED vs TorchX (trainer installed before)", "submit --stream-logs, resubmit",
        "TorchX local_docker: run, follow the log, wait", "<=0.6x",
    )
    cold = Row(
        "9b", "BASIC submit -> SUCCEEDED vs TorchX (first submit: build + install)", "submit --stream-logs, fresh home",
        "(the same TorchX samples as 9a)",
    )
    start = Row(
        "9c", f"STANDARD_1 submit -> {STANDARD_1_REPLICAS} replicas RUNNING vs TorchX", "submit --scale-tier standard-1, "
        "resubmit", f"TorchX local_docker: run {STANDARD_1_REPLICAS} replicas (returns once started)",
    )
    rows = [warm, cold, start]
    if not torchx_installed():
        for row in rows:
            row.skipped = BENCH_EXTRA_MISSING.format("torchx")
        return rows
    home = b.new_home()
    b.submit(home, b.job_id("torchx_prime"), "--stream-logs")  # builds the sdist and installs it, untimed

    def ours(i: int) -> None:
        for row, where in ((warm, home), (cold, b.new_home())):
            seconds, result = b.submit(where, b.job_id("torchx_basic"), "--stream-logs")
            if b"SUCCEEDED" not in result.stdout:
                raise BenchError(f"the BASIC job did not succeed: {result.stdout.decode()[-300:]}")
            row.ours.append(seconds)
            time.sleep(ENGINE_SETTLE_SECONDS)
        job_id = b.job_id("torchx_std1")
        seconds, _ = b.submit(home, job_id, "--scale-tier", "standard-1", trainer_args=("--sleep", SLEEP_SECONDS))
        start.ours.append(seconds)
        b.cancel(home, job_id)
        time.sleep(ENGINE_SETTLE_SECONDS)

    def base(i: int) -> None:
        warm.base.append(b.torchx("--until", "succeeded"))
        time.sleep(ENGINE_SETTLE_SECONDS)
        start.base.append(b.torchx("--until", "running", "--replicas", str(STANDARD_1_REPLICAS),
                                   trainer_args=("--sleep", SLEEP_SECONDS)))
        time.sleep(ENGINE_SETTLE_SECONDS)

    interleaved(b.args.repeat, ours, base)
    cold.base = list(warm.base)
    warm.notes.append(
        "9: TorchX 'local_docker' driven through its Python API (benchmarks/torchx_app.py, its own process, so its "
        "imports count as aiptrain's CLI start-up does), the trainer's source bind-mounted at /workspace "
        "(specs.BindMount, no image build). TorchX leaves its containers (removed after each run, untimed) and "
        "keeps no record; aiptrain's time includes removing the job's containers and recording the job. "
        f"Each sample is followed by an untimed {ENGINE_SETTLE_SECONDS:g} s pause for the engine's clean-up."
    )
    cold.notes.append("9b: each aiptrain sample in a fresh AIPTRAIN_HOME: the sdist (and wheel) build and the install "
                      "are counted (the benchmark trainer has no setup.py of its own, so its pure wheel is unpacked on "
                      "the host, aiptrain.installs); TorchX's side has no install step (the source is mounted).")
    return rows
