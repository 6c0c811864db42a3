"""First run on a fresh machine: a submit whose runtime image is missing builds it, as `docker run`
pulls. Runs in an image repository of its own (never the shared images) and deletes what it built."""

from __future__ import annotations

import os

import pytest

from aiptrain import runtimes
from aiptrain.errors import EnvironmentNotReady
from aiptrain.runtime_catalog import runtime

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


def test_missing_base_names_the_command_when_not_root(monkeypatch, tmp_path):
    monkeypatch.setenv("AIPTRAIN_BASE_IMAGE", "aiptrain-test-autobuild/base:absent")
    monkeypatch.setattr(runtimes, "_image_labels", lambda image: None)
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    with pytest.raises(EnvironmentNotReady) as refused:
        runtimes.ensure_image(runtime("minimal"), tmp_path, lambda line: None, "--runtime-version")
    message = str(refused.value)
    assert "[aiptrain-test-autobuild/base:absent]" in message
    assert f"sudo {runtimes.BASE_IMAGE_SCRIPT} bookworm" in message and refused.value.exit_code == 3


def test_a_mapped_or_present_image_is_left_alone(monkeypatch, tmp_path):
    monkeypatch.setattr(runtimes, "image_is_current", lambda rt: True)
    assert runtimes.ensure_image(runtime("minimal"), tmp_path, pytest.fail, "--runtime-version") is False


@pytest.mark.docker
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
