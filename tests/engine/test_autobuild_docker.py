"""Submit builds a runtime image that is missing, on the real engine."""

from __future__ import annotations

import pytest

REPOSITORY = "aiptrain-test-autobuild/runtime"


@pytest.fixture
def isolated_repository(monkeypatch, docker_api):
    """Runtime images tagged under REPOSITORY; the image built there is removed afterwards."""
    import docker.errors

    monkeypatch.setenv("AIPTRAIN_IMAGE_REPOSITORY", REPOSITORY)
    image = f"{REPOSITORY}:minimal"
    yield image
    try:
        docker_api.remove_image(image, force=True)
    except docker.errors.ImageNotFound:
        pass


def test_submit_builds_a_missing_runtime_image(cli, submit_args, isolated_repository, docker_api, monkeypatch):
    import docker.errors

    with pytest.raises(docker.errors.ImageNotFound):
        docker_api.inspect_image(isolated_repository)

    monkeypatch.setenv("AIPTRAIN_AUTO_BUILD", "0")
    refused = cli(*submit_args("autobuild_refused"), check_code=3)
    assert f"Image [{isolated_repository}] is not on this Docker engine" in refused.stderr
    assert "aiptrain runtimes build" in refused.stderr
    assert cli("jobs", "list", "--format", "value(jobId)").stdout == ""  # nothing half-created

    monkeypatch.delenv("AIPTRAIN_AUTO_BUILD")
    built = cli(*submit_args("autobuild_job", "--stream-logs"), timeout=600)
    assert built.returncode == 0, built.stderr
    assert f"Runtime image [{isolated_repository}] is not on this Docker engine: building it now" in built.stderr
    assert f"Building {isolated_repository} from" in built.stderr  # log lines, not a spinner, through a pipe
    assert "state: SUCCEEDED" in built.stdout
    docker_api.inspect_image(isolated_repository)

    again = cli(*submit_args("autobuild_again"), check_code=0)
    assert "building it now" not in again.stderr  # built once
