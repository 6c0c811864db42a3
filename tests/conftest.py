"""Shared fixtures, and the rules of the layers under tests/. Tests that touch containers use the
real Docker engine: with CI=true a missing engine or image is a failure, never a skip."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLE_TRAINER = REPO / "sample_jobs" / "basic" / "trainer"
IN_CI = os.environ.get("CI", "").lower() == "true"

# The layers, one folder each under tests/ (docs/development.md). Those that reach the Docker
# engine: every test in them is marked `docker` here. The others start no container: their tests
# run with DOCKER_HOST naming a socket that does not exist, so one that reaches for the engine
# fails instead of quietly using it. Of those, tests/network reaches the package index: every
# test in it is marked `network` (`make unit`, tests/unit and tests/cli, leaves them out).
TESTS = Path(__file__).resolve().parent
ENGINE_LAYERS = ("engine", "swarm", "chaos")
NETWORK_LAYERS = ("network",)
NO_ENGINE_LAYERS = ("unit", "cli", *NETWORK_LAYERS)
NO_ENGINE = "unix:///nonexistent/tests-unit-and-cli-use-no-docker-engine.sock"


def trainer_with_setup_py(root: Path, setup_py: str) -> Path:
    """A package `trainer` (an empty `__init__.py` and a `task.py` that prints a line) under
    `root`, beside a setup.py of its own whose text is `setup_py`; the package's directory."""
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("")
    (root / "trainer" / "task.py").write_text("print('hi')\n")
    (root / "setup.py").write_text(setup_py)
    return root / "trainer"


def layer_of(path: Path) -> str:
    """The folder under tests/ that holds a test file ("" for one outside any)."""
    parts = path.resolve().relative_to(TESTS).parts if path.resolve().is_relative_to(TESTS) else ()
    return parts[0] if len(parts) > 1 else ""


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config, items):
    misplaced = []
    for item in items:
        layer = layer_of(item.path)
        if layer in ENGINE_LAYERS:
            item.add_marker(pytest.mark.docker)
        elif layer in NETWORK_LAYERS:
            item.add_marker(pytest.mark.network)
        elif layer not in NO_ENGINE_LAYERS:
            misplaced.append(f"{item.nodeid}: outside the layers ({', '.join(ENGINE_LAYERS + NO_ENGINE_LAYERS)})")
        elif "docker_api" in item.fixturenames or item.get_closest_marker("docker"):
            misplaced.append(f"{item.nodeid}: uses the Docker engine, so it belongs in tests/engine (or swarm, chaos)")
        elif layer == "unit" and item.get_closest_marker("network"):
            misplaced.append(f"{item.nodeid}: reaches the network, so it belongs in tests/network")
    if misplaced:
        raise pytest.UsageError("tests in the wrong layer:\n  " + "\n  ".join(misplaced))


@pytest.fixture(autouse=True)
def _no_engine_outside_the_engine_layers(request, monkeypatch):
    """tests/unit, tests/cli and tests/network: DOCKER_HOST names no engine (for this process and the commands it
    starts), so a test there that reaches for one fails."""
    if layer_of(request.node.path) in NO_ENGINE_LAYERS:
        monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)


def _unavailable(reason: str):
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: Docker tests must not skip)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_api():
    """A low-level Docker client; the engine must answer."""
    try:
        import docker

        api = docker.APIClient(version="auto", **docker.utils.kwargs_from_env())
        api.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "no engine"
        _unavailable(f"no Docker engine: {exc}")
    return api


def require_image(api, image: str) -> None:
    import docker.errors

    try:
        api.inspect_image(image)
    except docker.errors.ImageNotFound:
        _unavailable(f"image {image} is not built (make images)")


@pytest.fixture(scope="session")
def minimal_runtime(docker_api):
    require_image(docker_api, runtime_image("minimal"))
    return "minimal"


def runtime_image(version: str) -> str:
    """A runtime's image name, where AIPTRAIN_IMAGE_REPOSITORY (if set) puts it."""
    from aiptrain.runtime_catalog import image_repository

    return f"{image_repository()}:{version}"


@pytest.fixture
def package(tmp_path):
    """A minimal sdist: metadata only, enough for a dry run to read its (absent) requirements."""
    import io
    import tarfile

    path = tmp_path / "trainer-0.1.tar.gz"
    metadata = b"Metadata-Version: 2.1\nName: trainer\nVersion: 0.1\n"
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo("trainer-0.1/PKG-INFO")
        info.size = len(metadata)
        archive.addfile(info, io.BytesIO(metadata))
    return path


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An isolated aiptrain installation: store, bucket, logs under tmp_path."""
    home = tmp_path / "aiptrain-home"
    monkeypatch.setenv("AIPTRAIN_HOME", str(home))
    monkeypatch.setenv("AIPTRAIN_DEFAULT_RUNTIME", "minimal")
    # No admission cap: tests run jobs side by side whatever this host's cores and free memory;
    # tests of admission set their own cap.
    monkeypatch.setenv("AIPTRAIN_MAX_RUNNING_REPLICAS", "0")
    monkeypatch.delenv("AIPTRAIN_STAGING_BUCKET", raising=False)
    monkeypatch.delenv("AIPTRAIN_STORE", raising=False)  # never a team's PostgreSQL store: the home's own
    monkeypatch.setenv("AIPTRAIN_CONTROLLER_IDLE_SECONDS", "10")  # a test's controller goes soon after it
    yield home
    stop_controller(home)


def stop_controller(home: Path) -> None:
    """The home's controller, if a test started one, stops with the test (its jobs are the test's
    to clean up)."""
    from aiptrain.runner import control
    from aiptrain.settings import Settings

    if (home / "controller.lock").exists():
        settings = Settings(home=home)
        control.stop(settings, timeout=30)
        remove_jobs_left_running(settings.installation_id)


def remove_jobs_left_running(installation: str) -> None:
    """A test that ends while its job still runs leaves it to nobody once its controller is
    stopped: its containers and networks go with the test."""
    try:
        import docker

        api = docker.APIClient(timeout=60, **docker.utils.kwargs_from_env())
        label = f"aiptrain.installation={installation}"
        for container in api.containers(all=True, filters={"label": label}):
            api.remove_container(container["Id"], force=True)
        for network in api.networks(filters={"label": label}):
            api.remove_network(network["Id"])
    except Exception:  # noqa: BLE001 - no engine (a pure test), or already gone
        pass


@pytest.fixture
def gcs_home(home, monkeypatch):
    """A home where gs:// is kept on this machine (no Google credentials, no emulator)."""
    monkeypatch.setenv("AIPTRAIN_GCS", "local")
    monkeypatch.setenv("AIPTRAIN_CONTROLLER_IDLE_SECONDS", "2")  # the endpoint goes with the controller
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture(autouse=True)
def _shared_engine_resources_go_with_their_homes(tmp_path):
    """What an aiptrain home shares on the engine (its storage endpoint, its lone replicas'
    network: labelled with the home) goes with the test's homes, wherever under tmp_path they
    are; nothing to do (no engine call) where the test made no home with jobs."""
    yield
    if not (tmp_path / "jobs.db").exists() and not any(tmp_path.glob("*/jobs.db")):
        return
    remove_shared_engine_resources(tmp_path)


def remove_shared_engine_resources(tmp_path: Path) -> None:
    """Remove the storage endpoints, services and networks of the homes under `tmp_path`."""
    try:
        import docker

        api = docker.APIClient(version="auto", **docker.utils.kwargs_from_env())
        containers = api.containers(all=True, filters={"label": "aiptrain.role"})
    except Exception:  # noqa: BLE001 - no engine: nothing to remove
        return
    ours = str(tmp_path)
    try:  # a swarm's storage endpoint (a service): before its network
        services = api.services(filters={"label": "aiptrain.role"})
    except docker.errors.APIError:  # not a swarm manager
        services = []
    for service in services:
        if (service["Spec"]["Labels"].get("aiptrain.home") or "").startswith(ours):
            try:
                api.remove_service(service["ID"])
            except docker.errors.APIError:  # removed meanwhile by the last job's supervisor
                pass
    networks = api.networks(filters={"label": "aiptrain.role"})
    for container in containers:
        if (container["Labels"].get("aiptrain.home") or "").startswith(ours):
            try:
                api.remove_container(container["Id"], force=True)
            except docker.errors.APIError:  # gone, or being removed by the last job's controller
                pass
    for network in networks:
        if (network["Labels"].get("aiptrain.home") or "").startswith(ours):
            _remove_network(api, network)


def _remove_network(api, network: dict) -> None:
    """A network of a test's home; one a removed service's task still leaves is waited for."""
    import docker

    for _ in range(100):
        try:
            api.remove_network(network["Id"])
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if "not found" in str(exc):  # removed meanwhile by the last job's supervisor
                return
            if "in use" not in str(exc):  # a replica the test left: its own assertions say so
                print(f"could not remove {network['Name']}: {exc}")
                return
        time.sleep(0.2)
    print(f"could not remove {network['Name']}: still in use")


@pytest.fixture
def run(home, capsys):
    """aiptrain's main() in this process, fast: (exit status, stdout, stderr)."""
    from aiptrain.cli import main

    def invoke(*argv: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exit_:
            main(list(argv))
        out, err = capsys.readouterr()
        return exit_.value.code, out, err

    return invoke


@pytest.fixture
def cli(home):
    """Run `aiptrain ARGS...` as a real process; returns CompletedProcess (text)."""

    def run(*args: str, timeout: float = 180, check_code: int | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "aiptrain", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ},
        )
        if check_code is not None:
            assert result.returncode == check_code, (result.returncode, result.stdout, result.stderr)
        return result

    return run


def job_resources(api, job_id: str | None = None) -> list[str]:
    """Names of the containers and networks aiptrain made (for one job, or any), the job's
    install container (aiptrain.installs) included: of any home (a client-mode server's too)."""
    label = "aiptrain.job-id" if job_id is None else f"aiptrain.job-id={job_id}"
    install = "aiptrain.install-for" if job_id is None else f"aiptrain.install-for={job_id}"
    containers = [c["Names"][0] for key in (label, install) for c in api.containers(all=True, filters={"label": key})]
    networks = [n["Name"] for n in api.networks(filters={"label": label})]
    return containers + networks


def this_installation() -> str:
    """The label that scopes engine objects to the current AIPTRAIN_HOME: a test that acts when a
    job's replica runs must not take another checkout's job of the same name for its own."""
    from aiptrain.labels import LABEL_INSTALLATION
    from aiptrain.settings import Settings

    return f"{LABEL_INSTALLATION}={Settings().installation_id}"


def wait_for(predicate, timeout: float = 60, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def submit_args(tmp_path, minimal_runtime):
    """Flags for a BASIC job of the sample trainer with a fresh job dir; extend as needed."""

    def build(job_id: str, *extra: str, user_args: tuple[str, ...] = ("--steps", "10")) -> list[str]:
        return [
            "jobs", "submit", "training", job_id,
            "--package-path", str(SAMPLE_TRAINER),
            "--module-name", "trainer.task",
            "--job-dir", str(tmp_path / f"{job_id}-out"),
            "--region", "us-central1",
            "--runtime-version", minimal_runtime,
            *extra,
            "--", *user_args,
        ]

    return build


def controller_pids(home: Path) -> list[int]:
    """PIDs of the controller of `home` (at most one; a list, to be killed or waited for)."""
    pids = []
    wanted = f"AIPTRAIN_HOME={home}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"aiptrain.runner.controller" not in argv:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in environ:
            pids.append(int(entry.name))
    return pids


def kill_controller(home: Path) -> int:
    """kill -9 of the home's controller, waiting until it is gone; how many were killed."""
    import signal

    pids = controller_pids(home)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not controller_pids(home), timeout=30, interval=0.01, what="the controller to die")
    return len(pids)


@pytest.fixture
def controller_in_process(monkeypatch):
    """`start(settings, backend)`: the home's controller in a thread of the test, driving every job
    on `backend` (a FakeBackend), and woken directly instead of through its FIFO. Stopped after."""
    import threading

    from aiptrain.ownership import JobLock
    from aiptrain.runner import control
    from aiptrain.runner import controller as controller_module

    started = []

    def start(settings, backend):
        monkeypatch.setattr(controller_module, "open_backend", lambda s, name: backend)
        controller = controller_module.Controller(settings, JobLock.try_acquire(settings.controller_lock_path),
                                                  idle_exit=False)

        def send(settings, word=control.WAKE, job_id=""):
            if job_id:
                controller.look_now(job_id)
            controller.news.set()
            controller.wake.set()
            return True

        monkeypatch.setattr(control, "ensure_running", lambda settings: None)
        monkeypatch.setattr(control, "send", send)
        thread = threading.Thread(target=controller.run, daemon=True)
        thread.start()
        started.append((controller, thread))
        return controller

    yield start
    for controller, thread in started:
        controller.stopping.set()
        controller.wake.set()
        thread.join(timeout=60)


def drive_to_end(driver, max_steps: int = 10_000):
    """Step a JobDriver (aiptrain.runner.driver) as the controller would, without its waits,
    until the job ends; the state it ended in."""
    from aiptrain.runner.driver import Phase
    from aiptrain.runner.groups import DRAIN_LOOK_SECONDS

    for _ in range(max_steps):
        if driver.step() is None:
            return driver.final_state
        if driver.phase is Phase.ENDING:  # the drain waits on the log followers' threads: let them run
            time.sleep(DRAIN_LOOK_SECONDS)
    raise AssertionError(f"job {driver.job_id} did not end in {max_steps} steps (phase {driver.phase})")


# -- the job store on both of its databases ----------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server of the session's own (tests/pgserver.py); with CI=true a missing
    PostgreSQL (or psycopg) is a failure, never a skip."""
    import pgserver

    programs = pgserver.bin_dir()
    if programs is None:
        _unavailable("no PostgreSQL: scripts/install-postgresql.sh (apt-get install postgresql), as root")
    try:
        import psycopg  # noqa: F401 - the driver the store uses
    except ImportError:
        _unavailable("no psycopg: pip install -e '.[postgresql]' (make install)")
    server = pgserver.Server(programs)
    try:
        server.start()
    except RuntimeError as exc:
        server.stop()
        _unavailable(f"PostgreSQL did not start: {exc}")
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server):
    """The URL of an empty database on the session's server."""
    return postgres_server.new_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request, tmp_path):
    """Where a store test's JobStore lives: the SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "jobs.db"
    return request.getfixturevalue("postgres_url")
