"""The home's controller: one long-lived process drives every job of an aiptrain home.

Each wake (a command's byte on the FIFO, an engine event, a step that finished, a due time):
run the chores that are due (aiptrain.runner.events: adopt the active jobs nobody drives yet, the
cache's pruning and the engine's sweep), hand every due job's `JobDriver.step()` to a small
pool of threads (a step may wait on the engine: a launch, a `docker stop`), one step in flight
per job. A step's failure stays with its job (it fails that job, as the service would, and is
logged with its traceback); the loop never stops for it. The state of every job is in the store
(states, verdicts, restarts, trials) and in the engine, so a controller killed at any moment is
followed by one whose first steps pick up where each job stood.

It owns what the jobs of the home share: one engine event stream per backend, admission (the
drivers ask aiptrain.admission in turn), the cache's pruning, and the storage endpoint, released
when the controller goes with no job active. Then come the chores that look at what is in hand:
start the command server once the first job is out of hand, and exit after
`controller_idle_seconds` with nothing active (started detached), or run until stopped
(`aiptrain controller run`). Each chore is a periodic event on the controller's clock
(`time.monotonic`, a fake one in tests), and keeps its failures to itself.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from aiptrain import cache
from aiptrain.backends import Backend, Installation, open_backend
from aiptrain.jobtable import DamagedRecord
from aiptrain.lifecycle import SETTLE_LOOKS
from aiptrain.model import rfc3339, utc_now
from aiptrain.ownership import JobLock
from aiptrain.runner import control
from aiptrain.runner.driver import JobDriver, Phase
from aiptrain.runner.events import PeriodicEvent, run_all, seconds_to_next
from aiptrain.settings import Settings
from aiptrain.store import JobStore

log = logging.getLogger("aiptrain.controller")

STEP_WORKERS = 16  # steps in flight at once; most wait on the engine, not on a core
ADOPT_EVERY_SECONDS = 1.0  # looks for active jobs nobody drives, besides every wake by a command
PRUNE_EVERY_SECONDS = 3600.0
FULL_DISK_RETRY_SECONDS = 5.0
RETAKE_TRIES = 50  # 10 ms apart: taking the home's lock back after letting go of it
# Nothing in hand this long, before this controller's first job: the command server starts.
COMMAND_SERVER_QUIET_SECONDS = 1.0


class PerThreadStore:
    """The job store, one SQLite connection per thread: a connection's transaction is the
    connection's, so two threads sharing one would write inside each other's."""

    def __init__(self, settings: Settings):
        self._settings = settings
        self._local = threading.local()

    def __getattr__(self, name: str) -> Any:
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = JobStore.of(self._settings)
        return getattr(store, name)


class Controller:
    def __init__(self, settings: Settings, lock: JobLock, idle_exit: bool = True, serves_commands: bool = False,
                 clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.clock = clock  # monotonic seconds: every due time of the loop and its chores
        self.home_lock = lock  # the home's controller lock, held while this process drives its jobs
        # A JobStore to its callers: every attribute is that of this thread's own store.
        self.store = cast(JobStore, PerThreadStore(settings))
        self.drivers: dict[str, JobDriver] = {}
        self.due: dict[str, float] = {}  # job -> monotonic time of its next step
        self.quick_looks: dict[str, int] = {}  # job -> looks of SETTLE_LOOKS left after an engine event
        self.in_flight: dict[str, Future] = {}
        self.skipped: set[str] = set()  # jobs whose record cannot be read: left as they are
        self.home_gone = False  # the home was deleted: what its jobs shared goes with the controller
        self.backends: dict[str, Backend] = {}
        # What each backend's jobs share on its engine, and its sweep: the controller's to keep.
        self.installations: dict[str, Installation] = {}
        self.submits_waiting = False  # a submit still stages a job (adoption leaves it alone)
        self.quiet_since = clock()  # no job in hand since then (the idle exit)
        self.last_busy = clock()  # a step in flight or a submit staging, last seen (the command server)
        self.had_work = False  # a job was in hand since this controller started
        self.wake = threading.Event()
        self.news = threading.Event()  # a command wrote to the FIFO: look for new jobs now
        self.stopping = threading.Event()
        self.watchers_stop = threading.Event()
        self.lock = threading.Lock()  # guards due / quick_looks against the watcher threads
        self.pool = ThreadPoolExecutor(max_workers=STEP_WORKERS, thread_name_prefix="step")
        # The chores, as skylet's events: those that feed the steps run before them...
        self.adoption = PeriodicEvent("adoption", ADOPT_EVERY_SECONDS, self.adopt_due, asked=self.news.is_set)
        self.pruning = PeriodicEvent("pruning and sweep", PRUNE_EVERY_SECONDS, self.prune_cache)
        self.before_steps = [self.adoption, self.pruning]
        # ... and those that look at what is in hand after them. A controller run inside another
        # program (a test) leaves commands to their own processes; `controller run` never exits idle.
        self.command_server = PeriodicEvent("command server", 0, self.start_command_server)
        self.idle = PeriodicEvent("idle exit", 0, self.exit_if_idle)
        self.after_steps = [event for event, wanted in ((self.command_server, serves_commands),
                                                        (self.idle, idle_exit)) if wanted]

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        while not self.stopping.is_set():
            now = self.clock()
            if not self.settings.home.exists():  # the home was deleted under us: nothing to drive
                log.warning("The home %s is gone: stopping.", self.settings.home)
                self.home_gone = True
                break
            run_all(self.before_steps, now)
            self.dispatch(now)
            run_all(self.after_steps, now)
            if self.stopping.is_set():
                break
            self.wake.wait(self.seconds_to_next(now))
            self.wake.clear()
        self.shut_down()

    def adopt_due(self, now: float) -> None:
        """The adoption chore: at every command's wake, and every ADOPT_EVERY_SECONDS."""
        self.news.clear()
        self.submits_waiting = self.adopt()
        if self.drivers or self.submits_waiting:
            self.quiet_since = now

    def adopt(self) -> bool:
        """Drive every active job nobody drives yet. A job whose submit still holds its lock is
        left to it (the submit wakes us when done); True while there is such a job."""
        waiting = False
        active = self.drivable_job_ids()
        for job_id in active:
            if job_id in self.drivers:
                continue
            lock = JobLock.try_acquire(self.settings.job_paths(job_id).lock)
            if lock is None:  # its submit starts the storage endpoint meanwhile (Submitter._get_ready)
                waiting = True
                continue
            lock.remove()  # the job is the controller's now, and the controller's lock is the home's
            try:
                backend = self.backend(self.store.backend_of(job_id))
                self.drivers[job_id] = JobDriver(job_id, self.settings, self.store, backend)
            except DamagedRecord as exc:
                self.store.skip_damaged(job_id, exc.problem)
                self.skipped.add(job_id)
                continue
            except Exception as exc:  # noqa: BLE001 - e.g. a full disk: this job waits for the next look
                log.warning("Could not take job %s on yet: %s", job_id, exc)
                waiting = True
                continue
            self.due[job_id] = 0.0
            log.info("Driving job %s", job_id)
        return waiting

    def dispatch(self, now: float) -> None:
        for job_id, driver in list(self.drivers.items()):
            if job_id in self.in_flight or self.due.get(job_id, 0.0) > now:
                continue
            future = self.pool.submit(self.step, driver)
            self.in_flight[job_id] = future
            future.add_done_callback(functools.partial(self.stepped, job_id))

    def step(self, driver: JobDriver) -> float | None:
        """One step of one job, in a pool thread; its failure stays with that job."""
        try:
            return driver.step()
        except DamagedRecord as exc:
            self.store.skip_damaged(driver.job_id, exc.problem)
            self.skipped.add(driver.job_id)
            return None
        except Exception as exc:  # noqa: BLE001 - any failure of one job's step
            full = self.settings.out_of_space()
            log.error("Job %s: a step failed%s\n%s", driver.job_id, " (the disk is full)" if full else "",
                      traceback.format_exc())
            if full:  # nothing can be recorded now: try again once there is room
                return FULL_DISK_RETRY_SECONDS
            driver.fail(traceback.format_exception_only(exc)[-1].strip())
            return None

    def stepped(self, job_id: str, future: Future) -> None:
        """A step finished (in its pool thread): schedule the next or let the job go."""
        self.in_flight.pop(job_id, None)
        if future.cancelled():  # dropped at shut-down
            return
        delay = future.result()
        driver = self.drivers.get(job_id)
        if delay is None or driver is None or driver.ended:
            self.drivers.pop(job_id, None)
            self.due.pop(job_id, None)
            if driver is not None:
                driver.close()
                log.info("Job %s ended: %s", job_id, driver.final_state.value if driver.final_state else "left")
            self.wake_queue_head()  # its replicas' room may let the next job start
        elif driver.phase is Phase.LAUNCH:
            self.due[job_id] = 0.0
            self.wake_queue_head()  # admitted: the next in line is the head now
        else:
            with self.lock:
                looks = self.quick_looks.get(job_id, 0)
                if looks:
                    self.quick_looks[job_id] = looks - 1
                    delay = min(delay, SETTLE_LOOKS[-looks])
                self.due[job_id] = self.clock() + delay
        self.wake.set()

    def wake_queue_head(self) -> None:
        """Look at the job first in line to start now: only it may (aiptrain.admission)."""
        try:
            queue, _ = self.store.admission_queue()
        except Exception as exc:  # noqa: BLE001 - its own look comes anyway
            log.warning("Could not read the admission queue: %s", exc)
            return
        if queue:
            with self.lock:
                if queue[0].job_id in self.drivers:
                    self.due[queue[0].job_id] = 0.0

    def look_now(self, job_id: str) -> None:
        """A command's news about the job (recorded, cancelled): step it at once."""
        with self.lock:
            if job_id in self.drivers:
                self.due[job_id] = 0.0
        self.wake.set()

    def changed(self, job_id: str) -> None:
        """An engine event about one of the job's replicas (from a watcher thread): look now, and
        a few times soon after (the engine lists a replica as running briefly after its `die`)."""
        with self.lock:
            if job_id in self.drivers:
                self.due[job_id] = 0.0
                self.quick_looks[job_id] = len(SETTLE_LOOKS)
        self.wake.set()

    def seconds_to_next(self, now: float) -> float:
        """Until the next due step or chore (adoption's interval at most: a second)."""
        waiting = [due - now for job_id, due in self.due.items() if job_id not in self.in_flight]
        chores = seconds_to_next(self.before_steps + self.after_steps, now)
        return max(0.0, min([ADOPT_EVERY_SECONDS, chores, *waiting]))

    def start_command_server(self, now: float) -> None:
        """The home's command server (aiptrain.commandserver), once, when nothing is in hand: as
        soon as the first job's step is done (the describe, cancel or resubmit that follows a
        submit then finds it), or after a second with nothing in hand for a controller started
        early by a submit, whose job shows up a moment after the controller does: its imports
        never compete with that submit and launch for the cores. It goes when the controller goes;
        one that fails to start is not tried again: commands then run in their own processes."""
        if self.submits_waiting or self.in_flight:
            self.last_busy = now
            self.had_work = True
            return
        if not self.had_work and now - self.last_busy < COMMAND_SERVER_QUIET_SECONDS:
            return
        self.command_server.retire()
        start_command_server(self.settings.home)

    def exit_if_idle(self, now: float) -> None:
        """The idle exit: nothing active for `controller_idle_seconds`, let go of the home (and stop)."""
        if self.drivers or self.in_flight:
            self.quiet_since = now
        elif now - self.quiet_since >= self.settings.controller_idle_seconds:
            if self.still_idle_after_letting_go():
                self.stopping.set()
            else:
                self.quiet_since = self.clock()

    # -- what jobs share ------------------------------------------------------------------------

    def backend(self, name: str) -> Backend:
        """The named backend, opened once, with its engine event watcher; its installation kept."""
        if name not in self.backends:
            backend = open_backend(self.settings, name)
            # Connected here, in the main thread, before any other thread imports the engine's SDK:
            # docker-py imported by two threads at once can leave it half-initialized for good.
            backend.installation.warm_up(launches=True)
            self.backends[name] = backend
            self.installations[name] = backend.installation
            threading.Thread(target=backend.watch, args=(self.watchers_stop, self.changed), daemon=True,
                             name=f"watch-{name}").start()
        return self.backends[name]

    def release_shared(self) -> None:
        """Take down what the home's jobs share (the storage endpoint) unless a job is active: when
        the controller goes, not when each job ends, so jobs run one after another do not start it
        each time. Each backend asks the store under the lock its launches start it with."""
        for installation in self.installations.values():
            try:
                installation.release_shared(lambda: bool(self.drivable_job_ids()))
            except Exception as exc:  # noqa: BLE001 - logged; the next controller's exit tries again
                log.warning("Could not release what the home's jobs share: %s", exc)

    def remove_installation(self) -> None:
        """A deleted home's storage endpoint and lone replicas' network would stay on the engine
        for good (the network's subnet with them): nothing else knows they were its."""
        for installation in self.installations.values():
            try:
                installation.remove_installation()
            except Exception as exc:  # noqa: BLE001 - logged; nothing else will try
                log.warning("Could not remove what the deleted home's jobs shared: %s", exc)

    def prune_cache(self, now: float) -> None:
        """The cache's pruning, and what deleted homes and this home's ended jobs left on the
        engine: at the controller's start and hourly, in the pool."""
        self.pool.submit(self.prune_cache_files)
        for installation in list(self.installations.values()):
            self.pool.submit(self.remove_abandoned, installation)

    def prune_cache_files(self) -> None:
        try:
            cache.prune_if_due(self.settings)
        except Exception as exc:  # noqa: BLE001 - in the pool, where nobody reads its future: the next prune tries again
            log.warning("Could not prune the cache: %s", exc)

    def remove_abandoned(self, installation: Installation) -> None:
        try:
            installation.remove_abandoned(self.store.active_job_ids)
        except Exception as exc:  # noqa: BLE001 - the next sweep tries again
            log.warning("Could not remove what deleted homes or ended jobs left on the engine: %s", exc)

    # -- the end --------------------------------------------------------------------------------

    def drivable_job_ids(self) -> list[str]:
        """The active jobs, but those whose record cannot be read (left as they are, said once)."""
        return [job_id for job_id in self.store.active_job_ids() if job_id not in self.skipped]

    def still_idle_after_letting_go(self) -> bool:
        """Let go of the home's lock, then look once more: a job recorded before that look is
        ours to drive (take the lock back, unless a new controller has it); one recorded after
        it is woken for by its command, which then finds the lock free and starts a controller."""
        self.home_lock.release()
        try:
            if not self.drivable_job_ids():
                return True
        except Exception as exc:  # noqa: BLE001 - the home is no longer ours: never drive on without its lock
            log.warning("Could not look for jobs after letting go of the home (stopping): %s", exc)
            return True
        lock = None
        for _ in range(RETAKE_TRIES):  # a command looking whether a controller runs holds it for an instant
            lock = JobLock.try_acquire(self.settings.controller_lock_path)
            if lock is not None:
                break
            time.sleep(0.01)
        if lock is None:
            return True  # a new controller took over
        self.home_lock = lock
        write_state(self.settings)
        return False

    def shut_down(self) -> None:
        self.watchers_stop.set()
        # The steps in hand finish; those not started yet are dropped: the next controller takes them.
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.home_gone:
            self.remove_installation()
        else:
            self.release_shared()  # gone with nothing active: nothing needs the endpoint
        for driver in self.drivers.values():
            driver.close()
        self.home_lock.release()


def start_command_server(home: Path) -> None:
    """Start the home's command server beside this controller, writing to its log. The runner
    names the server's module and never imports it: the server serves the CLI, which the runner
    must not import (.importlinter); the server itself says no when its environment turns it off."""
    subprocess.Popen([sys.executable, "-m", "aiptrain.commandserver", str(home), str(os.getpid())],
                     stdin=subprocess.DEVNULL, cwd="/")  # as the controller: no modules from a working directory


def write_state(settings: Settings) -> None:
    state = {"pid": os.getpid(), "version": control.code_version(), "started": rfc3339(utc_now())}
    temporary = settings.controller_state_path.with_suffix(".tmp")
    temporary.write_text(json.dumps(state))
    temporary.replace(settings.controller_state_path)


def read_fifo(settings: Settings, controller: Controller) -> None:
    """Wakes (and stop requests) from commands. Opened read-write, so it never sees end-of-file
    when the last writer closes."""
    control.make_fifo(settings.controller_wake_path)
    fd = os.open(settings.controller_wake_path, os.O_RDWR | os.O_NONBLOCK)
    while not controller.stopping.is_set():
        readable, _, _ = select.select([fd], [], [], 1.0)
        if not readable:
            continue
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            continue
        for line in data.splitlines():
            word, _, job_id = line.partition(b" ")
            if word == control.QUIT:
                controller.stopping.set()
            elif job_id:
                controller.look_now(job_id.decode(errors="replace"))
        controller.news.set()
        controller.wake.set()


def raise_open_files_limit() -> None:
    """Every running job keeps its log open and a stream per replica: allow as many as the
    system lets this process have."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 16, hard))


def serve(settings: Settings, lock: JobLock, idle_exit: bool) -> None:
    """Drive the home's jobs while holding its controller `lock`."""
    write_state(settings)
    raise_open_files_limit()
    controller = Controller(settings, lock, idle_exit, serves_commands=True)
    def stop(*_: object) -> None:
        controller.stopping.set()
        controller.wake.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    threading.Thread(target=read_fifo, args=(settings, controller), daemon=True, name="fifo").start()
    log.info("Controller %s started for %s (version %s)", os.getpid(), settings.home, control.code_version())
    # The engine's SDK imported and connected now, while the submit that started us (most often)
    # still stages its job: it would cost a tenth of a second of that job's start-up later.
    try:
        controller.backend(settings.backend)
    except Exception as exc:  # noqa: BLE001 - the jobs that need it meet it again, and say it
        log.warning("Could not open the %s backend: %s", settings.backend, exc)
    try:
        controller.run()
    finally:
        log.info("Controller %s stopped", os.getpid())


def main(argv: list[str]) -> int:
    """Started detached by aiptrain.runner.control, holding the lock it was handed."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = Settings()
    serve(settings, JobLock(int(argv[0]), settings.controller_lock_path), idle_exit=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
