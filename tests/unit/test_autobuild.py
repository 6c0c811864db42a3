"""First run on a fresh machine: a submit whose runtime image is missing builds it, as `docker run`
pulls. Runs in an image repository of its own (never the shared images) and deletes what it built."""

from __future__ import annotations

import os

import pytest

from aiptrain import runtimes
from aiptrain.errors import EnvironmentNotReady
from aiptrain.runtime_catalog import runtime


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


