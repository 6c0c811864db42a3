"""Logs: a job's log streamed while it runs and read back (5a, 5b), a big job's logs read back
and copied while it runs (5c), a live job followed (5d), and one controller copying the logs of
many jobs at once (5e)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness import (
    BENCH_LABEL,
    IMAGE,
    Bench,
    BenchError,
    Row,
    docker,
    engine_time,
    interleaved,
    no_admission_cap,
    python_script,
    timed,
)

LOG_REPLICAS = 4  # benchmark 5c's job: a master and 3 workers
DEFAULT_LINES, DEFAULT_REPLICA_LINES = 20_000, 250_000  # 5a/5b's job, 5c's replicas
MANY_LINES_SLEEP = "10"  # seconds 5c's replicas wait after printing
LOG_MARKER = b"of the log-streaming benchmark"
CLOSING_LINES = (b"Job completed successfully.", b"Job failed.", b"Job cancelled.")
COPY_JOBS, COPY_JOB_LINES = 50, 10_000  # figure 5e: jobs printing at once, lines each
FOLLOW_TICKS, FOLLOW_SKIPPED = 12, 2  # lines every 0.5 s; the first ones may predate the follower


def bench_logs(b: Bench) -> list[Row]:
    lines = b.args.lines or DEFAULT_LINES
    run = Row(
        "5a", f"Run a job printing {lines} lines, streaming its logs", "submit --stream-logs (BASIC)",
        "docker run --rm (attached) + pip install",
    )
    read = Row(
        "5b", f"Print the {lines} lines of a finished job", "jobs stream-logs JOB", "docker logs CONTAINER",
    )
    home = b.new_home()
    b.build_sdist()  # untimed, before the first sample
    container = f"bench-{b.run_id}-logs"
    job_ids = []

    # 5a: each side --log-job-runs times (default once: a 20k-line job takes ~10 s); the
    # job's output is what 5b reads.
    def ours_run(i: int) -> None:
        job_id = b.job_id("logs")
        seconds, result = b.submit(home, job_id, "--stream-logs", trainer_args=("--lines", str(lines)), timeout=600)
        got = result.stderr.count(LOG_MARKER)
        if got != lines:
            run.notes.append(f"run {i}: submit --stream-logs printed {got} of {lines} lines")
        run.ours.append(seconds)
        job_ids.append(job_id)

    def base_run(i: int) -> None:
        seconds, result = timed(b.pip_install_and_run("--lines", str(lines)), timeout=600)
        run.base.append(seconds)

    interleaved(b.args.log_job_runs, ours_run, base_run)
    if b.args.log_job_runs < b.args.repeat:
        run.notes.append(f"5a ran {b.args.log_job_runs} time(s) per side (--log-job-runs), not --repeat times.")

    # 5b: a finished job and an exited container with the same output, read N times each.
    docker("run", "--name", container, "--label", f"{BENCH_LABEL}={b.run_id}", IMAGE,
           *python_script("lines.py", str(lines)))
    job_id = job_ids[-1]

    def ours_read(i: int) -> None:
        seconds, result = b.aiptrain(home, "jobs", "stream-logs", job_id)
        got = result.stdout.count(LOG_MARKER)
        if got != lines:
            read.notes.append(f"run {i}: stream-logs printed {got} of {lines} lines")
        read.ours.append(seconds)

    def base_read(i: int) -> None:
        seconds, result = timed(["docker", "logs", container])
        got = result.stdout.count(LOG_MARKER)
        if got != lines:
            read.notes.append(f"run {i}: docker logs printed {got} of {lines} lines")
        read.base.append(seconds)

    interleaved(b.args.repeat, ours_read, base_read)
    docker("rm", "-f", container, check=False)
    return [run, read]


def four_replica_config(b: Bench) -> Path:
    config = b.tmp / "four-replicas.yaml"
    config.write_text("trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-4\n"
                      f"  workerType: n1-standard-4\n  workerCount: {LOG_REPLICAS - 1}\n")
    return config


def watch_copy(log_path: Path, expected: int, deadline: float) -> tuple[float, int]:
    """When the job log held every one of the `expected` benchmark lines (epoch seconds), and how
    many it got: once the job's closing line is there, a log that stops growing for 5 s is done
    (a controller that gave up copying). Reads only what was appended since the last look."""
    got, seen, tail, closed = 0, 0, b"", False
    copied_at = grew_at = time.time()
    while time.monotonic() < deadline:
        if log_path.exists():
            with log_path.open("rb") as handle:
                handle.seek(seen)
                data = handle.read()
            seen += len(data)
            block = tail + data
            cut = block.rfind(b"\n") + 1
            got += block[:cut].count(LOG_MARKER)
            closed = closed or any(line in block[:cut] for line in CLOSING_LINES)
            tail = block[cut:]
            if data:
                copied_at = grew_at = time.time()
        if closed and (got >= expected or time.time() - grew_at > 5):
            return copied_at, got
        time.sleep(0.05)
    raise BenchError(f"the job did not end in time ({log_path})")


def engine_span(log_path: Path) -> tuple[float, float]:
    """Epoch seconds of the first and the last benchmark line, as the engine stamped them."""
    stamps = []
    with log_path.open("rb") as handle:
        for line in handle:
            if LOG_MARKER in line:
                stamps.append(engine_time(json.loads(line)["time"]))
    return min(stamps), max(stamps)


def bench_log_throughput(b: Bench) -> list[Row]:
    lines = b.args.lines or DEFAULT_REPLICA_LINES
    total = LOG_REPLICAS * lines
    read = Row(
        "5c", f"Print the {LOG_REPLICAS} x {lines} lines of a finished job", "jobs stream-logs JOB > /dev/null",
        f"docker logs of {LOG_REPLICAS} exited containers, one after another, > /dev/null", "<=1.25x",
    )
    parallel = Row(
        "5c-par", f"Print the {LOG_REPLICAS} x {lines} lines of a finished job (parallel baseline)",
        "(the same samples as 5c)", f"{LOG_REPLICAS} docker logs at once, > /dev/null",
    )
    copy = Row(
        "5c-copy", f"Copy {LOG_REPLICAS} x {lines} lines into the job log while the job runs",
        "first line printed -> last line in the job log", "first -> last line stamped by the engine",
    )
    home = b.new_home()
    job_id = b.job_id("many_lines")
    names = [f"bench-{b.run_id}-many-lines-{n}" for n in range(LOG_REPLICAS)]

    # The job ends when its master does, and stops the workers then: every replica waits a while
    # after printing, so that a worker that started late still prints every line.
    b.submit(home, job_id, "--config", str(four_replica_config(b)),
             trainer_args=("--lines", str(lines), "--sleep", MANY_LINES_SLEEP))
    copied_at, got = watch_copy(home / "logs" / f"{job_id}.jsonl", total, time.monotonic() + 1200)
    b.ended.add(job_id)
    if got != total:
        copy.notes.append(f"the job log got {got} of {total} lines: a worker still printed when the master ended, "
                          "or the controller lost lines")
    first, last = engine_span(home / "logs" / f"{job_id}.jsonl")
    copy.ours.append(copied_at - first)
    copy.base.append(last - first)
    copy.notes.append(f"the job log kept up at {got / (copied_at - first):,.0f} lines/s; the engine took the "
                      f"replicas' output at {total / max(last - first, 1e-3):,.0f} lines/s.")

    with ThreadPoolExecutor(max_workers=LOG_REPLICAS) as pool:
        list(pool.map(lambda name: docker("run", "-d", "--name", name, "--label", f"{BENCH_LABEL}={b.run_id}",
                                          IMAGE, *python_script("lines.py", str(lines))), names))
    for name in names:
        docker("wait", name)
    # Counted once, untimed: every side must print every line.
    printed = b.tmp / "stream-logs.out"
    with printed.open("wb") as out:
        env = {**os.environ, "AIPTRAIN_HOME": str(home)}
        subprocess.run([*b.aiptrain_cmd, "jobs", "stream-logs", job_id], env=env, stdout=out, check=True)
    printed_lines = printed.read_bytes().count(LOG_MARKER)
    printed.unlink()
    if printed_lines != got:
        read.notes.append(f"stream-logs printed {printed_lines} of the job log's {got} lines")
    shown = sum(subprocess.run(["docker", "logs", name], capture_output=True).stdout.count(LOG_MARKER)
                for name in names)
    if shown != total:
        read.notes.append(f"docker logs printed {shown} of {total} lines")

    one_after_another = ["sh", "-ec", "; ".join(f"docker logs {name}" for name in names)]
    all_at_once = ["sh", "-ec", " ".join(f"docker logs {name} &" for name in names) + " wait"]

    def ours(i: int) -> None:
        read.ours.append(b.aiptrain(home, "jobs", "stream-logs", job_id, capture=False, timeout=600)[0])

    def base(i: int) -> None:
        read.base.append(timed(one_after_another, capture=False, timeout=600)[0])
        parallel.base.append(timed(all_at_once, capture=False, timeout=600)[0])

    interleaved(b.args.repeat, ours, base)
    parallel.ours = list(read.ours)
    docker("rm", "-f", *names, check=False)
    read.notes.append("5c: stream-logs prints one stream of the job's replicas, so its baseline reads the "
                      "containers one after another; 5c-par lets 4 docker logs use every core at once. "
                      "Target: >= 0.8x docker logs' throughput, i.e. <= 1.25x its time.")
    return [read, parallel, copy]


def tick_delays(process: subprocess.Popen, stream) -> list[float]:
    """Seconds from each `tick I TIME` line's TIME to its arrival on `stream`, until EOF."""
    delays = []
    for raw in iter(stream.readline, b""):
        arrived = time.time()
        words = raw.rstrip().split(b" ")
        if len(words) >= 3 and words[-3].endswith(b"tick") and int(words[-2]) >= FOLLOW_SKIPPED:
            delays.append(arrived - float(words[-1]))
    process.wait(timeout=120)
    return delays


def bench_follow_latency(b: Bench) -> list[Row]:
    follow = Row(
        "5d", "Follow a live job: a line's print -> its arrival", "jobs stream-logs JOB | reader",
        "docker logs -f CONTAINER | reader", "<0.2 s",
    )
    submitted = Row(
        "5d-submit", "Follow a live job: a line's print -> its arrival", "submit --stream-logs | reader",
        "(the same samples as 5d)", "<0.2 s",
    )
    home = b.new_home()
    env = {**os.environ, "AIPTRAIN_HOME": str(home), "AIPTRAIN_DEFAULT_RUNTIME": "minimal"}
    ticks = ("--ticks", str(FOLLOW_TICKS))

    def ours(i: int) -> None:
        job_id = b.job_id("follow")
        b.submit(home, job_id, trainer_args=ticks)
        reader = subprocess.Popen([*b.aiptrain_cmd, "jobs", "stream-logs", job_id], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        follow.ours += tick_delays(reader, reader.stdout)
        b.ended.add(job_id)
        job_id = b.job_id("follow_submit")
        b.jobs.append((job_id, home))
        submit = subprocess.Popen([*b.aiptrain_cmd, *b.submit_args(job_id, "--stream-logs", trainer_args=ticks)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        submitted.ours += tick_delays(submit, submit.stderr)
        b.ended.add(job_id)

    def base(i: int) -> None:
        name = f"bench-{b.run_id}-follow-{i}"
        docker("run", "-d", "--name", name, "--label", f"{BENCH_LABEL}={b.run_id}", IMAGE,
               *python_script("ticks.py", str(FOLLOW_TICKS)))
        reader = subprocess.Popen(["docker", "logs", "-f", name], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        follow.base += tick_delays(reader, reader.stdout)
        docker("rm", "-f", name, check=False)

    interleaved(b.args.repeat, ours, base)
    submitted.base = list(follow.base)
    for row in (follow, submitted):
        if not row.ours:
            row.error = "no tick line arrived"
            continue
        row.notes.append(f"delay of {len(row.ours)} lines, median {statistics.median(row.ours) * 1000:.0f} ms, "
                         f"max {max(row.ours) * 1000:.0f} ms (baseline: median "
                         f"{statistics.median(row.base) * 1000:.0f} ms, max {max(row.base) * 1000:.0f} ms); "
                         f"the first {FOLLOW_SKIPPED} lines of each run are not counted (the follower starts).")
    return [follow, submitted]


def bench_copy_many(b: Bench) -> list[Row]:
    """What one controller's log copying keeps up with: COPY_JOBS BASIC jobs printing at once."""
    row = Row("5e", f"Copy {COPY_JOBS} jobs x {COPY_JOB_LINES:,} lines at once into their job logs",
              "first line printed -> last line in its job log, over every job",
              "first -> last line stamped by the engine, over every job", "~1.0x")
    home = b.new_home()
    ids = [b.job_id(f"copy{i}") for i in range(COPY_JOBS)]
    with no_admission_cap(), ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda job_id: b.submit(home, job_id, trainer_args=(
            "--lines", str(COPY_JOB_LINES), "--sleep", "2")), ids))
        copies = list(pool.map(lambda job_id: watch_copy(home / "logs" / f"{job_id}.jsonl", COPY_JOB_LINES,
                                                         time.monotonic() + 1800), ids))
    b.ended.update(ids)
    spans = [engine_span(home / "logs" / f"{job_id}.jsonl") for job_id in ids]
    first, last = min(span[0] for span in spans), max(span[1] for span in spans)
    copied_at, got = max(copy[0] for copy in copies), sum(copy[1] for copy in copies)
    row.ours.append(copied_at - first)
    row.base.append(last - first)
    total = COPY_JOBS * COPY_JOB_LINES
    row.notes.append(f"5e: one controller copied {got:,} of {total:,} lines ({total - got:,} lost) at "
                     f"{got / (copied_at - first):,.0f} lines/s; the engine took them at "
                     f"{total / max(last - first, 1e-3):,.0f} lines/s. One thread per replica in one process.")
    return [row]
