"""The fault suite (issue 12, item 14): what users and machines do to jobs, at random moments.

Each scenario runs CHAOS_RUNS times (1 in `make test`, the short variant; `make chaos` sets
more) and counts its runs, the runs that held (the job reached the state it must reach and
every command answered as documented) and the orphans (containers, networks, lock files or
work dirs that nothing needs any more). The table is printed at the end; every run must hold
with no orphan.

- kill -9 of each replica type (master, worker, ps, evaluator) while the job runs: the replica
  is restarted in place and the job SUCCEEDS;
- kill -9 of the controller with jobs running, queued and mid-study: the next command starts a new
  one, which drives them on; every job SUCCEEDS, no trial runs twice;
- kill -9 of the controller mid-teardown (stopping a replica that holds on to SIGTERM, draining
  its last lines, removing containers): the next one finishes the ending as decided (SUCCEEDED
  or CANCELLED), every line once, one closing line, nothing left;
- kill -9 of the CLI during submit: the job either never existed (nothing left) or ends;
- concurrent submits of one job ID: exactly one is accepted, the others exit 2;
- fuzzed job IDs and labels (hypothesis): accepted exactly by the rule, or one escaped line;
- a corpus of malformed configs: exit 2, one line, nothing created;
- nasty trainer output (escape sequences, invalid UTF-8, NUL, \\r, a 1 MB line, a flood):
  every byte reaches the log, a pipe gets it unchanged;
- security: the Docker socket and aiptrain's home are never mounted, replicas are not root
  and get the packages read-only.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml

from aiptrain.jobpaths import JobPaths

from conftest import REPO, controller_pids, job_resources, kill_controller, wait_for

pytestmark = pytest.mark.chaos

RUNS = int(os.environ.get("CHAOS_RUNS", "1"))
PROBE = REPO / "tests" / "trainers" / "probe"
AIPTRAIN = [sys.executable, "-m", "aiptrain"]
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


# -- the table --------------------------------------------------------------------------------


class Tally:
    def __init__(self):
        self.rows: dict[str, Counter] = {}

    def record(self, scenario: str, held: bool, orphans: list[str]) -> None:
        row = self.rows.setdefault(scenario, Counter())
        row["runs"] += 1
        row["held"] += bool(held)
        row["orphans"] += len(orphans)

    def lines(self) -> list[str]:
        width = max([len("scenario"), *map(len, self.rows)])
        lines = [f"{'scenario':<{width}}  {'runs':>5}  {'held':>5}  {'orphans':>7}"]
        for name, row in self.rows.items():
            lines.append(f"{name:<{width}}  {row['runs']:>5}  {row['held']:>5}  {row['orphans']:>7}")
        return lines

    def assert_all_held(self, scenario: str, notes: list[str]) -> None:
        row = self.rows[scenario]
        assert row["held"] == row["runs"] and row["orphans"] == 0, "\n".join(notes)


@pytest.fixture(scope="module")
def tally(request):
    table = Tally()
    yield table
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter and capture and table.rows:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            reporter.write_sep("-", f"fault suite: {RUNS} run(s) per scenario")
            for line in table.lines():
                reporter.write_line(line)
    report = os.environ.get("CHAOS_REPORT")
    if report and table.rows:
        Path(report).write_text("\n".join(table.lines()) + "\n")


# -- helpers ----------------------------------------------------------------------------------


def aiptrain(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*AIPTRAIN, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ})


def state_of(job_id: str) -> str | None:
    """The job's state after `describe` (which starts a controller if none runs); None if it does not exist."""
    result = aiptrain("jobs", "describe", job_id)
    if result.returncode != 0:
        return None
    return yaml.safe_load(result.stdout)["state"]


def wait_terminal(job_id: str, timeout: float = 180) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = state_of(job_id)
        if state is None or state in TERMINAL:
            return state
        time.sleep(0.5)
    return state_of(job_id)


def orphans(home: Path, docker_api, job_ids: list[str]) -> list[str]:
    """What is left of jobs that ended (or never existed) and that nothing needs."""
    found = []
    for job_id in job_ids:
        found += job_resources(docker_api, job_id)
        paths = JobPaths(home, job_id)
        found += [str(p.relative_to(home)) for p in (paths.lock, paths.work_dir) if p.exists()]
    return found


def probe_config(tmp_path: Path, *types: str) -> str:
    """A CUSTOM job config with one replica of each of `types` besides the master."""
    fields = {"scaleTier": "CUSTOM", "masterType": "n1-standard-4"}
    for kind, prefix in (("worker", "worker"), ("ps", "parameterServer"), ("evaluator", "evaluator")):
        if kind in types:
            fields[f"{prefix}Type"], fields[f"{prefix}Count"] = "n1-standard-4", 1
    path = tmp_path / f"config-{'-'.join(types) or 'basic'}.yaml"
    path.write_text(yaml.safe_dump({"trainingInput": fields}))
    return str(path)


def probe_submit(job_id: str, config: str, runtime: str, *run: str) -> list[str]:
    return ["jobs", "submit", "training", job_id, "--config", config, "--package-path", str(PROBE),
            "--module-name", "probe.task", "--region", "us-central1", "--runtime-version", runtime,
            "--", *[arg for item in run for arg in ("--run", item)]]


def container_of(docker_api, job_id: str, task_type: str) -> dict | None:
    found = docker_api.containers(filters={"label": [f"aiptrain.job-id={job_id}", f"aiptrain.task-type={task_type}"]})
    return found[0] if found else None


# -- kill -9 of replicas ------------------------------------------------------------------------

REPLICA_TYPES = ("master", "worker", "ps", "evaluator")


def test_kill_9_of_each_replica_type(tally, home, docker_api, minimal_runtime, tmp_path):
    """Every replica type is killed with SIGKILL at a random moment of a running job (one job per
    type and run, run concurrently): restarted in place, the job still SUCCEEDS."""
    config = probe_config(tmp_path, "worker", "ps", "evaluator")
    notes: list[str] = []

    def one_run(task_type: str) -> None:
        job_id = f"kill_{task_type}_{uuid.uuid4().hex[:6]}"
        submitted = aiptrain(*probe_submit(job_id, config, minimal_runtime,
                                           "master=4", "worker=4", "evaluator=2"))
        killed = False
        if submitted.returncode == 0:  # submit returns once every replica runs
            time.sleep(random.uniform(0.0, 2.5))
            container = container_of(docker_api, job_id, task_type)
            if container:
                try:
                    docker_api.kill(container["Id"], signal="SIGKILL")
                    killed = True
                except Exception:  # noqa: BLE001 - it exited on its own just before
                    pass
        state = wait_terminal(job_id)
        left = orphans(home, docker_api, [job_id]) if state in TERMINAL else []
        held = submitted.returncode == 0 and state == "SUCCEEDED"
        if not held or left:
            notes.append(f"{task_type}: submit {submitted.returncode} {submitted.stderr[-300:]} state {state} "
                         f"killed {killed} left {left}")
        tally.record(f"kill -9 {task_type}", held, left)

    for _ in range(RUNS):
        threads = [threading.Thread(target=one_run, args=(t,)) for t in REPLICA_TYPES]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for task_type in REPLICA_TYPES:
        tally.assert_all_held(f"kill -9 {task_type}", notes)


# -- kill -9 of the controller and of the CLI -----------------------------------------------------


def test_kill_9_of_the_controller_with_a_job_running(tally, home, docker_api, minimal_runtime, tmp_path):
    config = probe_config(tmp_path, "worker")
    notes: list[str] = []
    for _ in range(RUNS):
        job_id = f"kill_ctl_{uuid.uuid4().hex[:6]}"
        submitted = aiptrain(*probe_submit(job_id, config, minimal_runtime, "master=3", "worker=2"))
        time.sleep(random.uniform(0.0, 3.5))
        kill_controller(home)
        state = wait_terminal(job_id)
        left = orphans(home, docker_api, [job_id])
        held = submitted.returncode == 0 and state == "SUCCEEDED"
        if not held or left:
            notes.append(f"submit {submitted.returncode} state {state} left {left}")
        tally.record("kill -9 controller, job running", held, left)
    tally.assert_all_held("kill -9 controller, job running", notes)


def test_kill_9_of_the_controller_with_jobs_queued(tally, home, docker_api, minimal_runtime, tmp_path, monkeypatch):
    """Three two-replica jobs under a cap of two replicas: one runs, two wait in the queue. The
    controller dies at a random moment (admitting, launching, tearing down); the next command's
    controller runs every job, in submission order, once."""
    monkeypatch.setenv("AIPTRAIN_MAX_RUNNING_REPLICAS", "2")
    config = probe_config(tmp_path, "worker")
    notes: list[str] = []
    for _ in range(RUNS):
        job_ids = [f"kill_q{n}_{uuid.uuid4().hex[:6]}" for n in range(3)]
        submitted = [aiptrain(*probe_submit(job_id, config, minimal_runtime, "master=1", "worker=1"))
                     for job_id in job_ids]
        time.sleep(random.uniform(0.0, 3.0))
        kill_controller(home)
        states = [wait_terminal(job_id, timeout=240) for job_id in job_ids]
        left = orphans(home, docker_api, job_ids)
        held = all(r.returncode == 0 for r in submitted) and states == ["SUCCEEDED"] * 3
        if not held or left:
            notes.append(f"submits {[r.returncode for r in submitted]} states {states} left {left}")
        tally.record("kill -9 controller, jobs queued", held, left)
    tally.assert_all_held("kill -9 controller, jobs queued", notes)


TEARDOWN_PHASES = ("stopping", "draining", "removing")
CLOSING_LINE = {"SUCCEEDED": "Job completed successfully.", "CANCELLED": "Job cancelled."}


def first_event(docker_api, job_id: str, since: float, wanted) -> dict | None:
    """The first engine event of the job's containers, from `since` on (replayed when it already
    happened), that `wanted(action, attributes)` accepts."""
    stream = docker_api.events(since=since, until=since + 300, decode=True,
                               filters={"type": "container", "label": f"aiptrain.job-id={job_id}"})
    try:
        for event in stream:
            if wanted(event.get("Action", ""), (event.get("Actor") or {}).get("Attributes") or {}):
                return event
    finally:
        stream.close()
    return None


def worker_event(action: str, signal_number: str | None = None):
    return lambda seen, attributes: (seen == action and attributes.get("aiptrain.task-type") == "worker"
                                     and (signal_number is None or attributes.get("signal") == signal_number))


def job_records(home: Path, job_id: str, task: str) -> list[str]:
    from aiptrain.logs import records_of_task
    from aiptrain.settings import Settings

    path = Settings(home=home).job_paths(job_id).log
    return [r.message for r in records_of_task(path, task)] if path.exists() else []


def standing(home: Path, job_id: str) -> tuple[str | None, bool]:
    """The job's state and whether a verdict is recorded, as the store says (no command, so no
    controller is started by looking)."""
    from aiptrain.store import JobStore

    store = JobStore(home / "jobs.db")
    job = store.get(job_id)
    return (job.state.value if job else None), store.verdict(job_id) is not None


def test_kill_9_of_the_controller_mid_teardown(tally, home, docker_api, minimal_runtime, tmp_path, monkeypatch):
    """A three-replica job ends (its master succeeds, or it is cancelled) and its worker answers
    SIGTERM by holding on until the test releases it, so the teardown lasts as long as the test
    wants. The controller is killed once the decision is recorded: while it stops the worker
    (always mid-teardown), or at the worker's exit (draining its last lines), or at the first
    container's removal. The next command's controller finishes the same ending: the decided
    state, every line of every replica once, one closing line, nothing left."""
    monkeypatch.setenv("AIPTRAIN_STOP_GRACE_SECONDS", "120")  # the held worker, not the engine, ends the stop
    config = probe_config(tmp_path, "worker", "ps")
    notes: list[str] = []
    for run in range(RUNS):
        phase, cancel = TEARDOWN_PHASES[run % 3], bool(run // 3 % 2)
        held, left, note = teardown_run(home, docker_api, minimal_runtime, config, tmp_path, phase, cancel)
        if not held or left:
            notes.append(note)
        print(note)
        tally.record("kill -9 controller mid-teardown", held, left)
    tally.assert_all_held("kill -9 controller mid-teardown", notes)


def teardown_run(home: Path, docker_api, runtime: str, config: str, tmp_path: Path, phase: str,
                 cancel: bool) -> tuple[bool, list[str], str]:
    """One run of the mid-teardown scenario: (held, orphans, what happened)."""
    from aiptrain.logs import CLOSING_LINES
    from aiptrain.settings import Settings

    lines, bye = 200, 20_000
    expected = "CANCELLED" if cancel else "SUCCEEDED"
    job_id = f"kill_td_{uuid.uuid4().hex[:6]}"
    log_path = Settings(home=home).job_paths(job_id).log
    job_dir = tmp_path / job_id
    since = time.time() - 1
    submitted = aiptrain("jobs", "submit", "training", job_id, "--config", config, "--package-path", str(PROBE),
                         "--module-name", "probe.task", "--region", "us-central1", "--runtime-version", runtime,
                         "--job-dir", str(job_dir), "--", "--run", "master=inf", "--until", "master",
                         "--run", "worker=inf", "--hold", "worker", "--lines", str(lines), "--bye", str(bye))
    canceller, landed, copied_then, engine_then = None, False, 0, []
    try:
        if submitted.returncode == 0:
            wait_for(lambda: "probe worker 0 started" in job_records(home, job_id, "worker-replica-0"),
                     timeout=120, what="the worker to hold SIGTERM")
            if cancel:
                canceller = subprocess.Popen([*AIPTRAIN, "jobs", "cancel", job_id], stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL)
            else:
                (job_dir / "finish").touch()  # the master succeeds
            first_event(docker_api, job_id, since, worker_event("kill", "15"))  # the teardown stops it
            wait_for(lambda: standing(home, job_id)[1], timeout=120, what="the verdict")
            if phase != "stopping":
                (job_dir / "release").touch()
            if phase == "draining":  # its first last line copied: the rest is on its way
                wait_for(lambda: b'"bye 0"' in log_path.read_bytes(), timeout=120, interval=0.005,
                         what="the worker's last lines")
            elif phase == "removing":
                first_event(docker_api, job_id, since, lambda action, _: action == "destroy")
            killed = kill_controller(home)
            state_then, verdict_then = standing(home, job_id)
            landed = killed == 1 and verdict_then and state_then not in TERMINAL
            # what the killed controller had not done yet (for the note)
            copied_then = sum(m.startswith("bye ") for m in job_records(home, job_id, "worker-replica-0"))
            engine_then = job_resources(docker_api, job_id)
    finally:
        if job_dir.exists():
            (job_dir / "release").touch()
    cancelled = canceller.wait(timeout=240) if canceller else None
    state = wait_terminal(job_id, timeout=240)
    worker = [m for m in job_records(home, job_id, "worker-replica-0")
              if not m.startswith(("Running command: ", "probe worker 0 says"))]
    wanted_worker = ["probe worker 0 started", *[f"line {n}" for n in range(lines)],
                     "probe worker 0 got SIGTERM, held", *[f"bye {n}" for n in range(bye)]]
    others = {task: [m for m in job_records(home, job_id, task) if m.startswith("line ")]
              for task in ("master-replica-0", "ps-replica-0")}
    closing = [m for m in job_records(home, job_id, "service") if m in CLOSING_LINES]
    left = orphans(home, docker_api, [job_id]) + [s["Spec"]["Name"] for s in swarm_services(docker_api, job_id)]
    held = (submitted.returncode == 0 and cancelled in (None, 0) and state == expected
            and (landed or phase != "stopping") and worker == wanted_worker
            and all(printed == [f"line {n}" for n in range(lines)] for printed in others.values())
            and closing == [CLOSING_LINE[expected]])
    unexpected = [m for m in worker if m not in wanted_worker][:5]
    note = (f"{job_id}: killed while {phase} ({expected}), mid-teardown {landed} (then {copied_then} of {bye} last "
            f"lines copied, {len(engine_then)} containers and networks left), state {state}, "
            f"cancel {cancelled}, worker lines {len(worker)}/{len(wanted_worker)} (unexpected {unexpected}), "
            f"master and ps lines {[len(v) for v in others.values()]}, closing {closing}, left {left}")
    return held, left, note if held else f"{note}; submit {submitted.returncode} {submitted.stderr[-300:]!r}"


def swarm_services(docker_api, job_id: str) -> list[dict]:
    import docker.errors

    try:
        return docker_api.services(filters={"label": f"aiptrain.job-id={job_id}"})
    except docker.errors.APIError:  # not a swarm manager: the Docker backend makes no services
        return []


def test_kill_9_of_the_cli_during_submit(tally, home, docker_api, minimal_runtime, tmp_path):
    """Killed at any moment of submit, a job either never existed (and nothing of it is left)
    or is driven to an end by the next command."""
    config = probe_config(tmp_path)
    notes: list[str] = []
    for _ in range(RUNS):
        job_id = f"kill_cli_{uuid.uuid4().hex[:6]}"
        process = subprocess.Popen([*AIPTRAIN, *probe_submit(job_id, config, minimal_runtime, "master=1")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(random.uniform(0.0, 2.0))
        process.send_signal(signal.SIGKILL)
        process.wait()
        state = wait_terminal(job_id)
        left = orphans(home, docker_api, [job_id])
        if state is None:
            left += [str(p.relative_to(home)) for p in (home / "bucket").rglob(f"{job_id}/*")] \
                if (home / "bucket").exists() else []
        held = state is None or state in TERMINAL
        if not held or left:
            notes.append(f"state {state} left {left}")
        tally.record("kill -9 CLI (submit)", held, left)
    tally.assert_all_held("kill -9 CLI (submit)", notes)


# -- concurrent submits of one ID -----------------------------------------------------------------


def test_concurrent_submits_with_clashing_ids(tally, home, docker_api, minimal_runtime, tmp_path):
    config = probe_config(tmp_path)
    notes: list[str] = []
    for _ in range(RUNS):
        job_id = f"clash_{uuid.uuid4().hex[:6]}"
        args = [*AIPTRAIN, *probe_submit(job_id, config, minimal_runtime, "master=0.5")]
        processes = [subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                     for _ in range(4)]
        results = [(p.wait(timeout=180), p.stderr.read()) for p in processes]
        accepted = [r for r in results if r[0] == 0]
        refused = [r for r in results if r[0] == 2 and r[1].count("\n") == 1 and "already exists" in r[1]]
        state = wait_terminal(job_id)
        left = orphans(home, docker_api, [job_id])
        held = len(accepted) == 1 and len(refused) == 3 and state == "SUCCEEDED"
        if not held or left:
            notes.append(f"results {results} state {state} left {left}")
        tally.record("concurrent submits, one ID", held, left)
    tally.assert_all_held("concurrent submits, one ID", notes)


# -- fuzzed IDs and labels --------------------------------------------------------------------------


def test_fuzzed_job_ids_and_labels(tally, home, capsys):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from aiptrain.cli import main
    from aiptrain.errors import ValidationError
    from aiptrain.validation import (
        JOB_ID_PATTERN,
        LABEL_KEY_PATTERN,
        LABEL_VALUE_PATTERN,
        validate_job_id,
        validate_labels,
    )

    controls = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]
    failures: list[str] = []

    def one_line_without_controls(message: str) -> bool:
        return "\n" not in message and not any(c in message for c in controls)

    def check(job_id: str, labels: dict[str, str]) -> None:
        held = True
        try:
            validate_job_id(job_id)
            held &= bool(JOB_ID_PATTERN.fullmatch(job_id))
        except ValidationError as exc:
            held &= not JOB_ID_PATTERN.fullmatch(job_id) and one_line_without_controls(str(exc))
        try:
            validate_labels(labels)
            held &= all(LABEL_KEY_PATTERN.fullmatch(k) and LABEL_VALUE_PATTERN.fullmatch(v) for k, v in labels.items())
        except ValidationError as exc:
            refused_rightly = not all(
                LABEL_KEY_PATTERN.fullmatch(k) and LABEL_VALUE_PATTERN.fullmatch(v) for k, v in labels.items()
            )
            held &= refused_rightly and one_line_without_controls(str(exc))
        # The CLI echoes what it refuses on one line, escaped.
        with pytest.raises(SystemExit) as exited:
            main(["jobs", "describe", "--", job_id])
        err = capsys.readouterr().err
        held &= exited.value.code == 2 and err.count("\n") == 1 and one_line_without_controls(err[:-1])
        if not held:
            failures.append(repr((job_id, labels, err)))
        tally.record("fuzzed job IDs and labels", held, [])

    ids = st.one_of(st.text(max_size=140), st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,127}", fullmatch=True))
    labels = st.dictionaries(st.text(max_size=70), st.text(max_size=70), max_size=4)
    given(ids, labels)(settings(max_examples=40 * RUNS, deadline=None, database=None,
                                suppress_health_check=list(HealthCheck))(check))()
    assert not failures, failures[:5]


# -- malformed configs ------------------------------------------------------------------------------

MALFORMED = {
    "not yaml": b"trainingInput: [unclosed\n",
    "a list": b"- trainingInput\n",
    "a scalar": b"42\n",
    "trainingInput a string": b"trainingInput: basic\n",
    "unknown field": b"trainingInput:\n  scaleTeir: BASIC\n",
    "unknown top-level field": b"trainingInputs: {}\n",
    "unknown scale tier": b"trainingInput:\n  scaleTier: MEGA\n",
    "BASIC_TPU": b"trainingInput:\n  scaleTier: BASIC_TPU\n",
    "custom without master type": b"trainingInput:\n  scaleTier: CUSTOM\n",
    "negative workers": b"trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-4\n"
                        b"  workerType: n1-standard-4\n  workerCount: -1\n",
    "workers not a number": b"trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-4\n"
                            b"  workerType: n1-standard-4\n  workerCount: many\n",
    "unknown machine type": b"trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-giant-999\n",
    "args not a list": b"trainingInput:\n  args: --steps 10\n",
    "bad maxRunningTime": b"trainingInput:\n  scheduling:\n    maxRunningTime: two hours\n",
    "JSON syntax error": b'{"trainingInput": {"scaleTier": "BASIC"}',
    "deep nesting": b"trainingInput: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "image with runtime version": b"trainingInput:\n  masterConfig:\n    imageUri: x\n",
    "bad accelerator": b"trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-4\n"
                       b"  masterConfig:\n    acceleratorConfig:\n      count: 1\n      type: TPU_V9\n",
    "missing file": None,
}


def left_by_a_refused_submit(home: Path) -> list[str]:
    from aiptrain.store import JobStore

    left = [f"job {job.job_id}" for job in JobStore(home / "jobs.db").list()] if (home / "jobs.db").exists() else []
    for directory in ("locks", "work", "bucket", "logs"):
        if (home / directory).exists():
            left += [str(p.relative_to(home)) for p in (home / directory).rglob("*") if p.is_file()]
    return left


def test_malformed_config_corpus(tally, home, tmp_path, capsys):
    from aiptrain.cli import main

    failures = []
    for _ in range(RUNS):
        for name, content in MALFORMED.items():
            path = tmp_path / f"{name.replace(' ', '_')}.yaml"
            if content is not None:
                path.write_bytes(content)
            with pytest.raises(SystemExit) as exited:
                main(["jobs", "submit", "training", "malformed", "--config", str(path), "--package-path",
                      str(PROBE), "--module-name", "probe.task", "--region", "us-central1",
                      "--runtime-version", "minimal"])
            err = capsys.readouterr().err
            created = left_by_a_refused_submit(home)
            held = exited.value.code == 2 and err.startswith("ERROR: ") and err.count("\n") == 1
            held &= "Traceback" not in err
            if not held or created:
                failures.append(f"{name}: exit {exited.value.code} {err!r} created {created}")
            tally.record("malformed configs", held, created)
    tally.assert_all_held("malformed configs", failures)


# -- nasty trainer output ---------------------------------------------------------------------------

NASTY = r'''
import sys
out = sys.stdout.buffer
out.write(b"escape \x1b[31mred\x1b[0m \x1b]0;title\x07 bell\n")
out.write(b"invalid utf-8 \xff\xfe here\n")
out.write(b"nul \x00 byte\n")
out.write(b"progress 1\rprogress 2\rprogress 3\n")
out.write(b"x" * 1_000_000 + b"\n")
for i in range(5000):
    out.write(b"flood %d\n" % i)
out.write(b"last complete line\n")
out.flush()
sys.stderr.write("Traceback-looking noise on stderr\n")
'''


def test_nasty_trainer_output(tally, home, docker_api, minimal_runtime, tmp_path):
    package = tmp_path / "nasty" / "trainer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "task.py").write_text(NASTY)
    notes: list[str] = []
    for _ in range(RUNS):
        job_id = f"nasty_{uuid.uuid4().hex[:6]}"
        submitted = aiptrain("jobs", "submit", "training", job_id, "--package-path", str(package),
                             "--module-name", "trainer.task", "--region", "us-central1",
                             "--runtime-version", minimal_runtime, "--stream-logs")
        logs = subprocess.run([*AIPTRAIN, "jobs", "stream-logs", job_id, "--task-name", "master-replica-0"],
                              capture_output=True, timeout=120)
        text = logs.stdout
        held = submitted.returncode == 0 and logs.returncode == 0 and state_of(job_id) == "SUCCEEDED"
        held &= b"escape \x1b[31mred\x1b[0m \x1b]0;title\x07 bell" in text
        held &= "invalid utf-8 \ufffd\ufffd here".encode() in text
        held &= b"flood 4999\n" in text and b"last complete line\n" in text
        held &= sum(line.count(b"x") for line in text.splitlines() if b"x" * 100 in line) == 1_000_000
        left = orphans(home, docker_api, [job_id])
        if not held or left:
            notes.append(f"submit {submitted.returncode} {submitted.stderr[-500:]} logs {logs.returncode} left {left}")
        tally.record("nasty trainer output", held, left)
    tally.assert_all_held("nasty trainer output", notes)


# -- security -----------------------------------------------------------------------------------------


def test_security_checks(tally, home, minimal_runtime, tmp_path):
    notes: list[str] = []
    common = ["--package-path", str(PROBE), "--module-name", "probe.task", "--region", "us-central1",
              "--runtime-version", minimal_runtime]
    home.mkdir(parents=True, exist_ok=True)
    for _ in range(RUNS):
        for name, job_dir, expected in (
            ("job dir holding the Docker socket", "/var/run", "Docker socket"),
            ("job dir = /", "/", "Docker socket"),
            ("job dir inside aiptrain's home", str(home / "logs"), "aiptrain's home"),
        ):
            result = aiptrain("jobs", "submit", "training", "secure", "--job-dir", job_dir, *common)
            held = result.returncode == 2 and result.stderr.count("\n") == 1 and expected in result.stderr
            if not held:
                notes.append(f"{name}: {result.returncode} {result.stderr!r}")
            tally.record(f"security: {name}", held, [])
        plan = aiptrain("jobs", "submit", "training", "secure", "--job-dir", str(tmp_path / "out"),
                        "--config", probe_config(tmp_path, "worker", "ps", "evaluator"), "--dry-run", *common)
        containers = yaml.safe_load(plan.stdout)["containers"] if plan.returncode == 0 else []
        held = len(containers) == 4
        for container in containers:
            mounts = {m["target"]: m for m in container["mounts"]}
            held &= not container.get("privileged") and not container["user"].startswith("0")
            held &= mounts["/opt/aiptrain/packages"]["read_only"]
            # Of the home, replicas see only the storage endpoint's public CA bundle, read-only.
            trust = home / "storage-endpoint" / "trust.pem"
            held &= not any("docker.sock" in m["source"]
                            or (Path(m["source"]).is_relative_to(home) and not (Path(m["source"]) == trust
                                                                                 and m["read_only"]))
                            for m in container["mounts"] if not m["source"].startswith("<"))
        if not held:
            notes.append(f"plan: {plan.returncode} {plan.stderr[-300:]} {containers[:1]}")
        tally.record("security: replicas' mounts and user", held, [])
    for name in ("job dir holding the Docker socket", "job dir = /", "job dir inside aiptrain's home",
                 "replicas' mounts and user"):
        tally.assert_all_held(f"security: {name}", notes)


def test_a_long_line_reaches_the_log_unchanged(home, minimal_runtime, tmp_path):
    package = tmp_path / "long" / "trainer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "task.py").write_text("import sys\nsys.stdout.write('x' * 100_000 + '\\n')\n")
    job_id = f"long_{uuid.uuid4().hex[:6]}"
    aiptrain("jobs", "submit", "training", job_id, "--package-path", str(package), "--module-name", "trainer.task",
             "--region", "us-central1", "--runtime-version", minimal_runtime, "--stream-logs")
    logs = subprocess.run([*AIPTRAIN, "jobs", "stream-logs", job_id, "--task-name", "master-replica-0"],
                          capture_output=True, timeout=120)
    assert b"\t" + b"x" * 100_000 + b"\n" in logs.stdout


# -- studies: kill -9 at trial launch, hostile trainers (issue 21) ---------------------------------

HOSTILE = REPO / "tests" / "trainers" / "hostile"
ATTACKS = ["link-next-trial", "link-metric", "zero-metric", "fifo-metric", "hostile-events", "plain"]


def study_submit(tmp_path: Path, job_id: str, spec: dict, runtime: str, *user_args: str) -> list[str]:
    config = tmp_path / f"{job_id}.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": spec}}))
    return ["jobs", "submit", "training", job_id, "--config", str(config), "--package-path", str(HOSTILE),
            "--module-name", "hostile.task", "--job-dir", str(tmp_path / job_id), "--region", "us-central1",
            "--runtime-version", runtime, "--", *user_args]


def trials_of(job_id: str) -> list[dict]:
    result = aiptrain("jobs", "describe", job_id)
    return (yaml.safe_load(result.stdout).get("trainingOutput") or {}).get("trials") or [] if result.returncode == 0 else []


def kill_at_each_launch(docker_api, home: Path, job_id: str, kills: int, stop: threading.Event,
                        killed: list[int]) -> None:
    """SIGKILL the home's controller the moment the engine creates a trial's replica (between its
    create and its start, or just after), up to `kills` times; each time the test's next
    command starts a controller that takes the study over."""
    filters = {"label": f"aiptrain.job-id={job_id}", "type": "container", "event": "create"}
    while not stop.is_set() and len(killed) < kills:
        since = time.time()
        for _ in docker_api.events(since=since, until=since + 2, filters=filters, decode=True):
            for pid in controller_pids(home):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            if len(killed) >= kills:
                return


def test_kill_9_of_the_controller_at_each_trial_launch(tally, home, docker_api, minimal_runtime, tmp_path,
                                                       monkeypatch):
    """A random-search study whose controller is killed as each trial's replica is created,
    taken over by the next command every time: the study ends SUCCEEDED, every trial ran once,
    and no point was measured twice."""
    monkeypatch.setenv("AIPTRAIN_POLL_SECONDS", "0.2")
    spec = {"algorithm": "RANDOM_SEARCH", "maxTrials": 6, "maxParallelTrials": 2,
            "params": [{"parameterName": "x", "type": "DOUBLE", "minValue": 0, "maxValue": 1}]}
    notes: list[str] = []
    for _ in range(RUNS):
        job_id = f"study_kill_{uuid.uuid4().hex[:6]}"
        stop, killed = threading.Event(), []
        killer = threading.Thread(target=kill_at_each_launch, args=(docker_api, home, job_id, 4, stop, killed), daemon=True)
        killer.start()
        submitted = aiptrain(*study_submit(tmp_path, job_id, spec, minimal_runtime, "--sleep", "0.5"))
        deadline, state = time.monotonic() + 300, None
        while time.monotonic() < deadline:
            state = state_of(job_id)  # describe takes an orphaned study over
            if state in TERMINAL:
                break
            time.sleep(0.3)
        stop.set()
        killer.join(10)
        trials = trials_of(job_id)
        runs_log = tmp_path / job_id / "runs.log"
        runs = sorted(runs_log.read_text().split()) if runs_log.exists() else []
        points = {t["hyperparameters"]["x"] for t in trials}
        left = orphans(home, docker_api, [job_id])
        held = (submitted.returncode == 0 and state == "SUCCEEDED" and len(trials) == 6 and len(points) == 6
                and runs == sorted(str(n) for n in range(1, 7)))
        if not held or left:
            notes.append(f"{job_id}: state {state} kills {len(killed)} trials "
                         f"{[(t['trialId'], t['state'], t['hyperparameters']['x']) for t in trials]} runs {runs} "
                         f"left {left}")
        print(f"{job_id}: {len(killed)} takeover(s), state {state}, {len(points)} distinct points, runs {runs}")
        tally.record("kill -9 controller at trial launch", held, left)
    tally.assert_all_held("kill -9 controller at trial launch", notes)


def test_hostile_trainers_links_and_fifos(tally, home, docker_api, minimal_runtime, tmp_path, monkeypatch):
    """Trials plant links (to a root-only host directory and file, to /dev/zero, to /) and FIFOs
    in the job dir and as the metric file; every other run is cancelled at a random moment. The
    study ends (cancel answers), the host directory is untouched, no root-only byte becomes a
    metric, nothing is left."""
    monkeypatch.setenv("AIPTRAIN_POLL_SECONDS", "0.2")
    secret = tmp_path / "private"
    secret.mkdir(mode=0o700)
    (secret / "secret").write_text("12345\n")
    before = (secret.stat().st_uid, secret.stat().st_gid, secret.stat().st_mode)
    spec = {"algorithm": "GRID_SEARCH", "maxTrials": 6, "maxParallelTrials": 2, "maxFailedTrials": 6,
            "enableTrialEarlyStopping": True,
            "params": [{"parameterName": "attack", "type": "CATEGORICAL", "categoricalValues": ATTACKS}]}
    notes: list[str] = []
    for run in range(RUNS):
        job_id = f"hostile_{uuid.uuid4().hex[:6]}"
        submitted = aiptrain(*study_submit(tmp_path, job_id, spec, minimal_runtime, "--secret", str(secret),
                                           "--sleep", "1"))
        cancelled = None
        if run % 2:
            time.sleep(random.uniform(0.5, 4.0))
            cancelled = aiptrain("jobs", "cancel", job_id, timeout=120).returncode
        state = wait_terminal(job_id, timeout=300)
        trials = trials_of(job_id)
        metrics = [(t.get("finalMetric") or {}).get("objectiveValue") for t in trials]
        intact = (secret.stat().st_uid, secret.stat().st_gid, secret.stat().st_mode) == before and sorted(
            p.name for p in secret.iterdir()) == ["secret"]
        left = orphans(home, docker_api, [job_id])
        held = (submitted.returncode == 0 and state in TERMINAL and intact and 12345.0 not in metrics
                and (cancelled is None or (cancelled == 0 and state in ("CANCELLED", "SUCCEEDED", "FAILED"))))
        if not held or left:
            notes.append(f"{job_id}: state {state} cancel {cancelled} intact {intact} metrics {metrics} left {left}")
        tally.record("hostile trainer: links and FIFOs", held, left)
    tally.assert_all_held("hostile trainer: links and FIFOs", notes)
