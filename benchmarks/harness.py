"""The benchmarks' harness: the Bench (fresh homes, the trainer, aiptrain's commands, clean-up),
a table Row per figure, the timing and docker helpers, and the report.

Every figure group (benchmarks/figures/) times an aiptrain operation and its baseline through
these, so that each side of each figure is measured the same way: `timed` is wall time from
spawn to exit, and `interleaved` alternates which side goes first.
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
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO = BENCHMARKS_DIR.parent
RESULTS_DIR = BENCHMARKS_DIR / "results"
TRAINERS = BENCHMARKS_DIR / "trainers"  # the benchmark trainer package and the baselines' scripts
IMAGE = "aiptrain/runtime:minimal"
JOB_LABEL = "aiptrain.job-id"  # the label aiptrain puts on its containers and networks
BENCH_LABEL = "aiptrain-bench"  # the label this script puts on its baseline containers
STANDARD_1_REPLICAS = 8  # 1 master + 4 workers + 3 parameter servers
TORCHX_APP = BENCHMARKS_DIR / "torchx_app.py"  # the TorchX side of figure 9
TORCHX_LABEL = "torchx.pytorch.org/app-id"  # the label TorchX puts on its containers
TORCHX_NETWORK = "torchx"  # the one network TorchX's local_docker scheduler shares between apps
SLEEP_SECONDS = "600"  # replicas that must stay up until cancelled
# Why figures 9 and 12 say "skipped": their peer or load comes from the bench extra, which only
# the benchmarks' own virtual environment holds (`make bench-install`).
BENCH_EXTRA_MISSING = "{} not installed (make bench-install, then .venv-bench/bin/python benchmarks/run.py)"
HELLO = "hello from the benchmark trainer"  # the trainer's first line of user code
# What a replica runs before the trainer (aiptrain.planning.BOOTSTRAP's pip flags).
PIP_INSTALL = (
    "python3 -m pip install --user --no-index --no-deps --no-build-isolation --no-cache-dir "
    "--disable-pip-version-check --no-warn-script-location --quiet"
)


def compile_bytecode() -> None:
    """aiptrain's modules as an installed aiptrain has them: compiled. A checkout installed
    editable, on a machine that sets PYTHONDONTWRITEBYTECODE (this one does), would otherwise
    compile some 50 modules from source in every command and controller it starts (0.04 s a
    command here), while the peers' packages, installed by pip, were compiled at install."""
    import compileall

    compileall.compile_dir(REPO / "aiptrain", quiet=1)


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
        self.package = self._copy_trainer()
        self.sdist: Path | None = None
        self.jobs: list[tuple[str, Path]] = []  # (job ID, AIPTRAIN_HOME) of every job submitted
        self.ended: set[str] = set()  # jobs seen to end (cancelled, or succeeded under --stream-logs)
        self.homes = 0
        self.torchx_ran = False
        self.torchx_network_existed = bool(docker("network", "ls", "-q", "--filter", f"name=^{TORCHX_NETWORK}$",
                                                  check=False).strip())
        self.user = "65534:65534" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}"
        compile_bytecode()
        script = Path(sys.executable).parent / "aiptrain"
        self.aiptrain_cmd = [str(script)] if script.exists() else [sys.executable, "-m", "aiptrain"]

    # -- fixtures ----------------------------------------------------------------------

    def _copy_trainer(self) -> Path:
        """The trainer package (benchmarks/trainers/benchtrainer), copied into the run's
        temporary directory: the sdist aiptrain builds of it, and TorchX's mount, hold only it
        (no __pycache__), readable by the replicas' user."""
        package = self.tmp / "trainer-src" / "benchtrainer"
        package.mkdir(parents=True)
        for source in (TRAINERS / "benchtrainer").glob("*.py"):
            (package / source.name).write_bytes(source.read_bytes())
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

    def pip_install_and_run(self, *trainer_args: str) -> list[str]:
        """`docker run --rm` of what a replica does: pip-install the trainer's sdist (aiptrain's
        pip flags, as the replicas' user), then run the trainer (the baseline of 2b and 5a)."""
        sdist = self.build_sdist()
        trainer = " ".join(["python3 -m benchtrainer.task", *trainer_args])
        return [
            "docker", "run", "--rm", "--user", self.user, "-e", "HOME=/tmp", "-e", "PYTHONUSERBASE=/tmp/.local",
            "-v", f"{sdist.parent}:/opt/packages:ro", IMAGE,
            "sh", "-c", f"{PIP_INSTALL} /opt/packages/{sdist.name} && exec {trainer}",
        ]

    # -- running things ----------------------------------------------------------------

    def aiptrain(self, home: Path, *args: str, timeout: float = 300, check: bool = True,
                 capture: bool = True, server: bool = True) -> tuple[float, subprocess.CompletedProcess]:
        """`aiptrain ARGS` in `home`; `server=False`: in its own process even while the home's
        command server runs (aiptrain.commandserver)."""
        env = {**os.environ, "AIPTRAIN_HOME": str(home), "AIPTRAIN_DEFAULT_RUNTIME": "minimal"}
        env.pop("AIPTRAIN_STAGING_BUCKET", None)
        if not server:
            env["AIPTRAIN_COMMAND_SERVER"] = "0"
        return timed([*self.aiptrain_cmd, *args], env=env, timeout=timeout, check=check, capture=capture)

    def submit_args(self, job_id: str, *flags: str, trainer_args: tuple[str, ...] = (),
                    job_dir: Path | None = None) -> list[str]:
        """aiptrain's arguments to submit the benchmark trainer (--job-dir only when given)."""
        return [
            "jobs", "submit", "training", job_id,
            "--package-path", str(self.package),
            "--module-name", "benchtrainer.task",
            *(["--job-dir", str(job_dir)] if job_dir else []),
            "--region", "us-central1",
            "--runtime-version", "minimal",
            *flags, "--", *trainer_args,
        ]

    def submit(self, home: Path, job_id: str, *flags: str, trainer_args: tuple[str, ...] = (),
               job_dir: Path | None = None, timeout: float = 300) -> tuple[float, subprocess.CompletedProcess]:
        self.jobs.append((job_id, home))
        job_dir = job_dir or self.tmp / "job-dirs" / job_id
        seconds, result = self.aiptrain(home, *self.submit_args(job_id, *flags, trainer_args=trainer_args,
                                                                 job_dir=job_dir), timeout=timeout)
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
        # What the deleted homes shared on the engine (each lone replicas' network holds a subnet
        # of the pool): removed as a controller's sweep would, now rather than at the next one.
        from aiptrain.backends.docker import DockerBackend

        try:
            DockerBackend().installation.remove_abandoned()
        except Exception:  # noqa: BLE001 - best effort: any controller's next sweep does it
            pass
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


def remove_network(name: str, patience: float = 60) -> None:
    """`docker network rm`, again while a loaded engine still lists endpoints of containers it
    has just removed ("has active endpoints"), as aiptrain's own teardown does; and, as it does,
    not once the count is stale (StaleCountWatch: it stays so for minutes to an hour, or until
    dockerd restarts)."""
    from aiptrain.backends.networks import StaleCountWatch

    deadline = time.monotonic() + patience
    watch = StaleCountWatch()
    while True:
        result = subprocess.run(["docker", "network", "rm", name], capture_output=True, text=True, timeout=180)
        if result.returncode == 0 or "active endpoints" not in result.stderr or time.monotonic() > deadline:
            break
        listed = docker("network", "inspect", "-f", "{{len .Containers}}", name, check=False).strip() or "0"
        if watch.stale(result.stderr, int(listed), time.monotonic()):
            break
        time.sleep(0.2)
    if result.returncode != 0:
        raise BenchError(f"`docker network rm {name}` failed: {result.stderr.strip()[-500:]}")


def python_script(name: str, *args: str) -> list[str]:
    """`python3 -c SCRIPT ARGS` of one of benchmarks/trainers' scripts, for a bare container."""
    return ["python3", "-c", (TRAINERS / name).read_text(), *args]


def interleaved(repeat: int, ours, base) -> None:
    """Run both sides `repeat` times, alternating which goes first."""
    for i in range(repeat):
        for action in ((ours, base) if i % 2 == 0 else (base, ours)):
            action(i)


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def engine_time(stamp: str) -> float:
    """Epoch seconds of a timestamp the engine wrote (nanoseconds, `Z`)."""
    return dt.datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp()


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


def print_report(rows: list[Row], info: dict, leftovers: list[str]) -> None:
    """The table, what each side timed, every note, error and skip, and what clean-up found."""
    print()
    dirty = " (uncommitted changes)" if info["git_dirty"] else ""
    print(f"aiptrain {info['git_commit']}{dirty}; {info['cpus']} CPUs, {info['platform']}, Python {info['python']}, "
          f"Docker {info['docker']}; {info['date']}; --repeat {info['repeat']}")
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


def write_results(path: Path, rows: list[Row], info: dict, leftovers: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(
        {"machine": info, "results": [row.to_dict() for row in rows], "cleanup_leftovers": leftovers}, indent=2
    ) + "\n")
    print(f"results: {path}")
