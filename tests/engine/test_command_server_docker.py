"""The command server on the real engine: a home's controller starts it once its first job is
launched, and the next `jobs` commands run as its children, streaming a job to its end as a
command in its own process does."""

import yaml

from conftest import wait_for


def test_the_controller_starts_the_command_server_and_commands_run_as_its_children(cli, submit_args, home,
                                                                                    monkeypatch, docker_api):
    monkeypatch.setenv("AIPTRAIN_DEBUG", "1")  # the server names each command it forks, in controller.log
    log = home / "controller.log"
    first = cli(*submit_args("first_job", "--stream-logs"), check_code=0)
    wait_for(lambda: " serves " in log.read_text(), timeout=60, what="the command server")
    second = cli(*submit_args("second_job", "--stream-logs"), check_code=0)
    assert "runs aiptrain jobs submit training second_job" in log.read_text()
    assert yaml.safe_load(second.stdout)["state"] == yaml.safe_load(first.stdout)["state"] == "SUCCEEDED"
    def trainer_lines(result):
        return [line.split("\t")[4].replace("second_job", "JOB").replace("first_job", "JOB")
                for line in result.stderr.splitlines() if "\tmaster-replica-0\t" in line]

    assert trainer_lines(second) == trainer_lines(first) != []
    alone = cli("jobs", "describe", "second_job", check_code=0)
    monkeypatch.setenv("AIPTRAIN_COMMAND_SERVER", "0")
    assert cli("jobs", "describe", "second_job", check_code=0).stdout == alone.stdout
    assert log.read_text().count("runs aiptrain jobs describe second_job") == 1
