"""`aiptrain gcloud-config`: the files it writes for Google's gcloud, read back as gcloud reads
them (configparser, as googlecloudsdk/core/configurations does). tests/engine/test_real_gcloud.py
runs the real gcloud with them."""

from __future__ import annotations

import configparser
import stat

import pytest

from aiptrain import gcloud_configuration as configuration


def read(path) -> dict[str, dict[str, str]]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path)
    return {section: dict(parser[section]) for section in parser.sections()}


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    directory = tmp_path / "gcloud"
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(directory))
    for name in ("AIPTRAIN_API", "AIPTRAIN_API_TOKEN", "AIPTRAIN_API_TOKEN_FILE", "CLOUDSDK_CORE_PROJECT",
                 "CLOUDSDK_API_ENDPOINT_OVERRIDES_ML"):
        monkeypatch.delenv(name, raising=False)
    return directory


def test_a_configuration_of_its_own_made_active_with_every_endpoint(run, config_dir):
    code, _, err = run("gcloud-config", "--url", "http://127.0.0.1:9000/", "--region", "europe-west1")
    assert code == 0, err
    written = read(config_dir / "configurations" / "config_aiptrain")
    assert written == {
        "core": {"project": "aiptrain", "account": "aiptrain", "check_gce_metadata": "False"},
        "auth": {"access_token_file": str(config_dir / "aiptrain-tokens" / "aiptrain")},
        "api_endpoint_overrides": {"ml": "http://127.0.0.1:9000/", "logging": "http://127.0.0.1:9000/",
                                   "storage": "http://127.0.0.1:9000/storage/v1/",
                                   "aiplatform": "http://127.0.0.1:9000/"},
        "ml_engine": {"polling_interval": "1"},
        "compute": {"region": "europe-west1"},
    }
    assert (config_dir / "active_config").read_text() == "aiptrain"
    assert (config_dir / "configurations" / "config_default").read_text() == ""  # `activate default` goes back
    assert read(config_dir / "legacy_credentials" / "aiptrain" / ".boto") == {"GSUtil": {"use_gcloud_storage": "True"}}
    token = config_dir / "aiptrain-tokens" / "aiptrain"
    assert token.read_text() == f"{configuration.OPEN_SERVER_TOKEN}\n"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert "Back to Google's endpoints: gcloud config configurations activate default" in err


def test_named_configuration_project_and_client_modes_token(run, config_dir, monkeypatch):
    monkeypatch.setenv("AIPTRAIN_API", "http://trainer-host:8080")
    monkeypatch.setenv("AIPTRAIN_API_TOKEN", "s3cret")
    code, _, err = run("gcloud-config", "--configuration", "team-a", "--project", "team-a", "--no-activate")
    assert code == 0, err
    written = read(config_dir / "configurations" / "config_team-a")
    assert written["core"]["project"] == "team-a" and written["api_endpoint_overrides"]["ml"] == "http://trainer-host:8080/"
    assert (config_dir / "aiptrain-tokens" / "team-a").read_text() == "s3cret\n"
    assert not (config_dir / "active_config").exists()


def test_a_token_file_of_the_users_is_read_where_it_is(run, config_dir, tmp_path):
    token = tmp_path / "team.token"
    token.write_text("t0ken\n")
    assert run("gcloud-config", "--token-file", str(token))[0] == 0
    assert read(config_dir / "configurations" / "config_aiptrain")["auth"]["access_token_file"] == str(token)
    assert token.read_text() == "t0ken\n" and not (config_dir / "aiptrain-tokens").exists()


@pytest.mark.parametrize("argv, message", [
    (["--configuration", "Team"], "--configuration [Team] is not a name gcloud takes for this"),
    (["--configuration", "default"], "--configuration [default] is not a name gcloud takes for this"),
    (["--url", "trainer-host:8080"], "--url [trainer-host:8080] is not a server's URL: give http://HOST:PORT"),
    (["--url", "http://h:1/v1/projects"], "is not a server's URL"),
])
def test_bad_input_is_one_line_and_writes_nothing(run, config_dir, argv, message):
    code, _, err = run("gcloud-config", *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not config_dir.exists()


def test_an_empty_token_file_is_refused(run, config_dir, tmp_path):
    (tmp_path / "empty").write_text("\n")
    code, _, err = run("gcloud-config", "--token-file", str(tmp_path / "empty"))
    assert code == 2 and "is empty: put the server's token on its first line" in err


def test_a_configuration_aiptrain_did_not_write_is_kept_unless_forced(run, config_dir):
    theirs = config_dir / "configurations" / "config_aiptrain"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("[core]\nproject = mine\n")
    code, _, err = run("gcloud-config")
    assert code == 2 and "exists and aiptrain did not write it" in err and theirs.read_text() == "[core]\nproject = mine\n"
    assert run("gcloud-config", "--force")[0] == 0
    assert configuration.written_by_us(theirs)
    assert run("gcloud-config", "--url", "http://127.0.0.1:1")[0] == 0  # its own: rewritten without --force


@pytest.mark.parametrize("url, expected", [
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
    ("https://trainer.example.com/", "https://trainer.example.com"),
    ("http://[::1]:8080/", "http://[::1]:8080"),
    ("ftp://h:1", None),
    ("http://h:1/path", None),
    ("", None),
])
def test_server_urls(url, expected):
    assert configuration.normalized_url(url) == expected
