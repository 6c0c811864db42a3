"""Edges of the engine side, pure parts: hostnames for long IDs, names scoped by installation,
replica-count limits, plans that grow linearly, subnets from the pool, log lines rebuilt from
the engine's messages."""

import ipaddress
import json
import struct

import pytest
from docker.errors import APIError

from aiptrain.backends.docker import engine_error, pick_subnet, subnet_pool, subnet_prefix
from aiptrain.backends.engine_logs import ENGINE_PART_BYTES, _LineAssembler, _LogReader, frame_blocks, unchunk
from aiptrain.errors import ValidationError
from aiptrain.model import Job, ScaleTier, TrainingInput
from aiptrain.planning import HOSTNAME_MAX, PlanInputs, Trial, plan
from aiptrain.topology import MAX_REPLICAS, replicas_for

from conftest import drive_to_end
from fakes import FakeBackend

LONG_ID = "j" + "x_Y9" * 31 + "abc"  # 128 characters, the longest ID the service allows
INPUTS = PlanInputs(runtime_image="aiptrain/runtime:2.11", user="1000:1000")


def custom_job(job_id: str = "my_job", workers: int = 2, ps: int = 1) -> Job:
    training_input = TrainingInput(
        scale_tier=ScaleTier.CUSTOM, master_type="n1-standard-4", worker_type="n1-standard-4",
        worker_count=workers, parameter_server_type="n1-standard-4", parameter_server_count=ps,
        python_module="trainer.task", region="us-central1", runtime_version="2.11",
    )
    return Job(job_id=job_id, training_input=training_input)


def plan_of(job: Job, inputs: PlanInputs = INPUTS, trial: Trial | None = None):
    return plan(job, replicas_for(job.training_input), inputs, trial)


# -- item 1: long job IDs ----------------------------------------------------------------------


def test_a_128_character_id_gets_short_stable_distinct_hostnames_used_everywhere():
    assert len(LONG_ID) == 128
    launch = plan_of(custom_job(LONG_ID, workers=12))
    hostnames = [c.hostname for c in launch.containers]
    assert all(len(h) <= HOSTNAME_MAX for h in hostnames)
    assert len(set(hostnames)) == len(hostnames)
    assert hostnames[0].startswith("jx-y9x-y9") and hostnames[0].endswith("-master-0")
    assert hostnames == [c.hostname for c in plan_of(custom_job(LONG_ID, workers=12)).containers]  # stable
    tf_config = json.loads(launch.environment(launch.containers[3])["TF_CONFIG"])
    assert tf_config["cluster"]["worker"][0] == f"{hostnames[1]}:2222"
    # Two long IDs that differ only at the end do not share hostnames.
    other = plan_of(custom_job(LONG_ID[:-1] + "Z", workers=12))
    assert not set(hostnames) & {c.hostname for c in other.containers}


def test_short_ids_keep_their_readable_hostnames_and_trials_are_shortened_too():
    assert plan_of(custom_job("my_job")).containers[1].hostname == "my-job-worker-0"
    trial_plan = plan_of(custom_job(LONG_ID), trial=Trial("17", {}))
    assert all(len(c.hostname) <= HOSTNAME_MAX for c in trial_plan.containers)
    assert {c.hostname for c in trial_plan.containers}.isdisjoint(c.hostname for c in plan_of(custom_job(LONG_ID)).containers)
    assert trial_plan.containers[0].name.startswith(f"{LONG_ID}-trial-17-master-0")


# -- item 4: engine-side names scoped by installation -----------------------------------------------


def test_container_and_network_names_carry_the_installation_after_the_readable_part():
    homes = [plan_of(custom_job("x"), PlanInputs(runtime_image="i", installation=i)) for i in ("aaaa1111bbbb", "cccc2222dddd")]
    assert homes[0].network.name == "aiptrain-x-aaaa1111"
    assert [c.name for c in homes[0].containers] == ["x-master-0-aaaa1111", "x-worker-0-aaaa1111",
                                                      "x-worker-1-aaaa1111", "x-ps-0-aaaa1111"]
    assert homes[1].containers[0].name == "x-master-0-cccc2222"
    assert homes[0].containers[0].hostname == homes[1].containers[0].hostname == "x-master-0"


# -- item 5: replica counts ---------------------------------------------------------------------


@pytest.mark.parametrize("count", [MAX_REPLICAS + 1, 100000, int(1e30)])
def test_worker_counts_beyond_the_limit_are_refused_before_anything_is_sized(count):
    with pytest.raises(ValidationError, match=f"at most {MAX_REPLICAS} replicas per job"):
        replicas_for(custom_job(workers=count).training_input)


def test_the_total_of_all_groups_is_limited_too():
    with pytest.raises(ValidationError, match="The job has 1001 replicas"):
        replicas_for(custom_job(workers=500, ps=500).training_input)
    assert len(replicas_for(custom_job(workers=499, ps=500).training_input)) == MAX_REPLICAS


def test_a_plan_grows_linearly_with_its_replicas():
    """Every replica's TF_CONFIG names every replica; the plan holds that cluster once."""
    def size(workers: int) -> int:  # the plan launch works from; --dry-run prints every replica's whole env
        import dataclasses

        return len(json.dumps(dataclasses.asdict(plan_of(custom_job(workers=workers, ps=0)))))

    assert size(500) < 2.2 * size(250)
    launch = plan_of(custom_job(workers=500, ps=0))
    last = json.loads(launch.environment(launch.containers[-1])["TF_CONFIG"])  # whole, at launch
    assert len(last["cluster"]["worker"]) == 500 and last["task"] == {"type": "worker", "index": 499}


# -- item 11: PIDs limit ------------------------------------------------------------------------


def test_replicas_get_the_pids_limit_of_the_inputs_and_zero_means_none():
    assert {c.pids_limit for c in plan_of(custom_job(), PlanInputs(runtime_image="i", pids_limit=4096)).containers} == {4096}
    assert plan_of(custom_job(), PlanInputs(runtime_image="i", pids_limit=0)).containers[0].pids_limit is None


def test_settings_default_and_override_the_pids_limit(monkeypatch, tmp_path):
    from aiptrain.settings import DEFAULT_REPLICA_PIDS_LIMIT, Settings

    monkeypatch.delenv("AIPTRAIN_REPLICA_PIDS_LIMIT", raising=False)
    assert Settings(home=tmp_path).replica_pids_limit == DEFAULT_REPLICA_PIDS_LIMIT
    monkeypatch.setenv("AIPTRAIN_REPLICA_PIDS_LIMIT", "100")
    assert Settings(home=tmp_path).replica_pids_limit == 100


# -- item 2: subnets ----------------------------------------------------------------------------


@pytest.mark.parametrize("replicas, prefix", [(1, 29), (5, 29), (6, 28), (31, 26), (61, 26), (62, 25), (1000, 22)])
def test_a_subnet_holds_the_replicas_gateway_network_and_broadcast(replicas, prefix):
    assert subnet_prefix(replicas) == prefix
    assert ipaddress.ip_network(f"10.0.0.0/{prefix}").num_addresses >= replicas + 3


def test_subnets_come_from_the_pool_and_avoid_those_taken():
    pool = ipaddress.IPv4Network("198.18.0.0/27")  # four /29s
    taken: list = [ipaddress.ip_network("198.18.0.0/29"), ipaddress.ip_network("10.0.0.0/8")]
    picked = []
    for name in ("a", "b", "c"):
        subnet = pick_subnet(pool, 1, taken, name)
        assert subnet.subnet_of(pool) and subnet.prefixlen == 29
        picked.append(subnet)
        taken.append(subnet)
    assert len(set(picked)) == 3 and ipaddress.ip_network("198.18.0.0/29") not in picked
    assert pick_subnet(pool, 1, taken, "d") is None  # full
    assert pick_subnet(pool, 31, [], "big") is None  # a /26 does not fit a /27 pool


def test_the_default_pool_holds_well_over_500_small_jobs_and_a_bad_pool_is_a_usage_error():
    from aiptrain.settings import DEFAULT_SUBNET_POOL

    assert subnet_pool(DEFAULT_SUBNET_POOL).num_addresses // 8 > 500
    with pytest.raises(ValidationError, match="AIPTRAIN_SUBNET_POOL"):
        subnet_pool("not-a-network")


def test_engine_errors_are_one_line_without_the_request_url():
    error = APIError("404 Client Error for http+docker://localhost/v1.41/networks/create: Not Found",
                     explanation="could not find an available, non-overlapping IPv4 address pool\nmore")
    assert engine_error(error) == "could not find an available, non-overlapping IPv4 address pool"


# -- item 3: log lines --------------------------------------------------------------------------


def feed_all(frames: list[bytes]) -> list[tuple[str, bytes]]:
    assembler = _LineAssembler()
    lines = [line for frame in frames for line in assembler.feed(frame)]
    return lines + list(assembler.flush())


@pytest.mark.parametrize(
    "frames, lines",
    [
        ([b"T1 one\n", b"T2 two\n"], [("T1", b"one"), ("T2", b"two")]),
        ([b"T1 one\n", b"T2 last without newline"], [("T1", b"one"), ("T2", b"last without newline")]),
        # Lines over 16 KB come as partial messages, each stamped: one line, the first stamp.
        ([b"T1 aaa", b"T2 bbb", b"T3 ccc\n", b"T4 next\n"], [("T1", b"aaabbbccc"), ("T4", b"next")]),
        ([b"T1 aaa", b"T2 bbb"], [("T1", b"aaabbb")]),
        ([b"T1 \xc3", b"T2 \xa9\n"], [("T1", "\u00e9".encode())]),  # a character cut in two
        ([b"T1 \n"], [("T1", b"")]),
        ([b"T1 a\nb\n"], [("T1", b"a"), ("T1", b"b")]),
    ],
)
def test_lines_are_rebuilt_from_the_engines_messages(frames, lines):
    assert feed_all(frames) == lines


def test_a_read_again_finds_the_last_part_the_follow_ended_before():
    """The engine may write a stopped replica's last part after its follow ended, stamped
    before the part it follows: the plain read starts where the follow did and skips by count."""
    part = b"a" * ENGINE_PART_BYTES
    messages = [(1, b"2026-01-01T00:00:01.000000000Z before\n"), (2, b"2026-01-01T00:00:02.000000000Z " + part),
                (2, b"2026-01-01T00:00:01.500000000Z tail")]
    reads = [messages[:2], messages]
    reader = _LogReader(lambda since, follow: iter([reads.pop(0)]), None)
    first = lines_read(reader, follow=True)
    assert [c.text for c in first] == ["before"] and reader.awaits_more()
    assert lines_read(reader, follow=False) == [] and not reader.awaits_more()
    (line,) = reader.flush()
    assert (line.stream, line.time, line.text) == ("stderr", "2026-01-01T00:00:02.000000000Z", "a" * ENGINE_PART_BYTES + "tail")


def test_a_resumed_read_skips_what_was_copied_before():
    messages = [(1, b"2026-01-01T00:00:01.000000000Z old\n"), (1, b"2026-01-01T00:00:02.000000000Z new\n")]
    from aiptrain.logs import parse_engine_time

    reader = _LogReader(lambda since, follow: iter([messages[:1], messages[1:]]),
                        parse_engine_time("2026-01-01T00:00:01Z"))
    assert [c.text for c in lines_read(reader, follow=True)] == ["new"] and not reader.awaits_more()


FRAMES = [(1, b"2026-01-01T00:00:01.000000000Z one\n"), (2, b"2026-01-01T00:00:02Z " + "é\r\n".encode() * 3),
          (1, b"2026-01-01T00:00:03Z " + b"x" * 300), (1, b"2026-01-01T00:00:04Z last\n")]


def engine_body(frames) -> bytes:
    """What the engine sends: each frame (header, payload) as an HTTP chunk of its own, then the last chunk."""
    chunks = [struct.pack(">BxxxL", stream, len(data)) + data for stream, data in frames]
    return b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\n\r\n"


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 8, 9, 13, 64, 1000, 1 << 20])
def test_frames_come_whole_however_the_socket_cuts_the_body(piece):
    body = engine_body(FRAMES) + b"the next response on the connection: never read"
    sent = [body[i:i + piece] for i in range(0, len(body), piece)]
    received = frame_blocks(unchunk(lambda: sent.pop(0) if sent else b""))
    assert [frame for block in received for frame in block] == FRAMES
    assert sent == [] or b"never read" in b"".join(sent)


def test_a_body_cut_off_ends_the_frames():
    body = engine_body(FRAMES)
    sent = [body[:-40]]
    received = [frame for block in frame_blocks(unchunk(lambda: sent.pop(0) if sent else b"")) for frame in block]
    assert received == FRAMES[:3]


def lines_read(reader, follow: bool) -> list:
    """The reader's batches of lines, one after another."""
    return [chunk for batch in reader.read(follow) for chunk in batch]


# -- item 13: one closing line, also across controllers -----------------------------------------


@pytest.mark.parametrize(
    "closing, state, error",
    [
        (["Job completed successfully."], "SUCCEEDED", None),
        ([("The replica worker 1 exited with a non-zero status of 1.", "ERROR"),
          "Finished tearing down training program.", "Job failed."], "FAILED",
         "The replica worker 1 exited with a non-zero status of 1."),
    ],
)
def test_a_successor_keeps_the_word_of_a_controller_killed_after_its_closing_line(tmp_path, closing, state, error):
    """Killed (kill -9) between its closing line and recording the state, a controller leaves the
    job RUNNING with its replicas removed and its decision in the store (kept before teardown);
    the next one records that decision, and says nothing again."""
    from aiptrain.logs import JobLogWriter, read_records
    from aiptrain.model import State
    from aiptrain.runner.driver import JobDriver
    from aiptrain.settings import Settings
    from aiptrain.store import JobStore

    settings = Settings(home=tmp_path)
    settings.ensure_dirs()
    store = JobStore(settings.store_path)
    store.create(custom_job("ended"))
    store.transition("ended", State.PREPARING, [State.QUEUED])
    store.transition("ended", State.RUNNING, [State.PREPARING])
    with JobLogWriter(settings.job_log_path("ended")) as log:
        log.service("Waiting for training program to start.")
        for line in closing:
            log.service(*(line if isinstance(line, tuple) else (line,)))
    store.record_verdict("ended", {"state": state, "error_message": error, "failed_task": None, "failed_trial": ""})
    before = read_records(settings.job_log_path("ended"))[0]

    backend = FakeBackend()  # the job's replicas are gone
    assert drive_to_end(JobDriver("ended", settings, store, backend)) is State[state]
    job = store.get("ended")
    assert job.state is State[state]
    assert (job.error_message or "").startswith(error or "") and (error is None) == (job.error_message is None)
    assert read_records(settings.job_log_path("ended"))[0] == before and backend.removed == [("ended", None)]


@pytest.mark.parametrize("count, reason", [("100000", f"at most {MAX_REPLICAS} replicas"),
                                           ("1.0e+30", "workerCount")])  # (YAML reads a bare 1e30 as a string)
def test_huge_worker_counts_exit_2_with_one_line_and_nothing_created(count, reason, cli, home, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"trainingInput:\n  workerCount: {count}\n  workerType: n1-standard-4\n")
    result = cli("jobs", "submit", "training", "huge", "--config", str(config), "--scale-tier", "custom",
                 "--master-machine-type", "n1-standard-4", "--master-image-uri", "example.com/trainer:1",
                 "--region", "us-central1", timeout=60)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and reason in result.stderr
    assert not (home / "jobs.db").exists() or "huge" not in cli("jobs", "list").stdout


def test_a_knob_that_is_not_a_number_is_a_usage_error(monkeypatch, tmp_path):
    from aiptrain.settings import Settings

    monkeypatch.setenv("AIPTRAIN_REPLICA_PIDS_LIMIT", "lots")
    with pytest.raises(ValidationError, match=r"AIPTRAIN_REPLICA_PIDS_LIMIT \[lots\] is not a number"):
        Settings(home=tmp_path)


def test_a_network_the_engine_keeps_does_not_change_how_the_job_ended(tmp_path):
    from aiptrain.logs import read_records
    from aiptrain.model import State
    from aiptrain.runner.driver import JobDriver
    from aiptrain.settings import Settings
    from aiptrain.store import JobStore

    settings = Settings(home=tmp_path)
    settings.ensure_dirs()
    store = JobStore(settings.store_path)
    store.create(custom_job("kept"))
    store.transition("kept", State.PREPARING, [State.QUEUED])
    store.transition("kept", State.RUNNING, [State.PREPARING])
    store.record_verdict("kept", {"state": "SUCCEEDED", "error_message": None, "failed_task": None, "failed_trial": ""})

    from aiptrain.errors import AiptrainError

    # An engine that keeps the job's network (a stale endpoint) after its replicas went.
    stuck = FakeBackend(fail={"remove": AiptrainError(
        "Docker keeps the job's network 0123456789ab although its replicas are gone.")})
    assert drive_to_end(JobDriver("kept", settings, store, stuck)) is State.SUCCEEDED
    assert store.get("kept").state is State.SUCCEEDED
    lines = [(r.severity, r.message) for r in read_records(settings.job_log_path("kept"))[0]]
    assert lines[-2:] == [("WARNING", "Tearing down left something behind: Docker keeps the job's network "
                                      "0123456789ab although its replicas are gone."),
                          ("INFO", "Job completed successfully.")]
