"""Tuning: a hyperparameter study as one job beside the same trials submitted by hand (6)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from harness import Bench, BenchError, Row, interleaved

STUDY_TRIALS, STUDY_PARALLEL = 6, 2


def bench_study(b: Bench) -> list[Row]:
    row = Row(
        "6", f"HP study of {STUDY_TRIALS} trials, {STUDY_PARALLEL} at a time (vs the same jobs by hand)",
        f"submit --stream-logs of a {STUDY_TRIALS}-trial study (no-op trainer)",
        f"{STUDY_TRIALS} BASIC submit --stream-logs, {STUDY_PARALLEL} at a time",
    )
    config = b.tmp / "study.yaml"
    config.write_text(
        "trainingInput:\n  hyperparameters:\n"
        f"    maxTrials: {STUDY_TRIALS}\n    maxParallelTrials: {STUDY_PARALLEL}\n"
        "    params:\n    - {parameterName: x, type: DOUBLE, minValue: 0, maxValue: 1}\n"
    )

    def ours(i: int) -> None:
        seconds, result = b.submit(b.new_home(), b.job_id("study"), "--config", str(config), "--stream-logs")
        if b"SUCCEEDED" not in result.stdout:
            raise BenchError(f"the study did not succeed: {result.stdout.decode()[-300:]}")
        row.ours.append(seconds)

    def base(i: int) -> None:
        home = b.new_home()
        start = time.perf_counter()
        job_ids = [f"{b.job_id('by_hand')}_{k}" for k in range(STUDY_TRIALS)]  # named before the threads race
        with ThreadPoolExecutor(max_workers=STUDY_PARALLEL) as pool:
            runs = [pool.submit(b.submit, home, job_id, "--stream-logs") for job_id in job_ids]
            for run in runs:
                run.result()
        row.base.append(time.perf_counter() - start)

    interleaved(b.args.repeat, ours, base)
    row.notes.append(
        "6's baseline runs the study's jobs by hand, as many at once as the study runs trials (the issue's "
        "3 at a time would compare different parallelism); ratio < 1 means the study costs less than its jobs."
    )
    return [row]
