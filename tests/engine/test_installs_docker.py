"""Install containers on the real engine: replicas start without installing, and a package that
fails to install leaves nothing."""

import textwrap

from conftest import REPO, job_resources

WITH_DEPENDENCY = REPO / "sample_jobs" / "with_dependency" / "trainer"


def test_replicas_start_the_trainer_without_installing_and_resubmits_install_nothing(
    cli, home, tmp_path, minimal_runtime, docker_api
):
    def submit(job_id):
        return cli("jobs", "submit", "training", job_id, "--package-path", str(WITH_DEPENDENCY),
                   "--module-name", "trainer.task", "--job-dir", str(tmp_path / job_id), "--region", "us-central1",
                   "--runtime-version", minimal_runtime, "--scale-tier", "custom", "--master-machine-type",
                   "n1-standard-4", "--worker-machine-type", "n1-standard-4", "--worker-count", "2",
                   "--stream-logs", "--verbosity", "info", "--", "--steps", "2000000", check_code=0)

    # The master runs a couple of seconds (2M steps), so every worker prints before the master's
    # success stops them: a worker that starts after the master ended never prints at all.
    first = submit("once_a")
    installs = home / "cache" / "installs"
    assert len(list(installs.iterdir())) == 1
    assert "\tInstalling the package:" not in first.stderr  # no replica ran pip
    assert "Installed the packages once for every replica:" in first.stderr
    for task in ("master-replica-0", "worker-replica-0", "worker-replica-1"):
        assert f"{task}\t\tImported tabulate" in first.stderr  # the dependency, from the shared install
    second = submit("once_b")
    assert "INFO: Reused the packages for" in second.stderr
    assert len(list(installs.iterdir())) == 1
    assert job_resources(docker_api, "once_a") == job_resources(docker_api, "once_b") == []


def test_a_package_that_fails_to_install_is_refused_and_nothing_is_left(cli, home, tmp_path, minimal_runtime,
                                                                         docker_api):
    source = tmp_path / "broken"
    (source / "trainer").mkdir(parents=True)
    (source / "trainer" / "__init__.py").write_text("")
    (source / "trainer" / "task.py").write_text("print('never runs')\n")
    (source / "setup.py").write_text(textwrap.dedent("""\
        import os, sys
        from setuptools import setup
        if os.path.isdir("/opt/aiptrain"):  # inside a replica's image, not on the host that builds the sdist
            sys.exit("this package refuses to install here")
        setup(name="trainer", version="0.1", packages=["trainer"])
        """))
    result = cli("jobs", "submit", "training", "broken_install", "--package-path", str(source / "trainer"),
                 "--module-name", "trainer.task", "--job-dir", str(tmp_path / "out"), "--region", "us-central1",
                 "--runtime-version", minimal_runtime)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR: Installing the job's packages in [aiptrain/runtime:minimal]")
    assert "Fix the package" in lines[0]
    assert cli("jobs", "list").stderr.strip() == "Listed 0 items."
    assert [p.name for p in (home / "cache" / "installs").iterdir()] == []
    assert job_resources(docker_api, "broken_install") == []
    assert not (tmp_path / "out").exists()
