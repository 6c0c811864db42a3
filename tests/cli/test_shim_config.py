"""The gcloud shim's `config` and `auth` commands: what pipelines run around their submits."""

import subprocess
import sys

import pytest


@pytest.fixture
def gcloud(home, monkeypatch):
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT", raising=False)
    monkeypatch.delenv("CLOUDSDK_COMPUTE_REGION", raising=False)

    def run(*args, env=None):
        import os

        return subprocess.run([sys.executable, "-m", "aiptrain.cli.shim", *args], capture_output=True, text=True,
                              env={**os.environ, **(env or {})})

    return run


def test_properties_are_set_read_listed_and_unset_as_gcloud_does(gcloud):
    unset = gcloud("config", "get-value", "project")
    assert (unset.returncode, unset.stdout, unset.stderr) == (0, "", "(unset)\n")
    assert gcloud("config", "set", "project", "my-proj").stderr == "Updated property [core/project].\n"
    assert gcloud("config", "set", "compute/region", "us-east1").returncode == 0
    assert gcloud("config", "get-value", "project").stdout == "my-proj\n"
    assert gcloud("config", "get-value", "core/project").stdout == "my-proj\n"
    assert gcloud("config", "list", "project", "--format", "value(core.project)").stdout == "my-proj\n"
    assert gcloud("--format=value(core.project)", "config", "list").stdout == "my-proj\n"
    assert gcloud("config", "list").stdout == "[compute]\nregion = us-east1\n[core]\nproject = my-proj\n"
    # gcloud's CLOUDSDK_SECTION_NAME variables win over stored properties.
    assert gcloud("config", "get-value", "project", env={"CLOUDSDK_CORE_PROJECT": "env-proj"}).stdout == "env-proj\n"
    assert gcloud("config", "unset", "project").stderr == "Unset property [core/project].\n"
    assert gcloud("config", "get-value", "project").stdout == ""


def test_auth_has_no_local_effect_and_other_config_verbs_are_refused(gcloud):
    auth = gcloud("auth", "activate-service-account", "--key-file=key.json")
    assert auth.returncode == 0 and "has no local effect" in auth.stderr
    bad = gcloud("config", "configurations", "create", "x")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_properties_reach_submit(gcloud, tmp_path):
    from conftest import SAMPLE_TRAINER

    gcloud("config", "set", "compute/region", "europe-west4")
    gcloud("config", "set", "project", "proj-1")
    result = gcloud("ai-platform", "jobs", "submit", "training", "props", "--package-path", str(SAMPLE_TRAINER),
                    "--module-name", "trainer.task", "--runtime-version", "minimal", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert '\\"region\\": \\"europe-west4\\"' in result.stdout or '"region": "europe-west4"' in result.stdout


def test_stored_properties_are_read_by_settings_with_their_variables_winning(gcloud, monkeypatch):
    """aiptrain reads the properties where it needs them: the shim passes nothing through the
    environment, so `aiptrain` itself (and the Python API) see `gcloud config set` too."""
    from aiptrain.settings import Settings, local_python_override

    for prop, value in (("compute/region", "europe-west4"), ("project", "proj-1"),
                        ("ml_engine/local_python", "/opt/py/bin/python3")):
        assert gcloud("config", "set", prop, value).returncode == 0
    settings = Settings()
    assert (settings.default_region, settings.default_project) == ("europe-west4", "proj-1")
    assert local_python_override({}) == "/opt/py/bin/python3"
    monkeypatch.setenv("CLOUDSDK_COMPUTE_REGION", "us-east1")
    assert Settings().default_region == "us-east1"
    assert gcloud("config", "unset", "compute/region").returncode == 0
    monkeypatch.delenv("CLOUDSDK_COMPUTE_REGION")
    assert Settings().default_region == "us-central1"
