"""Every runtime version AI Platform offered resolves to an image recipe (base, Python) and
pinned frameworks; where ours differ from the service's, the note says so. Pure: no Docker."""

from __future__ import annotations

import pytest

from aiptrain.errors import ValidationError
from aiptrain.runtime_catalog import RUNTIMES, SERVICE_PINS, runtime
from aiptrain.settings import Settings

# version: (base, Python, tensorflow, scikit-learn, xgboost, pandas) our image installs
EXPECTED = {
    "2.11": ("bullseye", "3.9", "tensorflow-cpu==2.11.0", "scikit-learn==1.0.2", "xgboost==1.6.2", "pandas==1.3.5"),
    "2.10": ("bullseye", "3.9", "tensorflow-cpu==2.10.0", "scikit-learn==1.0.2", "xgboost==1.6.1", "pandas==1.3.5"),
    "2.9": ("bullseye", "3.9", "tensorflow-cpu==2.9.1", "scikit-learn==1.0.2", "xgboost==1.6.1", "pandas==1.3.5"),
    "2.8": ("bullseye", "3.9", "tensorflow-cpu==2.8.0", "scikit-learn==1.0.2", "xgboost==1.5.2", "pandas==1.3.5"),
    "2.7": ("bullseye", "3.9", "tensorflow-cpu==2.7.0", "scikit-learn==1.0.1", "xgboost==1.5.0", "pandas==1.3.4"),
    "2.6": ("bullseye", "3.9", "tensorflow-cpu==2.6.0", "scikit-learn==0.24.2", "xgboost==1.4.2", "pandas==1.3.2"),
    "2.5": ("bullseye", "3.9", "tensorflow-cpu==2.5.0", "scikit-learn==0.24.2", "xgboost==1.4.2", "pandas==1.2.4"),
    "2.4": ("bullseye", "3.9", "tensorflow-cpu==2.5.3", "scikit-learn==0.24.0", "xgboost==1.3.1", "pandas==1.1.5"),
    "2.3": ("bullseye", "3.9", "tensorflow-cpu==2.5.3", "scikit-learn==0.24.2", "xgboost==1.2.0", "pandas==1.1.5"),
    "2.2": ("bullseye", "3.9", "tensorflow-cpu==2.5.3", "scikit-learn==0.24.2", "xgboost==1.1.1", "pandas==1.1.5"),
    "2.1": ("bullseye", "3.9", "tensorflow-cpu==2.5.3", "scikit-learn==0.24.2", "xgboost==0.90", "pandas==1.1.5"),
    "1.15": ("python3.7", "3.7", "tensorflow-cpu==1.15.0", "scikit-learn==0.20.4", "xgboost==0.90", "pandas==0.24.2"),
    "1.14": ("python3.7", "3.7", "tensorflow==1.14.0", "scikit-learn==0.20.2", "xgboost==0.82", "pandas==0.24.2"),
    "1.13": ("python3.7", "3.7", "tensorflow==1.13.1", "scikit-learn==0.20.2", "xgboost==0.81", "pandas==0.24.0"),
    "1.12": ("python3.7", "3.7", "tensorflow==1.13.2", "scikit-learn==0.20.0", "xgboost==0.80", "pandas==0.23.4"),
    **dict.fromkeys(("1.11", "1.10", "1.9", "1.8", "1.7", "1.6", "1.5", "1.4"), ("python3.7", "3.7", "tensorflow==1.13.2", "scikit-learn==0.19.2", "xgboost==0.80", "pandas==0.23.4")),
    "1.2": ("python3.7", "3.7", "tensorflow==1.13.2"),
    "1.0": ("python3.7", "3.7", "tensorflow==1.13.2"),
}


@pytest.fixture(autouse=True)
def default_repositories(monkeypatch):
    for name in ("AIPTRAIN_IMAGE_REPOSITORY", "AIPTRAIN_BASE_REPOSITORY", "AIPTRAIN_BASE_IMAGE"):
        monkeypatch.delenv(name, raising=False)


def test_every_version_the_service_offered_is_in_the_catalog():
    assert set(RUNTIMES) == set(EXPECTED) | {"minimal"} == set(SERVICE_PINS) | {"minimal"}


@pytest.mark.parametrize("version", EXPECTED)
def test_each_version_resolves_to_its_recipe_and_pinned_frameworks(version):
    base, python, *frameworks = EXPECTED[version]
    rt = runtime(version)
    assert (rt.base.name, rt.python) == (base, python)
    assert rt.packages[: len(frameworks)] == tuple(frameworks)
    assert "cloudml-hypertune==0.1.0.dev6" in rt.packages
    assert rt.image == f"aiptrain/runtime:{version}"


@pytest.mark.parametrize(
    "version, note",
    [
        ("2.11", None),
        ("2.5", None),
        ("1.15", None),
        ("2.4", "NOTE: runtime 2.4 runs TensorFlow 2.5.3, the nearest release for Python 3.9 "
                "(AI Platform ran TensorFlow 2.4.0)."),
        ("2.1", "NOTE: runtime 2.1 runs TensorFlow 2.5.3, scikit-learn 0.24.2, pandas 1.1.5, the nearest releases "
                "for Python 3.9 (AI Platform ran TensorFlow 2.1.0, scikit-learn 0.22.1, pandas 0.25.3)."),
        ("1.0", "NOTE: runtime 1.0 runs TensorFlow 1.13.2, the nearest release for Python 3.7 "
                "(AI Platform ran TensorFlow 1.0.1)."),
        ("minimal", None),
    ],
)
def test_the_note_names_what_differs_from_the_service(version, note):
    assert runtime(version).note == note


def test_minimal_is_python_and_pip_on_bookworm():
    rt = runtime("minimal")
    assert (rt.base.name, rt.python, rt.packages, rt.provides) == ("bookworm", "3.11", (), frozenset())


def test_frameworks_are_provided_but_constraints_are_not():
    provides = runtime("2.11").provides
    assert {"tensorflow", "tensorflow-cpu", "scikit-learn", "xgboost", "pandas", "cloudml-hypertune",
            "google-cloud-storage", "google-api-python-client", "google-auth", "gcsfs"} == provides
    assert runtime("2.11").bounds == ("numpy<1.24", "protobuf<3.20")


@pytest.mark.parametrize("version", [v for v in EXPECTED if v.startswith("2.")])
def test_every_2x_runtime_holds_the_google_libraries_trainers_imported_undeclared(version):
    packages = runtime(version).packages
    assert {"google-cloud-storage", "google-api-python-client", "google-auth", "gcsfs"} <= set(packages)


def test_base_and_image_repositories_follow_the_environment(monkeypatch):
    monkeypatch.setenv("AIPTRAIN_IMAGE_REPOSITORY", "aiptrain-dev/runtime")
    monkeypatch.setenv("AIPTRAIN_BASE_REPOSITORY", "aiptrain-dev/base")
    assert runtime("2.11").image == "aiptrain-dev/runtime:2.11"
    assert runtime("2.11").base.image == "aiptrain-dev/base:bullseye"
    assert runtime("1.15").base.image == "python:3.7-slim"  # pulled as is
    assert runtime("minimal").base.image == "aiptrain-dev/base:bookworm" == Settings().base_image
    monkeypatch.setenv("AIPTRAIN_BASE_IMAGE", "team/base:bookworm")
    assert runtime("minimal").base.image == "team/base:bookworm" == Settings().base_image  # one answer, not two


def test_a_mapped_version_runs_the_teams_image_and_overrides_the_catalog():
    mapped = {"1.15": {"image": "team/tf:1.15", "python": "3.7"}, "team": {"image": "team/x:1", "python": "3.10"}}
    rt = runtime("1.15", mapped=mapped)
    assert (rt.image, rt.python, rt.provides, rt.note) == ("team/tf:1.15", "3.7", frozenset(), None)
    assert runtime("team", mapped=mapped).python == "3.10"


@pytest.mark.parametrize("given_as", ["--runtime-version", "runtimeVersion in the config file"])
def test_an_unknown_version_names_where_it_came_from(given_as):
    with pytest.raises(ValidationError) as caught:
        runtime("3.0", given_as)
    message = str(caught.value)
    assert message.startswith(f"Unknown {given_as} [3.0]: choose one of 2.11, 2.10,")
    assert message.endswith(", 1.0, minimal (`aiptrain runtimes list`).") and "\n" not in message
