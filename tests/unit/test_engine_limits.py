"""Names and limits on the engine side, pure parts: hostnames for long IDs, names scoped by
installation, replica-count limits, plans that grow linearly, the PIDs limit, subnets from the
pool."""

import ipaddress
import json

import pytest
from docker.errors import APIError

from aiptrain.backends.engine import engine_error
from aiptrain.backends.networks import pick_subnet, subnet_pool, subnet_prefix
from aiptrain.errors import ValidationError
from aiptrain.model import Job, ScaleTier, TrainingInput
from aiptrain.planning import HOSTNAME_MAX, PlanInputs, Trial, plan
from aiptrain.topology import MAX_REPLICAS, replicas_for

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


# -- long job IDs ----------------------------------------------------------------------


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


# -- engine-side names scoped by installation -----------------------------------------------


def test_container_and_network_names_carry_the_installation_after_the_readable_part():
    homes = [plan_of(custom_job("x"), PlanInputs(runtime_image="i", installation=i)) for i in ("aaaa1111bbbb", "cccc2222dddd")]
    assert homes[0].network.name == "aiptrain-x-aaaa1111"
    assert [c.name for c in homes[0].containers] == ["x-master-0-aaaa1111", "x-worker-0-aaaa1111",
                                                      "x-worker-1-aaaa1111", "x-ps-0-aaaa1111"]
    assert homes[1].containers[0].name == "x-master-0-cccc2222"
    assert homes[0].containers[0].hostname == homes[1].containers[0].hostname == "x-master-0"


# -- replica counts ---------------------------------------------------------------------


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


# -- PIDs limit ------------------------------------------------------------------------


def test_replicas_get_the_pids_limit_of_the_inputs_and_zero_means_none():
    assert {c.pids_limit for c in plan_of(custom_job(), PlanInputs(runtime_image="i", pids_limit=4096)).containers} == {4096}
    assert plan_of(custom_job(), PlanInputs(runtime_image="i", pids_limit=0)).containers[0].pids_limit is None


def test_settings_default_and_override_the_pids_limit(monkeypatch, tmp_path):
    from aiptrain.settings import DEFAULT_REPLICA_PIDS_LIMIT, Settings

    monkeypatch.delenv("AIPTRAIN_REPLICA_PIDS_LIMIT", raising=False)
    assert Settings(home=tmp_path).replica_pids_limit == DEFAULT_REPLICA_PIDS_LIMIT
    monkeypatch.setenv("AIPTRAIN_REPLICA_PIDS_LIMIT", "100")
    assert Settings(home=tmp_path).replica_pids_limit == 100


# -- subnets ----------------------------------------------------------------------------


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


# -- limits at the command line and in variables ------------------------------------------


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


