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
    # 1.x: no TensorFlow (none for Python 3.9), the nearest scikit-learn, XGBoost and pandas.
    "1.15": ("bullseye", "3.9", "scikit-learn==0.24.2", "xgboost==0.90", "pandas==1.1.5"),
    "1.14": ("bullseye", "3.9", "scikit-learn==0.24.2", "xgboost==0.82", "pandas==1.1.5"),
    "1.13": ("bullseye", "3.9", "scikit-learn==0.24.2", "xgboost==0.81", "pandas==1.1.5"),
    "1.12": ("bullseye", "3.9", "scikit-learn==0.24.2", "xgboost==0.80", "pandas==1.1.5"),
    **dict.fromkeys(("1.11", "1.10", "1.9", "1.8", "1.7", "1.6", "1.5", "1.4"),
                    ("bullseye", "3.9", "scikit-learn==0.24.2", "xgboost==0.90", "pandas==1.1.5")),
    "1.2": ("bullseye", "3.9", "numpy<1.20"),
    "1.0": ("bullseye", "3.9", "numpy<1.20"),
}


@pytest.fixture(autouse=True)
def default_repositories(monkeypatch):
    for name in ("AIPTRAIN_IMAGE_REPOSITORY", "AIPTRAIN_BASE_REPOSITORY", "AIPTRAIN_BASE_IMAGE"):
        monkeypatch.delenv(name, raising=False)


def test_every_version_the_service_offered_is_in_the_catalog():
    assert set(RUNTIMES) == set(EXPECTED) | {"minimal", "pytorch-2.13"} == set(SERVICE_PINS) | {"minimal", "pytorch-2.13"}


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
        ("2.4", "NOTE: runtime 2.4 runs TensorFlow 2.5.3, the nearest release for Python 3.9 "
                "(AI Platform ran TensorFlow 2.4.0); given back for its trainers: "
                "tf.keras.experimental.LinearCosineDecay and NoisyLinearCosineDecay."),
        ("2.1", "NOTE: runtime 2.1 runs TensorFlow 2.5.3, scikit-learn 0.24.2, pandas 1.1.5, the nearest releases "
                "for Python 3.9 (AI Platform ran TensorFlow 2.1.0, scikit-learn 0.22.1, pandas 0.25.3); given back "
                "for its trainers: sklearn.externals.joblib and .six; scikit-learn's module paths before 0.24 "
                "(sklearn.ensemble.forest, sklearn.metrics.scorer, ...); as_matrix, get_value and set_value of "
                "DataFrame and Series; tf.keras.utils.multi_gpu_model; tf.keras.experimental.LinearCosineDecay and "
                "NoisyLinearCosineDecay."),
        ("1.15", "NOTE: runtime 1.15 runs scikit-learn 0.24.2, pandas 1.1.5, the nearest releases for Python 3.9, "
                 "and no TensorFlow (AI Platform ran TensorFlow 1.15.0, scikit-learn 0.20.4, pandas 0.24.2); a "
                 "trainer that imports tensorflow fails: try --runtime-version 2.1; given back for its trainers: "
                 "sklearn.externals.joblib and .six; scikit-learn's module paths before 0.24 "
                 "(sklearn.ensemble.forest, sklearn.metrics.scorer, ...); as_matrix, get_value and set_value of "
                 "DataFrame and Series."),
        ("2.5", None),
        ("1.0", "NOTE: runtime 1.0 runs no TensorFlow (AI Platform ran TensorFlow 1.0.1); a trainer that imports "
                "tensorflow fails: try --runtime-version 2.1."),
        ("minimal", None),
    ],
)
def test_the_note_names_what_differs_from_the_service(version, note):
    assert runtime(version).note == note


def test_minimal_is_python_and_pip_on_bookworm():
    rt = runtime("minimal")
    assert (rt.base.name, rt.python, rt.packages, rt.provides) == ("bookworm", "3.11", (), frozenset())


def test_pytorch_is_torchs_cpu_build_on_bookworm_with_the_google_libraries():
    rt = runtime("pytorch-2.13")
    assert (rt.base.name, rt.python, rt.image, rt.note) == ("bookworm", "3.11", "aiptrain/runtime:pytorch-2.13", None)
    # `+cpu`: only the CPU wheel pip is pointed at matches, never PyPI's CUDA build.
    assert rt.packages[:2] == ("torch==2.13.0+cpu", "numpy")
    assert {"torch", "numpy", "cloudml-hypertune", "google-cloud-storage", "gcsfs"} <= rt.provides
    assert rt.imports[0] == "torch" and "hypertune" in rt.imports


def test_frameworks_are_provided_but_constraints_are_not():
    provides = runtime("2.11").provides
    assert {"tensorflow", "tensorflow-cpu", "scikit-learn", "xgboost", "pandas", "cloudml-hypertune",
            "google-cloud-storage", "google-api-python-client", "google-auth", "gcsfs"} == provides
    assert runtime("2.11").bounds == ("numpy<1.24", "protobuf<3.20")


@pytest.mark.parametrize("version", EXPECTED)
def test_every_runtime_holds_the_google_libraries_trainers_imported_undeclared(version):
    packages = runtime(version).packages
    assert {"google-cloud-storage", "google-api-python-client", "google-auth", "gcsfs"} <= set(packages)


def test_base_and_image_repositories_follow_the_environment(monkeypatch):
    monkeypatch.setenv("AIPTRAIN_IMAGE_REPOSITORY", "aiptrain-dev/runtime")
    monkeypatch.setenv("AIPTRAIN_BASE_REPOSITORY", "aiptrain-dev/base")
    assert runtime("2.11").image == "aiptrain-dev/runtime:2.11"
    assert runtime("2.11").base.image == "aiptrain-dev/base:bullseye"
    assert runtime("1.15").base.image == "aiptrain-dev/base:bullseye"
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
    assert message.endswith(", 1.0, minimal, pytorch-2.13 (`aiptrain runtimes list`).") and "\n" not in message


# version: the surfaces given back (aiptrain_compat.SURFACES), from the service's releases and ours.
COMPAT = {
    **dict.fromkeys(("2.11", "2.10", "2.9", "2.8", "2.7", "2.6", "2.5"), ()),
    "2.4": ("keras-2.5",),
    "2.3": ("sklearn-paths", "keras-2.4", "keras-2.5"),
    "2.2": ("sklearn-externals", "sklearn-paths", "keras-2.4", "keras-2.5"),
    "2.1": ("sklearn-externals", "sklearn-paths", "pandas-1.0", "keras-2.4", "keras-2.5"),
    **dict.fromkeys(("1.15", "1.14", "1.13", "1.12", "1.11", "1.10", "1.9", "1.8", "1.7", "1.6", "1.5", "1.4"),
                    ("sklearn-externals", "sklearn-paths", "pandas-1.0")),
    "1.2": (),
    "1.0": (),
}


@pytest.mark.parametrize("version", EXPECTED)
def test_each_runtime_gives_back_what_its_releases_removed(version):
    rt = runtime(version)
    assert tuple(surface.name for surface in rt.compat) == COMPAT[version]
    assert rt.lacks_tensorflow == version.startswith("1.")
    assert ("six" in rt.packages) == ("sklearn-externals" in COMPAT[version])  # TensorFlow brings it to 2.x only
    if rt.compat or rt.lacks_tensorflow:
        assert rt.compat_line.startswith("import aiptrain_compat; aiptrain_compat.install(")
    else:
        assert rt.compat_line is None


def test_the_surfaces_the_catalog_names_are_the_modules():
    from aiptrain.runtime import aiptrain_compat
    from aiptrain.runtime_catalog import COMPAT as SURFACES

    assert [surface.name for surface in SURFACES] == list(aiptrain_compat.SURFACES)


def test_a_1x_runtime_installs_no_tensorflow_and_names_runtime_2_1_in_one_line():
    rt = runtime("1.15")
    assert not any(p.startswith("tensorflow") for p in rt.packages) and "tensorflow" not in rt.imports
    line = rt.without_tensorflow
    assert "\n" not in line and line.startswith("ERROR: runtime 1.15 has no TensorFlow here: TensorFlow 1.15.0 has ")
    assert "--runtime-version 2.1" in line and "aiptrain runtimes add 1.15 --image IMAGE" in line
    assert f"without_tensorflow={line!r}" in rt.compat_line
    assert runtime("2.1").without_tensorflow == ""
