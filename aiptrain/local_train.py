"""`aiptrain local train`: run a trainer as processes on this machine, as
`gcloud ai-platform local train` does (reference: aiplatform.md §2.6). No Docker, no packaging.

`plan_processes()` is pure: it turns the flags into one ProcessSpec per task (argv, env,
cwd, port) in launch order. `run()` starts them: background tasks (ps, workers, then
evaluators) each in their own process group, the primary last. The exit status is the
primary's; when it exits, or aiptrain gets Ctrl-C or SIGTERM, every background process
group is stopped (SIGTERM, then SIGKILL), so nothing is left running.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TextIO

from aiptrain.errors import EnvironmentNotReady, ValidationError
from aiptrain.planning import pytorch_env
from aiptrain.settings import LOCAL_PYTHON_VARS, local_python_override
from aiptrain.topology import EVALUATOR, MASTER, PS, WORKER, task_name

DEFAULT_START_PORT = 27182
DEFAULT_DISTRIBUTED_COUNT = 2  # workers and parameter servers when --distributed gives none
STOP_GRACE_SECONDS = 5.0  # between SIGTERM and SIGKILL
BAD_FLAG_WARNING = "{flag} is ignored if --distributed is not provided.\nDid you mean to run distributed training?"
_TF_VERSION_SCRIPT = "import tensorflow as tf; print(tf.version.VERSION)"


@dataclass(frozen=True)
class ProcessSpec:
    task_name: str  # master-replica-0, worker-replica-1, ...: the prefix of its output lines
    argv: list[str]
    env: dict[str, str]  # set on top of aiptrain's own environment
    cwd: str
    port: int | None  # its address in the cluster; None for evaluators and a single process
    primary: bool = False


@dataclass(frozen=True)
class LocalTrainArgs:
    module_name: str
    package_path: str  # absolute
    user_args: tuple[str, ...] = ()
    job_dir: str | None = None
    distributed: bool = False
    worker_count: int | None = None
    parameter_server_count: int | None = None
    evaluator_count: int | None = None
    start_port: int = DEFAULT_START_PORT


def ignored_flag_warnings(args: LocalTrainArgs) -> list[str]:
    """gcloud's warnings for cluster sizes given without --distributed."""
    if args.distributed:
        return []
    given = (("--parameter-server-count", args.parameter_server_count), ("--worker-count", args.worker_count))
    return [BAD_FLAG_WARNING.format(flag=flag) for flag, count in given if count]


def validate(args: LocalTrainArgs) -> None:
    if not os.path.isdir(args.package_path):
        raise ValidationError(
            f"--package-path [{args.package_path}] is not a directory: pass the directory of your trainer package."
        )
    for flag, count in (("--worker-count", args.worker_count), ("--parameter-server-count",
                        args.parameter_server_count), ("--evaluator-count", args.evaluator_count)):
        if count is not None and count < 0:
            raise ValidationError(f"{flag} must be 0 or more, not {count}.")
    if args.distributed:
        last_port = args.start_port + cluster_size(args) - 1
        if args.start_port < 1 or last_port > 65535:
            raise ValidationError(
                f"--start-port {args.start_port} leaves no room for the cluster's {cluster_size(args)} ports "
                "(ports run from --start-port up): choose a port between 1024 and "
                f"{65536 - cluster_size(args)}."
            )


def cluster_size(args: LocalTrainArgs) -> int:
    """Ports the cluster uses: the primary, the parameter servers and the workers."""
    return 1 + _count(args.parameter_server_count) + _count(args.worker_count)


def _count(given: int | None) -> int:
    # gcloud: 2 when the flag is absent; an explicit 0 stays 0.
    return DEFAULT_DISTRIBUTED_COUNT if given is None else given


def plan_processes(args: LocalTrainArgs, python: str, primary_type: str, pythonpath: str = "") -> list[ProcessSpec]:
    """The processes to start, in launch order (the primary last). `primary_type` is TF_CONFIG's
    name of the primary, `chief` or `master`; `pythonpath` the PYTHONPATH the processes inherit."""
    package_root = os.path.dirname(args.package_path)
    user_args = [*args.user_args, *(["--job-dir", args.job_dir] if args.job_dir else [])]
    argv = [python, "-m", args.module_name, *user_args]
    job = {"job_name": args.module_name, "args": user_args}
    base_env = {"PYTHONPATH": os.pathsep.join(p for p in (package_root, pythonpath) if p)}

    def spec(task_type: str, index: int, port: int | None, cluster: dict, env: dict[str, str]) -> ProcessSpec:
        tf_config = {
            "job": job,
            "task": {"type": primary_type if task_type == MASTER else task_type, "index": index} if cluster else {},
            "cluster": cluster,
            "environment": "cloud",
        }
        return ProcessSpec(
            task_name=task_name(task_type, index),
            argv=argv,
            env={**base_env, "TF_CONFIG": json.dumps(tf_config), **env},
            cwd=package_root,
            port=port,
            primary=task_type == MASTER,
        )

    if not args.distributed:
        return [spec(MASTER, 0, None, {}, pytorch_env("localhost", args.start_port, 0, MASTER, 0))]

    ps_count, worker_count = _count(args.parameter_server_count), _count(args.worker_count)
    ports = list(range(args.start_port, args.start_port + cluster_size(args)))
    ps_ports, worker_ports = ports[1 : 1 + ps_count], ports[1 + ps_count :]
    cluster = {
        primary_type: [f"localhost:{ports[0]}"],
        PS: [f"localhost:{port}" for port in ps_ports],
        WORKER: [f"localhost:{port}" for port in worker_ports],
    }
    # Output lines are prefixed, so the processes must not hold them in a pipe's buffer.
    unbuffered = {"PYTHONUNBUFFERED": "1"}

    def torch(task_type: str, index: int) -> dict[str, str]:
        return {**unbuffered, **pytorch_env("localhost", ports[0], worker_count, task_type, index)}

    return [
        *(spec(PS, i, port, cluster, torch(PS, i)) for i, port in enumerate(ps_ports)),
        *(spec(WORKER, i, port, cluster, torch(WORKER, i)) for i, port in enumerate(worker_ports)),
        *(spec(EVALUATOR, i, None, cluster, torch(EVALUATOR, i)) for i in range(args.evaluator_count or 0)),
        spec(MASTER, 0, ports[0], cluster, torch(MASTER, 0)),
    ]


# -- the host: which Python, which TensorFlow -------------------------------------------------


def local_python(environ: Mapping[str, str] | None = None) -> str:
    """AIPTRAIN_LOCAL_PYTHON, then CLOUDSDK_ML_ENGINE_LOCAL_PYTHON (gcloud's ml_engine/local_python
    property), then `python` on PATH, then the Python running aiptrain."""
    environ = os.environ if environ is None else environ
    return local_python_override(environ) or shutil.which("python", path=environ.get("PATH")) or sys.executable


def primary_type_for(tf_version: str | None) -> tuple[str, str | None]:
    """(TF_CONFIG's primary name, a warning or None) from what `python` reports as TensorFlow's
    version (None: TensorFlow would not import): `master` for 1.x, `chief` otherwise, as gcloud."""
    if tf_version is None:
        return "chief", "Cannot import tensorflow: using \"chief\" as the primary task in TF_CONFIG " \
                        f"(set {LOCAL_PYTHON_VARS[0]} to a Python with TensorFlow if that is wrong)."
    if tf_version.startswith("1."):
        return MASTER, None
    if tf_version.startswith("2."):
        return "chief", None
    return "chief", f"Unexpected tensorflow version {tf_version}: using \"chief\" as the primary task in TF_CONFIG."


def tensorflow_version(python: str) -> str | None:
    """The version of TensorFlow `python` imports, or None when it does not import."""
    try:
        result = subprocess.run([python, "-c", _TF_VERSION_SCRIPT], capture_output=True, text=True)
    except OSError:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


# -- running ------------------------------------------------------------------------------------


class _Prefixer:
    """Copies a process's output to ours line by line, each line prefixed with its task name."""

    def __init__(self, stream, out: TextIO, prefix: str, lock: threading.Lock):
        self.thread = threading.Thread(target=self._copy, args=(stream, out, prefix, lock), daemon=True)
        self.thread.start()

    @staticmethod
    def _copy(stream, out: TextIO, prefix: str, lock: threading.Lock) -> None:
        with stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                with lock:
                    out.write(f"{prefix}: {line}\n")
                    out.flush()


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL it if aiptrain itself is killed outright."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _exit_status(returncode: int) -> int:
    """A shell's exit status: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class LocalCluster:
    """Starts the processes of a plan and stops them again. With `prefix_output` each line a
    process prints is prefixed with its task name; otherwise the processes share our stdio."""

    def __init__(self, specs: list[ProcessSpec], prefix_output: bool, stdout: TextIO, stderr: TextIO):
        self.specs = specs
        self.prefix_output = prefix_output
        self.stdout, self.stderr = stdout, stderr
        self.background: list[subprocess.Popen] = []
        self.primary: subprocess.Popen | None = None
        self._copiers: list[_Prefixer] = []
        self._lock = threading.Lock()
        self._kill_timer: threading.Timer | None = None

    def run(self) -> int:
        """Start every process, wait for the primary, stop the rest; the primary's exit status.
        SIGINT and SIGTERM to aiptrain go to the primary, and then everything is stopped."""
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self._forward) for sig in handled}
        try:
            for spec in self.specs:
                self._start(spec)
            if self.primary is None:
                raise ValueError("no process spec is the primary")
            return _exit_status(self.primary.wait())
        finally:
            if self._kill_timer:
                self._kill_timer.cancel()
            self.stop_background()
            for copier in self._copiers:
                copier.thread.join(timeout=STOP_GRACE_SECONDS)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _start(self, spec: ProcessSpec) -> None:
        pipe = subprocess.PIPE if self.prefix_output else None
        try:
            process = subprocess.Popen(
                spec.argv,
                cwd=spec.cwd,
                env={**os.environ, **spec.env},
                stdout=pipe,
                stderr=pipe,
                # The primary keeps the terminal (its stdin, Ctrl-C), as if run directly; background
                # tasks get their own process group, so stopping one reaches its children too.
                stdin=None if spec.primary else subprocess.DEVNULL,
                start_new_session=not spec.primary,
                preexec_fn=None if spec.primary else _die_with_parent,
            )
        except OSError as exc:
            raise EnvironmentNotReady(
                f"Cannot run [{spec.argv[0]}]: {exc.strerror or exc}. Set {LOCAL_PYTHON_VARS[0]} to a Python "
                "interpreter that can run your trainer."
            ) from None
        if self.prefix_output:
            self._copiers += [
                _Prefixer(process.stdout, self.stdout, spec.task_name, self._lock),
                _Prefixer(process.stderr, self.stderr, spec.task_name, self._lock),
            ]
        if spec.primary:
            self.primary = process
        else:
            self.background.append(process)

    def _forward(self, signum, frame) -> None:
        if self.primary is not None and self.primary.poll() is None:
            self.primary.send_signal(signum)
            if self._kill_timer is None:
                self._kill_timer = threading.Timer(STOP_GRACE_SECONDS, self._kill_primary)
                self._kill_timer.daemon = True
                self._kill_timer.start()
        else:
            # Still starting the background tasks: stop them, and end like an interrupted command.
            self.stop_background()
            raise KeyboardInterrupt

    def _kill_primary(self) -> None:
        if self.primary is not None and self.primary.poll() is None:
            self.primary.kill()

    def stop_background(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM every background process group, SIGKILL what is left after `grace` seconds."""
        running = [p for p in self.background if p.poll() is None]
        _signal_groups(running, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        # Also the groups whose leader is gone: a leftover child of a task dies with its group.
        _signal_groups(self.background, signal.SIGKILL)
        for process in self.background:
            process.wait()


def _signal_groups(processes: list[subprocess.Popen], signum: int) -> None:
    for process in processes:
        try:
            os.killpg(process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def run(args: LocalTrainArgs, warn: Callable[[str], None], stdout: TextIO = sys.stdout,
        stderr: TextIO = sys.stderr) -> int:
    """Validate, plan and run a local training; the primary's exit status."""
    validate(args)
    for message in ignored_flag_warnings(args):
        warn(message)
    python = local_python()
    primary_type = "chief"
    if args.distributed:
        primary_type, warning = primary_type_for(tensorflow_version(python))
        if warning:
            warn(warning)
    specs = plan_processes(args, python, primary_type, os.environ.get("PYTHONPATH", ""))
    return LocalCluster(specs, prefix_output=args.distributed, stdout=stdout, stderr=stderr).run()
