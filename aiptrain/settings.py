"""Where aiptrain keeps its state, and the knobs users set through the environment.

Every path derives from one home directory (platformdirs' user data dir, or
AIPTRAIN_HOME), so tests and CI isolate a whole installation with one variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiptrain.errors import ValidationError
from aiptrain.jobkeys import DEFAULT_PROJECT
from aiptrain.jobpaths import LOCKS_DIR, LOGS_DIR, JobPaths

DEFAULT_RUNTIME_VERSION = "2.11"
DEFAULT_IMAGE_REPOSITORY = "aiptrain/runtime"
DEFAULT_BASE_REPOSITORY = "aiptrain/base"
# Jobs' networks take small subnets from this range: RFC 2544's benchmarking range, which LANs,
# VPNs and Docker's own default pools do not use; room for thousands of jobs.
DEFAULT_SUBNET_POOL = "198.18.0.0/15"
# Processes and threads one replica may have: generous for TensorFlow's thread pools and data
# loaders, but a fork bomb in a trainer stops there instead of taking the host.
DEFAULT_REPLICA_PIDS_LIMIT = 4096
# Free space submit asks of the home's disk: a job's row, log and packages must fit, and a
# controller that cannot write them would leave the job in a state it cannot record.
MIN_FREE_BYTES = 16 << 20
# What runs replicas (`--backend`, AIPTRAIN_BACKEND): one Docker engine, or a Docker Swarm.
BACKEND_NAMES = ("docker", "swarm")
# The Python `local train` runs trainers with, in this order (the second is gcloud's
# ml_engine/local_python property); unset: `python` on PATH.
LOCAL_PYTHON_VARS = ("AIPTRAIN_LOCAL_PYTHON", "CLOUDSDK_ML_ENGINE_LOCAL_PYTHON")


# -- read where they are needed, without a whole Settings (the catalog, the CLI's error path) --


def image_repository() -> str:
    """Where runtime images are tagged; AIPTRAIN_IMAGE_REPOSITORY moves them (e.g. to try a
    change without touching the images other checkouts use)."""
    return os.environ.get("AIPTRAIN_IMAGE_REPOSITORY") or DEFAULT_IMAGE_REPOSITORY


def base_image(base_name: str) -> str:
    """The tag of a base image built here (scripts/build-base-image.sh): AIPTRAIN_BASE_REPOSITORY
    moves them all, AIPTRAIN_BASE_IMAGE names the bookworm one outright."""
    if base_name == "bookworm" and os.environ.get("AIPTRAIN_BASE_IMAGE"):
        return os.environ["AIPTRAIN_BASE_IMAGE"]
    return f"{os.environ.get('AIPTRAIN_BASE_REPOSITORY') or DEFAULT_BASE_REPOSITORY}:{base_name}"


def gcloud_property(prop: str) -> str | None:
    """A gcloud property (aiptrain.gcloud_properties): its CLOUDSDK_ variable, else what the shim
    stored in the home."""
    from aiptrain import gcloud_properties

    return gcloud_properties.get(prop, default_home())


def debug() -> bool:
    """AIPTRAIN_DEBUG: an unexpected error shows its traceback."""
    return bool(os.environ.get("AIPTRAIN_DEBUG"))


def local_python_override(environ: Mapping[str, str] | None = None) -> str | None:
    """The Python LOCAL_PYTHON_VARS name for `local train`, else gcloud's ml_engine/local_python
    property as the shim stored it."""
    environ = os.environ if environ is None else environ
    from aiptrain import gcloud_properties

    return next((environ[name] for name in LOCAL_PYTHON_VARS if environ.get(name)), None) \
        or gcloud_properties.stored(default_home()).get("ml_engine/local_python")


def _env_number(name: str, default, kind):
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return kind(value)
    except ValueError:
        raise ValidationError(f"{name} [{value}] is not a number: set it to one such as {default}.") from None


def _env_int(name: str, default: int) -> int:
    return _env_number(name, default, int)


def _env_float(name: str, default: float) -> float:
    return _env_number(name, default, float)


def _env_backend() -> str:
    name = os.environ.get("AIPTRAIN_BACKEND") or BACKEND_NAMES[0]
    if name not in BACKEND_NAMES:
        raise ValidationError(f"AIPTRAIN_BACKEND [{name}] is not a backend: set it to one of {', '.join(BACKEND_NAMES)}.")
    return name


def _env_cap(name: str) -> int | None:
    """A count that may be left unset (None: aiptrain decides); 0 and up."""
    if not os.environ.get(name):
        return None
    value = _env_int(name, 8)  # the default only names an example in the error
    if value < 0:
        raise ValidationError(f"{name} [{value}] is negative: set a count of replicas, or 0 for no cap.")
    return value


def _env_token() -> str:
    if os.environ.get("AIPTRAIN_API_TOKEN"):
        return os.environ["AIPTRAIN_API_TOKEN"].strip()
    path = os.environ.get("AIPTRAIN_API_TOKEN_FILE")
    if not path:
        return ""
    try:
        with open(Path(path).expanduser(), encoding="utf-8") as handle:
            return handle.readline(4096).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(f"AIPTRAIN_API_TOKEN_FILE [{path}] cannot be read ({type(exc).__name__}): point it "
                              "at a file holding the token, or set AIPTRAIN_API_TOKEN.") from None


def _env_store() -> str:
    """AIPTRAIN_STORE: a postgresql:// URL for a team server's store; unset, the home's SQLite file."""
    url = os.environ.get("AIPTRAIN_STORE", "").strip()
    if url and not url.startswith(("postgresql://", "postgres://")):
        from aiptrain.dialects import shown_url

        raise ValidationError(f"AIPTRAIN_STORE [{shown_url(url)}] is not a PostgreSQL URL: set it to "
                              "postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or unset it for the SQLite store in "
                              "AIPTRAIN_HOME.")
    return url


def default_home() -> Path:
    """AIPTRAIN_HOME, else platformdirs' user data dir."""
    if os.environ.get("AIPTRAIN_HOME"):
        return Path(os.environ["AIPTRAIN_HOME"]).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_data_dir("aiptrain"))


@dataclass(frozen=True)
class Settings:
    home: Path = field(default_factory=default_home)
    # The job store's PostgreSQL database (a postgresql:// URL); empty: the SQLite file in the home.
    store_url: str = field(default_factory=_env_store, repr=False)  # repr: it may hold a password
    # Where packages are staged when neither --staging-bucket nor --job-dir says otherwise.
    default_bucket: str = field(default_factory=lambda: os.environ.get("AIPTRAIN_STAGING_BUCKET", ""))
    default_runtime_version: str = field(
        default_factory=lambda: os.environ.get("AIPTRAIN_DEFAULT_RUNTIME", DEFAULT_RUNTIME_VERSION)
    )
    # The image that runs aiptrain's own helpers (the storage endpoint): the minimal runtime's base.
    base_image: str = field(default_factory=lambda: base_image("bookworm"))
    # Replicas killed by a signal are restarted in place this many times before the job fails.
    max_restarts: int = field(default_factory=lambda: _env_int("AIPTRAIN_MAX_RESTARTS", 5))
    # Seconds a replica gets between SIGTERM and SIGKILL when aiptrain stops it.
    stop_grace_seconds: int = field(default_factory=lambda: _env_int("AIPTRAIN_STOP_GRACE_SECONDS", 10))
    # How often the controller looks at a job's replicas when no Docker event woke it earlier.
    poll_seconds: float = field(default_factory=lambda: _env_float("AIPTRAIN_POLL_SECONDS", 1.0))
    # gs:// paths: `remote` (Cloud Storage), `local` (kept under gcs_root), or `auto`: remote when
    # Google credentials or a storage emulator are configured, local otherwise.
    gcs_mode: str = field(default_factory=lambda: os.environ.get("AIPTRAIN_GCS", "auto"))
    # Seconds evaluators may keep running after the master succeeded, to score the final
    # checkpoint and exit on their own, before they are stopped.
    evaluator_grace_seconds: float = field(
        default_factory=lambda: _env_float("AIPTRAIN_EVALUATOR_GRACE_SECONDS", 120.0)
    )
    # The cache (sdists, wheelhouses, the staged-object index) keeps entries used within this
    # many days, and at most this many MiB (least recently used go first).
    cache_max_age_days: float = field(default_factory=lambda: _env_float("AIPTRAIN_CACHE_MAX_AGE_DAYS", 30.0))
    cache_max_size_mb: int = field(default_factory=lambda: _env_int("AIPTRAIN_CACHE_MAX_SIZE_MB", 10240))
    # The project in jobs' REST URIs when neither --project nor the submit named one (gcloud's variable).
    default_project: str = field(default_factory=lambda: gcloud_property("core/project") or DEFAULT_PROJECT)
    # The region recorded on a job when neither --region nor its config names one (gcloud's compute/region).
    default_region: str = field(default_factory=lambda: gcloud_property("compute/region") or "us-central1")
    # A submit whose runtime image is missing builds it first, as `docker run` pulls; 0 refuses (exit 3).
    auto_build: bool = field(default_factory=lambda: os.environ.get("AIPTRAIN_AUTO_BUILD", "1") != "0")
    # Where jobs' bridge networks get their subnets (one per job, sized to its replicas).
    subnet_pool: str = field(default_factory=lambda: os.environ.get("AIPTRAIN_SUBNET_POOL", DEFAULT_SUBNET_POOL))
    # The backend jobs run on unless `--backend` says otherwise.
    backend: str = field(default_factory=_env_backend)
    # Swarm: directories mounted at the same path on every node (NFS and the like), colon-separated:
    # a local job dir inside one works on a swarm of several nodes.
    swarm_shared_dirs: tuple[str, ...] = field(
        default_factory=lambda: tuple(d for d in os.environ.get("AIPTRAIN_SWARM_SHARED_DIRS", "").split(":") if d)
    )
    # Swarm: placement constraints every replica gets, comma-separated (`node.labels.gpu==true`).
    swarm_constraints: tuple[str, ...] = field(
        default_factory=lambda: tuple(c.strip() for c in os.environ.get("AIPTRAIN_SWARM_CONSTRAINTS", "").split(",")
                                      if c.strip())
    )
    # Processes and threads per replica; 0: no limit.
    replica_pids_limit: int = field(
        default_factory=lambda: _env_int("AIPTRAIN_REPLICA_PIDS_LIMIT", DEFAULT_REPLICA_PIDS_LIMIT)
    )
    # Replicas that may run at once before further jobs wait in QUEUED (aiptrain.admission);
    # unset: derived from the host's cores and free memory; 0: no cap.
    max_running_replicas: int | None = field(default_factory=lambda: _env_cap("AIPTRAIN_MAX_RUNNING_REPLICAS"))
    # How often the controller looks whether a queued job may start.
    admission_poll_seconds: float = 0.5
    # The controller exits after this many seconds with no active job (the next command starts it).
    controller_idle_seconds: float = field(
        default_factory=lambda: _env_float("AIPTRAIN_CONTROLLER_IDLE_SECONDS", 60.0)
    )
    # Client mode: the `aiptrain serve` that runs this CLI's jobs (AIPTRAIN_API, else gcloud's
    # api_endpoint_overrides/ml property); empty: jobs run on this machine.
    api_url: str = field(default_factory=lambda: (os.environ.get("AIPTRAIN_API")
                                                  or gcloud_property("api_endpoint_overrides/ml") or "").strip())
    # The bearer token sent to that server (one with --tokens): AIPTRAIN_API_TOKEN, else the
    # first line of the file AIPTRAIN_API_TOKEN_FILE names.
    api_token: str = field(default_factory=lambda: _env_token())

    @property
    def installation_id(self) -> str:
        """Names this aiptrain home on a shared engine: its containers and networks carry it,
        so two homes that both run a job `x` never see or remove each other's replicas."""
        import hashlib

        return hashlib.sha256(str(self.home).encode()).hexdigest()[:12]

    @property
    def store_path(self) -> Path:
        """The SQLite store's file (used unless AIPTRAIN_STORE names a PostgreSQL database)."""
        return self.home / "jobs.db"

    @property
    def store(self) -> Path | str:
        """The job store to open (aiptrain.jobtable.JobTable): the PostgreSQL URL, or the SQLite file."""
        return self.store_url or self.store_path

    @property
    def bucket_root(self) -> Path:
        return self.home / "bucket"

    @property
    def gcs_root(self) -> Path:
        """Where gs://BUCKET/PATH is kept when Cloud Storage is not used: <gcs_root>/BUCKET/PATH."""
        return self.home / "gcs"

    @property
    def logs_dir(self) -> Path:
        """The jobs' logs (JobPaths.log)."""
        return self.home / LOGS_DIR

    @property
    def locks_dir(self) -> Path:
        """The locks of jobs whose submit is at work (JobPaths.lock)."""
        return self.home / LOCKS_DIR

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    def job_paths(self, key: str) -> JobPaths:
        """Every file of the job of this key (aiptrain.jobkeys) in this home."""
        return JobPaths(self.home, key)

    @property
    def controller_lock_path(self) -> Path:
        """Held (flock) by the home's controller for as long as it runs (aiptrain.runner.control)."""
        return self.home / "controller.lock"

    @property
    def controller_state_path(self) -> Path:
        """The controller's PID, version and start time, written once it holds its lock."""
        return self.home / "controller.json"

    @property
    def controller_wake_path(self) -> Path:
        """A FIFO: commands write a byte to wake the controller."""
        return self.home / "controller.wake"

    @property
    def controller_log_path(self) -> Path:
        """The controller's own output: what it did at --verbosity info, and tracebacks."""
        return self.home / "controller.log"

    def ensure_dirs(self) -> None:
        for path in (self.home, self.logs_dir, self.locks_dir, self.cache_dir):
            path.mkdir(parents=True, exist_ok=True)

    def free_bytes(self) -> int:
        """Bytes free to aiptrain on the disk of its home (of the nearest directory that exists)."""
        path = self.home
        while not path.exists() and path != path.parent:
            path = path.parent
        stats = os.statvfs(path)
        return stats.f_bavail * stats.f_frsize

    def out_of_space(self) -> str | None:
        """What to tell the user when the home's disk has less than MIN_FREE_BYTES free: a job's
        store row, log and packages would be left half-written there. None when there is room."""
        free = self.free_bytes()
        if free >= MIN_FREE_BYTES:
            return None
        return (f"The disk of aiptrain's home [{self.home}] has {free // 1024} KiB free, less than the "
                f"{MIN_FREE_BYTES >> 20} MiB jobs need to record their state and logs: free space on it "
                "(`aiptrain cache prune` frees aiptrain's cache), or set AIPTRAIN_HOME to a directory on another disk.")
