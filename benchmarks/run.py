#!/usr/bin/env python3
"""aiptrain's benchmarks: each aiptrain operation timed side by side with a raw Docker
(or raw Python) baseline in the same run, N times, interleaved, so that both sides see
the same machine load.

    .venv/bin/python benchmarks/run.py [--repeat N] [--only 1,3] [--lines 20000]

Prints a table of medians (and minimums) with the ratio aiptrain / baseline, and
writes every sample to benchmarks/results/latest.json. Timings are never asserted:
this is a measuring tool, not a test. See benchmarks/README.md for what each number
means.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
IMAGE = "aiptrain/runtime:minimal"
JOB_LABEL = "aiptrain.job-id"  # the label aiptrain puts on its containers and networks
BENCH_LABEL = "aiptrain-bench"  # the label this script puts on its baseline containers
STANDARD_1_REPLICAS = 8  # 1 master + 4 workers + 3 parameter servers
TORCHX_APP = Path(__file__).resolve().parent / "torchx_app.py"  # the TorchX side of 9 and 10
TORCHX_LABEL = "torchx.pytorch.org/app-id"  # the label TorchX puts on its containers
TORCHX_NETWORK = "torchx"  # the one network TorchX's local_docker scheduler shares between apps
TORCHX_MISSING = "torchx not installed (pip install -e '.[bench]')"
# Figure 9 pauses after each sample (and its untimed clean-up): the engine goes on cleaning up
# removed containers for a moment, which slowed whichever sample came next (measured here: a
# submit right after TorchX's container was removed took up to twice as long to start up).
ENGINE_SETTLE_SECONDS = 1.0
SLEEP_SECONDS = "600"  # replicas that must stay up until cancelled
LOG_REPLICAS = 4  # benchmark 5c's job: a master and 3 workers
DEFAULT_LINES, DEFAULT_REPLICA_LINES = 20_000, 250_000  # 5a/5b's job, 5c's replicas
MANY_LINES_SLEEP = "10"  # seconds 5c's replicas wait after printing

# The trainer every aiptrain job here runs: it prints, optionally prints many lines,
# optionally sleeps, and ignores the --job-dir aiptrain appends.
TRAINER = textwrap.dedent(
    """\
    import argparse
    import sys
    import time

    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--ticks", type=int, default=0)
    args, _ = parser.parse_known_args()
    print("hello from the benchmark trainer", flush=True)
    for i in range(args.lines):
        sys.stdout.write(f"line {i:06d} of the log-streaming benchmark: 0123456789abcdef\\n")
    sys.stdout.flush()
    for i in range(args.ticks):
        time.sleep(0.5)
        print(f"tick {i} {time.time():.6f}", flush=True)
    if args.sleep:
        time.sleep(args.sleep)
    """
)
# The same output from a bare container (benchmark 5's baseline).
LINES_SCRIPT = (
    "import sys\n"
    "print('hello from the benchmark trainer', flush=True)\n"
    "for i in range({n}):\n"
    "    sys.stdout.write(f'line {{i:06d}} of the log-streaming benchmark: 0123456789abcdef\\n')\n"
    "sys.stdout.flush()\n"
)
# A line with the time it was written, every half second (benchmark 5d's live replica).
TICKS_SCRIPT = (
    "import time\n"
    "for i in range({n}):\n"
    "    time.sleep(0.5)\n"
    "    print(f'tick {{i}} {{time.time():.6f}}', flush=True)\n"
)
# What a replica runs before the trainer (aiptrain.planning.BOOTSTRAP's pip flags).
PIP_INSTALL = (
    "python3 -m pip install --user --no-index --no-deps --no-build-isolation --no-cache-dir "
    "--disable-pip-version-check --no-warn-script-location --quiet"
)


class BenchError(Exception):
    """A command the benchmark needs failed: the benchmark is reported as an error."""


@dataclass
class Row:
    """One line of the results table: aiptrain's samples and the baseline's."""

    key: str
    title: str
    ours_label: str
    base_label: str
    target: str = ""
    ours: list[float] = field(default_factory=list)
    base: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    skipped: str | None = None  # why the figure was not measured (an optional baseline is missing)
    unit: str = "s"

    def ratio(self) -> float | None:
        if not self.ours or not self.base or not statistics.median(self.base):
            return None
        return statistics.median(self.ours) / statistics.median(self.base)

    def to_dict(self) -> dict:
        def summary(samples: list[float]) -> dict | None:
            if not samples:
                return None
            return {
                "median": round(statistics.median(samples), 4),
                "min": round(min(samples), 4),
                "max": round(max(samples), 4),
                "samples": [round(s, 4) for s in samples],
            }

        ratio = self.ratio()
        return {
            "key": self.key,
            "title": self.title,
            "aiptrain": {"what": self.ours_label, **(summary(self.ours) or {})},
            "baseline": {"what": self.base_label, **(summary(self.base) or {})},
            "ratio_median": None if ratio is None else round(ratio, 3),
            "target": self.target,
            "unit": self.unit,
            "notes": self.notes,
            "error": self.error,
            "skipped": self.skipped,
        }


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.run_id = uuid.uuid4().hex[:6]
        self.tmp = Path(tempfile.mkdtemp(prefix="aiptrain-bench-"))
        self.tmp.chmod(0o755)  # replicas run as another user (nobody when we are root)
        self.package = self._write_trainer()
        self.sdist: Path | None = None
        self.jobs: list[tuple[str, Path]] = []  # (job ID, AIPTRAIN_HOME) of every job submitted
        self.ended: set[str] = set()  # jobs seen to end (cancelled, or succeeded under --stream-logs)
        self.homes = 0
        self.torchx_ran = False
        self.torchx_network_existed = bool(docker("network", "ls", "-q", "--filter", f"name=^{TORCHX_NETWORK}$",
                                                  check=False).strip())
        self.user = "65534:65534" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}"
        script = Path(sys.executable).parent / "aiptrain"
        self.aiptrain_cmd = [str(script)] if script.exists() else [sys.executable, "-m", "aiptrain"]

    # -- fixtures ----------------------------------------------------------------------

    def _write_trainer(self) -> Path:
        package = self.tmp / "trainer-src" / "benchtrainer"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "task.py").write_text(TRAINER)
        return package

    def new_home(self) -> Path:
        """A fresh aiptrain installation: empty store, bucket, logs and cache."""
        self.homes += 1
        home = self.tmp / f"home-{self.homes}"
        home.mkdir()
        return home

    @property
    def job_prefix(self) -> str:
        return f"bench_{self.run_id}_"

    def job_id(self, name: str) -> str:
        return f"{self.job_prefix}{name}_{len(self.jobs)}"

    def build_sdist(self) -> Path:
        """The sdist aiptrain would stage for the trainer, for the pip-install baseline."""
        if self.sdist is None:
            from aiptrain.packaging import build_sdist

            out = self.tmp / "sdist"
            out.mkdir()
            out.chmod(0o755)
            self.sdist = build_sdist(self.package, out).path
            self.sdist.chmod(0o644)
        return self.sdist

    # -- running things ----------------------------------------------------------------

    def aiptrain(self, home: Path, *args: str, timeout: float = 300, check: bool = True,
                 capture: bool = True) -> tuple[float, subprocess.CompletedProcess]:
        env = {**os.environ, "AIPTRAIN_HOME": str(home), "AIPTRAIN_DEFAULT_RUNTIME": "minimal"}
        env.pop("AIPTRAIN_STAGING_BUCKET", None)
        return timed([*self.aiptrain_cmd, *args], env=env, timeout=timeout, check=check, capture=capture)

    def submit(self, home: Path, job_id: str, *flags: str, trainer_args: tuple[str, ...] = (),
               job_dir: Path | None = None, timeout: float = 300) -> tuple[float, subprocess.CompletedProcess]:
        self.jobs.append((job_id, home))
        job_dir = job_dir or self.tmp / "job-dirs" / job_id
        seconds, result = self.aiptrain(
            home, "jobs", "submit", "training", job_id,
            "--package-path", str(self.package),
            "--module-name", "benchtrainer.task",
            "--job-dir", str(job_dir),
            "--region", "us-central1",
            "--runtime-version", "minimal",
            *flags, "--", *trainer_args,
            timeout=timeout,
        )
        if "--stream-logs" in flags:
            self.ended.add(job_id)  # it exited 0: the job succeeded
        return seconds, result

    def cancel(self, home: Path, job_id: str) -> float:
        seconds, _ = self.aiptrain(home, "jobs", "cancel", job_id, timeout=120)
        self.ended.add(job_id)
        return seconds

    def torchx(self, *args: str, trainer_args: tuple[str, ...] = ()) -> float:
        """Wall time of the TorchX launch script (benchmarks/torchx_app.py), process start to exit;
        the containers it leaves (TorchX removes none) are removed afterwards, untimed."""
        self.torchx_ran = True
        try:
            seconds, _ = timed([sys.executable, str(TORCHX_APP), "--workspace", str(self.package.parent),
                                "--name", self.torchx_name, *args, "--", *trainer_args])
        finally:
            self.remove_torchx_apps()
        return seconds

    @property
    def torchx_name(self) -> str:
        return f"bench{self.run_id}"  # TorchX makes each app ID <name>-<random>

    def remove_torchx_apps(self) -> None:
        template = f'{{{{.Label "{TORCHX_LABEL}"}}}} {{{{.ID}}}}'
        lines = docker("ps", "-a", "--filter", f"label={TORCHX_LABEL}", "--format", template, check=False).split("\n")
        ids = [line.split()[1] for line in lines if line.startswith(f"{self.torchx_name}-")]
        if ids:
            docker("rm", "-f", *ids, check=False)

    def running_replicas(self, job_id: str) -> int:
        out = docker("ps", "-q", "--filter", f"label={JOB_LABEL}={job_id}", "--filter", "status=running")
        return len(out.split())

    # -- cleanup -----------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        """Cancel every job still active, then remove whatever is left; return what was left."""
        leftovers = []
        for job_id, home in self.jobs:
            if job_id in self.ended:
                continue
            try:
                self.aiptrain(home, "jobs", "cancel", job_id, timeout=120, check=False)
            except Exception:  # noqa: BLE001 - best effort; the docker sweep below follows
                pass
        # A job that ended has had its containers and network removed by its controller:
        # anything of ours still labelled is a leftover, reported and removed.
        template = f'{{{{.Label "{JOB_LABEL}"}}}} {{{{.ID}}}}'
        for kind in ("container", "network"):
            every = ["-a"] if kind == "container" else []
            lines = docker(kind, "ls", *every, "--filter", f"label={JOB_LABEL}", "--format", template,
                           check=False).splitlines()
            ours = [line.split() for line in lines if line.startswith(self.job_prefix)]
            for job_id, _ in ours:
                leftovers.append(f"{kind} of job {job_id} left by aiptrain")
            if ours:
                docker(kind, "rm", *(["-f"] if kind == "container" else []), *[i for _, i in ours], check=False)
        # The baselines' containers and networks, normally removed as each benchmark ends.
        ids = docker("ps", "-aq", "--filter", f"label={BENCH_LABEL}={self.run_id}", check=False).split()
        if ids:
            docker("rm", "-f", *ids, check=False)
        nets = docker("network", "ls", "-q", "--filter", f"label={BENCH_LABEL}={self.run_id}", check=False).split()
        if nets:
            docker("network", "rm", *nets, check=False)
        self.remove_torchx_apps()
        for home in sorted(self.tmp.glob("home-*")):  # each home's controller goes with it
            if (home / "controller.lock").exists():
                self.aiptrain(home, "controller", "stop", timeout=120, check=False)
        if self.torchx_ran and not self.torchx_network_existed:
            docker("network", "rm", TORCHX_NETWORK, check=False)  # TorchX's network, made by this run
        shutil.rmtree(self.tmp, ignore_errors=True)
        return leftovers


# -- helpers ---------------------------------------------------------------------------


def timed(cmd: list[str], env: dict | None = None, timeout: float = 300, check: bool = True,
          capture: bool = True) -> tuple[float, subprocess.CompletedProcess]:
    """Wall time of one command, from spawn to exit."""
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    start = time.perf_counter()
    result = subprocess.run(cmd, env=env, stdout=out, stderr=out, timeout=timeout)
    seconds = time.perf_counter() - start
    if check and result.returncode != 0:
        raise BenchError(
            f"`{' '.join(cmd[:6])} ...` exited {result.returncode}: "
            f"{(result.stderr or b'').decode(errors='replace').strip()[-800:]}"
        )
    return seconds, result


def docker(*args: str, check: bool = True) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=180)
    if check and result.returncode != 0:
        raise BenchError(f"`docker {' '.join(args[:4])} ...` failed: {result.stderr.strip()[-500:]}")
    return result.stdout


def interleaved(repeat: int, ours, base) -> None:
    """Run both sides `repeat` times, alternating which goes first."""
    for i in range(repeat):
        for action in ((ours, base) if i % 2 == 0 else (base, ours)):
            action(i)


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


# -- the benchmarks --------------------------------------------------------------------


def bench_startup(b: Bench) -> list[Row]:
    row = Row("1", "CLI start-up", "aiptrain --help", f"{Path(sys.executable).name} -c 'import click'", "~1.0x")
    help_cmd = [*b.aiptrain_cmd, "--help"]
    click_cmd = [sys.executable, "-c", "import click"]
    timed(help_cmd), timed(click_cmd)  # warm the page cache; not counted
    interleaved(
        b.args.repeat,
        lambda i: row.ours.append(timed(help_cmd)[0]),
        lambda i: row.base.append(timed(click_cmd)[0]),
    )
    return [row]


def bench_basic(b: Bench) -> list[Row]:
    run = Row(
        "2a", "BASIC submit -> SUCCEEDED (vs bare docker run)", "submit --stream-logs (no-op trainer)",
        "docker run --rm IMAGE python3 -c print()",
    )
    pip = Row(
        "2b", "BASIC submit -> SUCCEEDED (vs docker run + pip install)", "submit --stream-logs (no-op trainer)",
        "docker run --rm IMAGE sh -c 'pip install SDIST && python3 -m ...'",
    )
    sdist = b.build_sdist()

    def ours(i: int) -> None:
        seconds, result = b.submit(b.new_home(), b.job_id("basic"), "--stream-logs")
        if b"SUCCEEDED" not in result.stdout:
            raise BenchError(f"the BASIC job did not succeed: {result.stdout.decode()[-300:]}")
        run.ours.append(seconds)
        pip.ours.append(seconds)

    def base(i: int) -> None:
        run.base.append(timed(["docker", "run", "--rm", IMAGE, "python3", "-c", "print('hi')"])[0])
        pip.base.append(timed([
            "docker", "run", "--rm", "--user", b.user, "-e", "HOME=/tmp", "-e", "PYTHONUSERBASE=/tmp/.local",
            "-v", f"{sdist.parent}:/opt/packages:ro", IMAGE,
            "sh", "-c", f"{PIP_INSTALL} /opt/packages/{sdist.name} && exec python3 -m benchtrainer.task",
        ])[0])

    interleaved(b.args.repeat, ours, base)
    pip.notes.append(
        "2b's baseline also pip-installs the same sdist inside the container, as every replica must: "
        "2b's ratio is aiptrain's own overhead (CLI, sdist build, staging, store, controller, log "
        "streaming, teardown); 2a - 2b baseline is the pip install."
    )
    return [run, pip]


def bench_standard_1(b: Bench) -> list[Row]:
    start = Row(
        "3", f"STANDARD_1 submit -> {STANDARD_1_REPLICAS} replicas RUNNING", "submit --scale-tier standard-1",
        f"docker network create + {STANDARD_1_REPLICAS} parallel docker run -d", "<=1.3x",
    )
    warm = Row(
        "3w", f"STANDARD_1 resubmit -> {STANDARD_1_REPLICAS} replicas RUNNING", "the same submit again (new job ID)",
        "(the same baseline samples as 3)", "<=1.3x",
    )
    stop = Row(
        "3c", f"STANDARD_1 teardown ({STANDARD_1_REPLICAS} replicas)", "jobs cancel (waits for teardown)",
        f"{STANDARD_1_REPLICAS} parallel docker rm -f + network rm",
    )

    def submit(row: Row, i: int, home: Path) -> str:
        job_id = b.job_id("std1")
        seconds, _ = b.submit(home, job_id, "--scale-tier", "standard-1", trainer_args=("--sleep", SLEEP_SECONDS))
        running = b.running_replicas(job_id)
        if running != STANDARD_1_REPLICAS:
            row.notes.append(f"run {i}: {running} of {STANDARD_1_REPLICAS} replicas running when submit returned")
        row.ours.append(seconds)
        return job_id

    def ours(i: int) -> None:
        home = b.new_home()  # cold: no cached sdist
        stop.ours.append(b.cancel(home, submit(start, i, home)))
        b.cancel(home, submit(warm, i, home))  # warm: the sdist cache holds this trainer now

    def base(i: int) -> None:
        network = f"bench-{b.run_id}-net-{i}"
        names = [f"bench-{b.run_id}-std1-{i}-{n}" for n in range(STANDARD_1_REPLICAS)]

        def run_one(name: str) -> None:
            timed(["docker", "run", "-d", "--name", name, "--network", network, "--label", f"{BENCH_LABEL}={b.run_id}",
                   IMAGE, "sleep", SLEEP_SECONDS])

        t0 = time.perf_counter()
        docker("network", "create", "--label", f"{BENCH_LABEL}={b.run_id}", network)
        with ThreadPoolExecutor(max_workers=STANDARD_1_REPLICAS) as pool:
            list(pool.map(run_one, names))
        start.base.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=STANDARD_1_REPLICAS) as pool:
            list(pool.map(lambda name: docker("rm", "-f", name), names))
        docker("network", "rm", network)
        stop.base.append(time.perf_counter() - t0)

    interleaved(b.args.repeat, ours, base)
    warm.base = list(start.base)
    warm.notes.append("3 submits in a fresh AIPTRAIN_HOME (sdist built); 3w resubmits the same trainer "
                      "right after in that home (sdist from the cache).")
    return [start, warm, stop]


def bench_resubmit(b: Bench) -> list[Row]:
    same_dir = b.args.resubmit_job_dir == "same"
    row = Row(
        "4", "Resubmit of an unchanged trainer", "2nd submit (new job ID)", "1st submit (fresh AIPTRAIN_HOME)",
        "<=0.5x",
    )
    row.notes.append(
        f"Both submits are BASIC, without --stream-logs, and are cancelled right after; the resubmit uses "
        f"{'the same --job-dir as' if same_dir else 'a different --job-dir from'} the first "
        "(--resubmit-job-dir)."
    )

    def one(i: int) -> None:
        home = b.new_home()
        job_dir = b.tmp / "job-dirs" / f"resubmit-{i}"
        first_id = b.job_id("first")
        seconds, _ = b.submit(home, first_id, trainer_args=("--sleep", SLEEP_SECONDS), job_dir=job_dir)
        row.base.append(seconds)
        b.cancel(home, first_id)
        second_id = b.job_id("again")
        seconds, _ = b.submit(home, second_id, trainer_args=("--sleep", SLEEP_SECONDS),
                              job_dir=job_dir if same_dir else job_dir.with_name(f"{job_dir.name}-again"))
        row.ours.append(seconds)
        b.cancel(home, second_id)

    for i in range(b.args.repeat):
        one(i)
    return [row]


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
    sdist = b.build_sdist()
    container = f"bench-{b.run_id}-logs"
    job_ids = []

    # 5a: each side --log-job-runs times (default once: a 20k-line job takes ~10 s); the
    # job's output is what 5b reads.
    def ours_run(i: int) -> None:
        job_id = b.job_id("logs")
        seconds, result = b.submit(home, job_id, "--stream-logs", trainer_args=("--lines", str(lines)), timeout=600)
        got = result.stderr.count(b"of the log-streaming benchmark")
        if got != lines:
            run.notes.append(f"run {i}: submit --stream-logs printed {got} of {lines} lines")
        run.ours.append(seconds)
        job_ids.append(job_id)

    def base_run(i: int) -> None:
        seconds, result = timed([
            "docker", "run", "--rm", "--user", b.user, "-e", "HOME=/tmp", "-e", "PYTHONUSERBASE=/tmp/.local",
            "-v", f"{sdist.parent}:/opt/packages:ro", IMAGE,
            "sh", "-c", f"{PIP_INSTALL} /opt/packages/{sdist.name} && exec python3 -m benchtrainer.task --lines {lines}",
        ], timeout=600)
        run.base.append(seconds)

    interleaved(b.args.log_job_runs, ours_run, base_run)
    if b.args.log_job_runs < b.args.repeat:
        run.notes.append(f"5a ran {b.args.log_job_runs} time(s) per side (--log-job-runs), not --repeat times.")

    # 5b: a finished job and an exited container with the same output, read N times each.
    docker("run", "--name", container, "--label", f"{BENCH_LABEL}={b.run_id}", IMAGE,
           "python3", "-c", LINES_SCRIPT.format(n=lines))
    job_id = job_ids[-1]

    def ours_read(i: int) -> None:
        seconds, result = b.aiptrain(home, "jobs", "stream-logs", job_id)
        got = result.stdout.count(b"of the log-streaming benchmark")
        if got != lines:
            read.notes.append(f"run {i}: stream-logs printed {got} of {lines} lines")
        read.ours.append(seconds)

    def base_read(i: int) -> None:
        seconds, result = timed(["docker", "logs", container])
        got = result.stdout.count(b"of the log-streaming benchmark")
        if got != lines:
            read.notes.append(f"run {i}: docker logs printed {got} of {lines} lines")
        read.base.append(seconds)

    interleaved(b.args.repeat, ours_read, base_read)
    docker("rm", "-f", container, check=False)
    return [run, read]


LOG_MARKER = b"of the log-streaming benchmark"
CLOSING_LINES = (b"Job completed successfully.", b"Job failed.", b"Job cancelled.")


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
                stamp = json.loads(line)["time"]
                stamps.append(dt.datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp())
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
                                          IMAGE, "python3", "-c", LINES_SCRIPT.format(n=lines)), names))
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


@contextlib.contextmanager
def no_admission_cap():
    """Every job of the figure runs at once: the home's controller, started by its first submit,
    reads AIPTRAIN_MAX_RUNNING_REPLICAS=0 from that submit's environment."""
    previous = os.environ.get("AIPTRAIN_MAX_RUNNING_REPLICAS")
    os.environ["AIPTRAIN_MAX_RUNNING_REPLICAS"] = "0"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("AIPTRAIN_MAX_RUNNING_REPLICAS", None)
        else:
            os.environ["AIPTRAIN_MAX_RUNNING_REPLICAS"] = previous


COPY_JOBS, COPY_JOB_LINES = 50, 10_000  # figure 5e: jobs printing at once, lines each


def bench_copy_many(b: Bench) -> list[Row]:
    """What one controller's log copying keeps up with: COPY_JOBS BASIC jobs printing at once."""
    from concurrent.futures import ThreadPoolExecutor

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


FOLLOW_TICKS, FOLLOW_SKIPPED = 12, 2  # lines every 0.5 s; the first ones may predate the follower


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
        submit = subprocess.Popen([
            *b.aiptrain_cmd, "jobs", "submit", "training", job_id, "--package-path", str(b.package),
            "--module-name", "benchtrainer.task", "--region", "us-central1", "--runtime-version", "minimal",
            "--stream-logs", "--", *ticks,
        ], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        submitted.ours += tick_delays(submit, submit.stderr)
        b.ended.add(job_id)

    def base(i: int) -> None:
        name = f"bench-{b.run_id}-follow-{i}"
        docker("run", "-d", "--name", name, "--label", f"{BENCH_LABEL}={b.run_id}", IMAGE,
               "python3", "-c", TICKS_SCRIPT.format(n=FOLLOW_TICKS))
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


FIRST_LINE_TIERS = (("standard-1", STANDARD_1_REPLICAS), ("premium-1", 31))
HELLO = "hello from the benchmark trainer"


def first_user_lines(log_path: Path, replicas: int, deadline: float) -> list[float]:
    """Epoch seconds of each replica's first line of user code, read from the job's log."""
    while time.monotonic() < deadline:
        firsts: dict[str, float] = {}
        if log_path.exists():
            for line in log_path.read_text().splitlines():
                record = json.loads(line)
                if record["message"] == HELLO and record["task"] not in firsts:
                    firsts[record["task"]] = dt.datetime.fromisoformat(record["time"].replace("Z", "+00:00")).timestamp()
        if len(firsts) == replicas:
            return list(firsts.values())
        time.sleep(0.1)
    raise BenchError(f"not every replica reached user code in time ({log_path})")


def bench_first_line(b: Bench) -> list[Row]:
    rows = []
    for tier, replicas in FIRST_LINE_TIERS:
        row = Row(
            f"7{'ab'[len(rows)]}", f"{tier.upper().replace('-', '_')}: submit -> every replica's first line of "
            f"user code ({replicas} replicas)", f"submit --scale-tier {tier}, then the job log",
            f"network create + {replicas} parallel docker run -d IMAGE python3 -c print(1)", "<=1.3x",
        )

        def ours(i: int, tier=tier, replicas=replicas, row=row) -> None:
            home = b.new_home()
            job_id = b.job_id(tier.replace("-", ""))
            start = time.time()
            b.submit(home, job_id, "--scale-tier", tier, trainer_args=("--sleep", SLEEP_SECONDS))
            firsts = first_user_lines(home / "logs" / f"{job_id}.jsonl", replicas, time.monotonic() + 300)
            row.ours.append(max(firsts) - start)
            b.cancel(home, job_id)

        def base(i: int, tier=tier, replicas=replicas, row=row) -> None:
            network = f"bench-{b.run_id}-{tier}-{i}"
            names = [f"bench-{b.run_id}-{tier}-{i}-{n}" for n in range(replicas)]
            start = time.time()
            docker("network", "create", "--label", f"{BENCH_LABEL}={b.run_id}", network)
            with ThreadPoolExecutor(max_workers=replicas) as pool:
                list(pool.map(lambda name: docker("run", "-d", "--name", name, "--network", network, "--label",
                                                  f"{BENCH_LABEL}={b.run_id}", IMAGE, "python3", "-c", "print(1)"),
                              names))
            firsts = []
            for name in names:
                docker("wait", name)
                stamp = docker("logs", "-t", name).split()[0]
                firsts.append(dt.datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp())
            row.base.append(max(firsts) - start)
            docker("rm", "-f", *names)
            docker("network", "rm", network)

        interleaved(b.args.repeat, ours, base)
        row.notes.append(f"7: time from submit to the last of the {replicas} replicas printing its first line, from "
                         "the engine's log timestamps; the baseline's containers print at once.")
        rows.append(row)
    return rows


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
            row.skipped = TORCHX_MISSING
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
    cold.notes.append("9b: each aiptrain sample in a fresh AIPTRAIN_HOME: the sdist build and the one install "
                      "container are counted; TorchX's side has no install step (the source is mounted).")
    return rows


MEMORY_JOB_COUNTS = (1, 10, 100)  # running jobs at which figure 10 weighs the controller
MANY_JOBS = 500  # figure 11: BASIC jobs submitted at once
MANY_JOBS_PARALLEL = 8  # replicas running at once in figure 11, for aiptrain (its cap) and by hand


def controller_memory_mb(home: Path) -> tuple[float, float]:
    """(VmRSS, private memory) of the home's controller. RSS counts the shared libraries
    (libpython, libcrypto, pydantic-core), whose pages every aiptrain process shares; the private
    part is what the controller itself holds."""
    pid = json.loads((home / "controller.json").read_text())["pid"]
    proc = Path("/proc") / str(pid)
    rss = int((proc / "status").read_text().split("VmRSS:")[1].split()[0])
    rollup = dict(line.split(":", 1) for line in (proc / "smaps_rollup").read_text().splitlines()[1:])
    private = sum(int(rollup[key].split()[0]) for key in ("Private_Clean", "Private_Dirty"))
    return rss / 1024, private / 1024


def bench_memory(b: Bench) -> list[Row]:
    """The controller's memory with 1, 10 and 100 BASIC jobs running (each replica printing, its log
    follower attached), and what each further running job adds."""
    from concurrent.futures import ThreadPoolExecutor

    rss = {n: Row(f"10{'abc'[i]}", f"controller's memory (RSS) with {n} running job{'s' * (n > 1)}",
                  "VmRSS of the home's controller", "TorchX local_docker: no process per job", unit="MB")
           for i, n in enumerate(MEMORY_JOB_COUNTS)}
    marginal = Row("10d", "private memory each further running job costs the controller",
                   f"(private at {MEMORY_JOB_COUNTS[-1]} - private at 1) / {MEMORY_JOB_COUNTS[-1] - 1}",
                   "TorchX: none", "<=2 MB", unit="MB")
    home, running, private = b.new_home(), [], {}

    def start(job_id: str) -> None:
        b.submit(home, job_id, trainer_args=("--sleep", SLEEP_SECONDS))
        first_user_lines(home / "logs" / f"{job_id}.jsonl", 1, time.monotonic() + 600)

    try:
        with no_admission_cap(), ThreadPoolExecutor(max_workers=4) as pool:
            for n in MEMORY_JOB_COUNTS:
                more = [b.job_id(f"mem{len(running) + i}") for i in range(n - len(running))]
                running += more
                list(pool.map(start, more))
                time.sleep(2)  # every follower attached, the controller in its steady state
                megabytes_rss, private[n] = controller_memory_mb(home)
                rss[n].ours.append(megabytes_rss)
                rss[n].base.append(0.0)
    finally:
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda job_id: b.cancel(home, job_id), running))
    first, last = MEMORY_JOB_COUNTS[0], MEMORY_JOB_COUNTS[-1]
    if first in private and last in private:
        marginal.ours.append((private[last] - private[first]) / (last - first))
        marginal.base.append(0.0)
    rss[first].notes.append(
        "10: one controller drives every job of a home; measured once per count, the jobs kept running from one "
        "count to the next. TorchX's docker scheduler keeps nothing running per job (0 MB). Before the "
        "controller, each running job had its own supervisor process: 43 MB RSS, 28 MB of it private.")
    return [*rss.values(), marginal]


def bench_many_jobs(b: Bench) -> list[Row]:
    """MANY_JOBS BASIC jobs submitted at once (a trainer that exits at once) through the Python API,
    at most MANY_JOBS_PARALLEL running: jobs per minute, against the same containers run by hand
    MANY_JOBS_PARALLEL at a time. Every job must succeed."""
    from concurrent.futures import ThreadPoolExecutor

    row = Row("11a", f"{MANY_JOBS} BASIC jobs submitted at once, through admission",
              f"submit all (Python API, 8 threads), then wait for all; at most {MANY_JOBS_PARALLEL} running",
              f"docker run --rm of the same image, {MANY_JOBS_PARALLEL} at a time", unit="jobs/min")
    memory = Row("11b", f"controller's memory (RSS) at the end of {MANY_JOBS} jobs", "VmRSS of the controller",
                 "TorchX: no process", unit="MB")
    home = b.new_home()
    env = {"AIPTRAIN_HOME": str(home), "AIPTRAIN_DEFAULT_RUNTIME": "minimal",
           "AIPTRAIN_MAX_RUNNING_REPLICAS": str(MANY_JOBS_PARALLEL)}
    script = MANY_JOBS_SCRIPT.format(package=str(b.package.parent), count=MANY_JOBS, prefix=b.job_id("many"),
                                     job_dirs=str(b.tmp / "job-dirs"))
    result = subprocess.run([sys.executable, "-c", script], env={**os.environ, **env}, capture_output=True,
                            text=True, timeout=3600)
    if result.returncode != 0:
        raise BenchError(f"the {MANY_JOBS}-job run failed: {result.stderr.strip()[-500:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if report["lost"] or report["not_succeeded"]:
        raise BenchError(f"{MANY_JOBS} jobs: {report}")
    row.ours.append(MANY_JOBS / report["seconds"] * 60)
    memory.ours.append(controller_memory_mb(home)[0])
    memory.base.append(0.0)

    def by_hand(_: int) -> None:
        docker("run", "--rm", "--label", f"{BENCH_LABEL}={b.run_id}", "--user", b.user, IMAGE, "python3", "-c",
               "print('hello from the benchmark trainer')")

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=MANY_JOBS_PARALLEL) as pool:
        list(pool.map(by_hand, range(MANY_JOBS)))
    row.base.append(MANY_JOBS / (time.monotonic() - started) * 60)
    row.notes.append(f"11: a higher ratio is better here (jobs per minute). All {MANY_JOBS} jobs SUCCEEDED, "
                     "none lost (the queue's order is tested in test_admission*); each aiptrain job is recorded, staged (the sdist "
                     "built once and reused), planned, admitted, launched on its own network, its log copied, "
                     "torn down and recorded.")
    return [row, memory]


# The 500-job run, in its own process (the Python API, as a pipeline would use it).
MANY_JOBS_SCRIPT = textwrap.dedent(
    """    import json, sys, time
    from concurrent.futures import ThreadPoolExecutor
    import aiptrain

    ids = [f"{prefix}_{{n:04d}}" for n in range({count})]
    started = time.monotonic()

    def submit(job_id):
        with aiptrain.Client() as client:
            client.submit_training(job_id, "{package}/benchtrainer", "benchtrainer.task", "{job_dirs}/" + job_id,
                                   region="us-central1", runtime_version="minimal")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(submit, ids))
    with aiptrain.Client() as client:
        jobs = [client.wait(job_id, timeout=3600) for job_id in ids]
    seconds = time.monotonic() - started
    print(json.dumps({{"seconds": seconds, "lost": {count} - len(jobs),
                      "not_succeeded": [j.job_id for j in jobs if j.state.value != "SUCCEEDED"]}}))
    """
)


STORE_JOBS, SMALL_STORE_JOBS = 10_000, 10
STORE_ACTIVE = 3  # RUNNING jobs among them, whose locks the benchmark holds as a submit at work would


def fill_store(home: Path, count: int) -> list[str]:
    """`count` jobs recorded through the store's own API, one a minute: mostly finished (SUCCEEDED,
    FAILED with an error message, CANCELLED), labelled by team and run, one in a hundred with a
    tuning job's trainingOutput, the newest STORE_ACTIVE still RUNNING. Returns the RUNNING ones."""
    from aiptrain.model import HyperparameterOutput, Job, State, TrainingInput, TrainingOutput
    from aiptrain.store import JobStore

    store = JobStore(home / "jobs.db")
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    endings = [State.SUCCEEDED] * 6 + [State.FAILED] * 2 + [State.CANCELLED]
    tuning = TrainingOutput(completed_trial_count=2, is_hyperparameter_tuning_job=True, trials=[
        HyperparameterOutput(trial_id=str(n), hyperparameters={"lr": str(0.1 / n)}) for n in (1, 2)])
    active = []
    for n in range(count):
        job_id = f"{('census', 'mnist', 'bert')[n % 3]}_{n:05d}"
        training_input = TrainingInput(
            scale_tier="BASIC" if n % 4 else "STANDARD_1", region="us-central1", python_module="trainer.task",
            package_uris=[f"gs://bench/staging/{job_id}/trainer-0.1.tar.gz"], args=["--steps", str(n)],
            job_dir=f"gs://bench/output/{job_id}", runtime_version="2.11", python_version="3.7")
        store.create(Job(job_id=job_id, training_input=training_input, create_time=start + dt.timedelta(minutes=n),
                         labels={"team": ("ml", "vision", "nlp")[n % 3], "run": str(n % 50)}))
        store.transition(job_id, State.RUNNING, [State.QUEUED])
        if n >= count - STORE_ACTIVE:
            active.append(job_id)
            continue
        ending = endings[n % len(endings)]
        failed = "The replica master 0 exited with a non-zero status of 1." if ending is State.FAILED else None
        store.transition(job_id, ending, [State.RUNNING], error_message=failed)
        if n % 100 == 0:
            store.set_training_output(job_id, tuning)
    store.close()
    return active


def bench_list(b: Bench) -> list[Row]:
    from aiptrain.ownership import JobLock

    click_label = f"{Path(sys.executable).name} -c 'import click'"
    every = Row("8a", f"jobs list of {STORE_JOBS:,} jobs", "jobs list (the default table)", click_label, "<=0.3 s")
    limited = Row("8b", f"jobs list --limit 20 of {STORE_JOBS:,} jobs", "jobs list --limit 20", click_label, "<=2.0x")
    describe = Row("8c", f"jobs describe among {STORE_JOBS:,} jobs (vs among {SMALL_STORE_JOBS})",
                   f"jobs describe JOB, store of {STORE_JOBS:,}", f"jobs describe JOB, store of {SMALL_STORE_JOBS}",
                   "~1.0x")
    large, small = b.new_home(), b.new_home()
    progress(f"recording {STORE_JOBS:,} jobs through the store's API")
    running = [(large, job_id) for job_id in fill_store(large, STORE_JOBS)]
    running += [(small, job_id) for job_id in fill_store(small, SMALL_STORE_JOBS)]
    # Held by this process as a submit at work would: the controller `jobs list` starts leaves them alone.
    locks = [JobLock.try_acquire(home / "locks" / f"{job_id}.lock") for home, job_id in running]
    click_cmd = [sys.executable, "-c", "import click"]
    described = "census_00003"  # finished, in both stores

    def aiptrain(home: Path, *args: str) -> float:
        return b.aiptrain(home, *args)[0]

    try:
        for home in (large, small):  # warm the page cache and the bytecode; not counted
            aiptrain(home, "jobs", "list"), aiptrain(home, "jobs", "describe", described)
        timed(click_cmd)
        interleaved(b.args.repeat, lambda i: every.ours.append(aiptrain(large, "jobs", "list")),
                    lambda i: every.base.append(timed(click_cmd)[0]))
        interleaved(b.args.repeat, lambda i: limited.ours.append(aiptrain(large, "jobs", "list", "--limit", "20")),
                    lambda i: limited.base.append(timed(click_cmd)[0]))
        interleaved(b.args.repeat, lambda i: describe.ours.append(aiptrain(large, "jobs", "describe", described)),
                    lambda i: describe.base.append(aiptrain(small, "jobs", "describe", described)))
    finally:
        for lock in locks:
            lock.release()
    every.notes.append(f"8a's target is absolute: the whole table of {STORE_JOBS:,} jobs in 0.3 s or less; the "
                       "ratio to `import click` is shown for scale.")
    return [every, limited, describe]


API_LOAD = Path(__file__).resolve().parent / "api_load.py"  # benchmark 12's Locust driver, its own process
API_JOBS = 200  # jobs in the store the API answers from
API_RATES = (50, 200)  # requests per second
API_SECONDS = 10.0  # measured per (method, rate), after a 1 s warm-up


def locust_installed() -> bool:
    return subprocess.run([sys.executable, "-c", "import locust"], capture_output=True).returncode == 0


def bench_api(b: Bench) -> list[Row]:
    """jobs.get and jobs.list at steady rates against `aiptrain serve` on loopback (Locust),
    beside `aiptrain jobs describe` of the same job as a process."""
    from aiptrain.ownership import JobLock

    describe_label = "aiptrain jobs describe JOB (a process)"
    rows = [Row(f"12{'abcd'[i]}", f"jobs.{method} at {rate} req/s: p50 latency", f"jobs.{method}, {rate} req/s",
                describe_label, unit="s")
            for i, (rate, method) in enumerate((rate, method) for rate in API_RATES for method in ("get", "list"))]
    if not locust_installed():
        for row in rows:
            row.skipped = "locust not installed (pip install -e '.[bench]')"
        return rows
    home = b.new_home()
    progress(f"recording {API_JOBS} jobs through the store's API")
    running = fill_store(home, API_JOBS)
    locks = [JobLock.try_acquire(home / "locks" / f"{job_id}.lock") for job_id in running]  # driven: no reconcile
    described = "census_00003"
    env = {**os.environ, "AIPTRAIN_HOME": str(home)}
    env.pop("AIPTRAIN_API", None)
    log = b.tmp / "serve.log"
    with log.open("w") as output:
        server = subprocess.Popen([*b.aiptrain_cmd, "serve", "--port", "0"], env=env, stdout=subprocess.DEVNULL,
                                  stderr=output)
    try:
        url = _served_url(log, server)
        for row in rows:
            method, rate = row.ours_label.removeprefix("jobs.").split(", ")
            progress(f"jobs.{method} at {rate} for {API_SECONDS:.0f} s")
            result = subprocess.run([sys.executable, str(API_LOAD), "--url", url, "--method", method,
                                     "--rate", rate.split()[0], "--seconds", str(API_SECONDS), "--job", described],
                                    capture_output=True, text=True, timeout=API_SECONDS + 120)
            if result.returncode != 0:
                raise BenchError(f"api_load.py exited {result.returncode}: {result.stderr.strip()[-800:]}")
            load = json.loads(result.stdout.strip().splitlines()[-1])
            row.ours = [load["p50_ms"] / 1000]
            row.notes.append(f"p50 {load['p50_ms']} ms, p99 {load['p99_ms']} ms, max {load['max_ms']} ms; "
                             f"{load['requests']} requests in {load['seconds']:.0f} s = {load['achieved_rps']} req/s "
                             f"achieved of {load['target_rps']:.0f} ({load['users']} clients), "
                             f"{load['failures']} failures")
        describe = [b.aiptrain(home, "jobs", "describe", described)[0] for _ in range(b.args.repeat)]
        for row in rows:
            row.base = describe
    finally:
        server.terminate()
        server.wait(timeout=30)
        for lock in locks:
            lock.release()
    return rows


def _served_url(log: Path, server: subprocess.Popen) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        first = log.read_text().partition("\n")[0]
        if " on http://" in first:
            return first.split(" on ", 1)[1].split()[0]
        if server.poll() is not None:
            raise BenchError(f"aiptrain serve exited {server.returncode}: {log.read_text()[-800:]}")
        time.sleep(0.1)
    raise BenchError("aiptrain serve did not say where it listens within 60 s")


BENCHMARKS = {
    "1": ("CLI start-up", bench_startup),
    "2": ("BASIC submit -> SUCCEEDED", bench_basic),
    "3": ("STANDARD_1 submit -> RUNNING", bench_standard_1),
    "4": ("resubmit vs first submit", bench_resubmit),
    "5": ("log streaming", bench_logs),
    "5c": (f"log throughput, {LOG_REPLICAS} replicas", bench_log_throughput),
    "5d": ("follow latency", bench_follow_latency),
    "5e": (f"log copying, {COPY_JOBS} jobs at once", bench_copy_many),
    "6": ("hyperparameter study", bench_study),
    "7": ("submit -> every replica in user code", bench_first_line),
    "8": ("jobs list and describe over 10,000 stored jobs", bench_list),
    "9": ("BASIC and STANDARD_1 vs TorchX", bench_torchx),
    "10": ("controller memory with 1, 10 and 100 running jobs", bench_memory),
    "11": (f"{MANY_JOBS} jobs through admission", bench_many_jobs),
    "12": ("the REST API under load: jobs.get and jobs.list at 50 and 200 req/s", bench_api),
}
WITHOUT_ENGINE = {"1", "8", "12"}  # benchmarks that run no container


# -- report ----------------------------------------------------------------------------


def fmt(samples: list[float], unit: str = "s") -> str:
    if not samples:
        return "-"
    suffix = "" if unit == "s" else f" {unit}"
    return f"{statistics.median(samples):7.3f} ({min(samples):.3f}){suffix}"


def ratio_cell(row: Row) -> str:
    if row.error:
        return "ERROR"
    if row.skipped:
        return "skipped"
    ratio = row.ratio()
    return "-" if ratio is None else f"{ratio:.2f}x"


def table(rows: list[Row]) -> str:
    header = ("#", "benchmark", "aiptrain med (min)", "baseline med (min)", "ratio", "target")
    body = [(row.key, row.title, fmt(row.ours, row.unit), fmt(row.base, row.unit), ratio_cell(row), row.target)
            for row in rows]
    widths = [max(len(str(r[i])) for r in (header, *body)) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(r, widths, strict=False)).rstrip() for r in (header, *body)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine() -> dict:
    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return result.stdout.strip()

    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "docker": docker("version", "--format", "{{.Server.Version}}", check=False).strip(),
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each side of each benchmark (default 5)")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated benchmark numbers, e.g. 1,3")
    parser.add_argument("--lines", type=int,
                        help=f"log lines of benchmark 5: of its job (5a, 5b; default {DEFAULT_LINES}) and of each of "
                             f"5c's {LOG_REPLICAS} replicas (default {DEFAULT_REPLICA_LINES})")
    parser.add_argument("--log-job-runs", type=int, default=1,
                        help="benchmark 5a: runs of the 20k-line job per side (default 1; it is slow)")
    parser.add_argument("--resubmit-job-dir", choices=("same", "new"), default="same",
                        help="benchmark 4: resubmit with the same --job-dir as the first submit, or a new one")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "latest.json", help="where the JSON goes")
    args = parser.parse_args(argv)
    selected = [key.strip() for key in args.only.split(",") if key.strip()]
    unknown = [key for key in selected if key not in BENCHMARKS]
    if unknown or args.repeat < 1 or args.log_job_runs < 1:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}" if unknown
                     else "--repeat and --log-job-runs must be at least 1")

    needs_engine = not set(selected) <= WITHOUT_ENGINE
    if needs_engine and subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        print(f"{IMAGE} is not on the Docker engine: run `make images` first.", file=sys.stderr)
        return 3

    info = machine()
    print(f"aiptrain benchmarks: repeat={args.repeat}, {info['cpus']} CPUs, load {info['loadavg_start']}",
          file=sys.stderr)
    bench = Bench(args)
    rows: list[Row] = []
    started = time.perf_counter()
    leftovers: list[str] = []
    try:
        for key in selected:
            name, function = BENCHMARKS[key]
            print(f"[{key}] {name} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                rows += function(bench)
            except (BenchError, subprocess.TimeoutExpired) as exc:
                rows.append(Row(key, name, "", "", error=str(exc)))
                progress(f"ERROR: {exc}")
            progress(f"done in {time.perf_counter() - t0:.0f}s")
    finally:
        leftovers = bench.cleanup()
    info["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    info["total_s"] = round(time.perf_counter() - started, 1)
    info["repeat"] = args.repeat
    info["lines"] = args.lines

    print()
    dirty = " (uncommitted changes)" if info["git_dirty"] else ""
    print(f"aiptrain {info['git_commit']}{dirty}; {info['cpus']} CPUs, {info['platform']}, Python {info['python']}, "
          f"Docker {info['docker']}; {info['date']}; --repeat {args.repeat}")
    print(table(rows))
    print()
    print("ratio = median(aiptrain) / median(baseline); lower is better. Times are wall-clock seconds; MB: memory.")
    print("What was timed (aiptrain | baseline):")
    for row in rows:
        if not row.error and not row.skipped:
            print(f"  {row.key:3s} {row.ours_label} | {row.base_label}")
    for row in rows:
        for note in row.notes:
            print(f"[{row.key}] {note}")
        if row.error:
            print(f"[{row.key}] ERROR: {row.error}")
        if row.skipped:
            print(f"[{row.key}] skipped: {row.skipped}")
    for leftover in leftovers:
        print(f"cleanup: {leftover}")
    print(f"total {info['total_s']}s; load average {info['loadavg_start']} -> {info['loadavg_end']}")

    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(
        {"machine": info, "results": [row.to_dict() for row in rows], "cleanup_leftovers": leftovers}, indent=2
    ) + "\n")
    print(f"results: {args.output}")
    return 1 if any(row.error for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
