"""Dependencies published only as an sdist (cloudml-hypertune): the host builds their wheel
(pure Python only) into the wheelhouse, and replicas install it with no index."""

from __future__ import annotations

import zipfile

import pytest

from aiptrain import wheelhouse
from aiptrain.errors import ValidationError


def _wheel(path, name, requires):
    with zipfile.ZipFile(path, "w") as archive:
        metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(
            f"Requires-Dist: {r}\n" for r in requires
        )
        archive.writestr(f"{name}-1.0.dist-info/METADATA", metadata)


def test_requirements_pip_skipped_by_the_hosts_markers_are_found(tmp_path):
    _wheel(tmp_path / "markdown-1.0-py3-none-any.whl", "markdown", [
        'importlib-metadata>=4.4; python_version < "3.10"', "zipp; python_version >= '3.12'",
        "pytest; extra == 'testing'", "tomli>=1",
    ])
    _wheel(tmp_path / "tomli-1.0-py3-none-any.whl", "tomli", [])
    assert wheelhouse.marker_requirements_missed(tmp_path, "3.9") == ["importlib-metadata>=4.4"]
    assert wheelhouse.marker_requirements_missed(tmp_path, "3.11") == []


def test_an_sdist_whose_c_extension_is_optional_is_built_pure(tmp_path):
    """TensorFlow 2.5/2.6 pin wrapt~=1.12.1, published only as an sdist with a C extension."""
    wheel = wheelhouse.build_pure_wheel("wrapt==1.12.1", tmp_path)
    assert wheel.name == "wrapt-1.12.1-py3-none-any.whl"


def test_an_image_build_is_not_told_to_pass_packages(monkeypatch, tmp_path):
    monkeypatch.setitem(wheelhouse.PURE_BUILD_ENV, "wrapt", {})  # as before: its C extension (or no compiler)
    with pytest.raises(ValidationError) as caught:
        wheelhouse.build_pure_wheel("wrapt==1.12.1", tmp_path, hint="")
    assert "[wrapt] publishes no wheel" in str(caught.value) and "--packages" not in str(caught.value)


def test_a_resolution_failure_crosses_a_process_boundary_whole():
    """Resolutions may run in worker processes (the runtimes' resolution test): their error keeps pip's output."""
    import pickle

    error = pickle.loads(pickle.dumps(wheelhouse.ResolutionFailed("Cannot resolve [x].", "pip said no")))
    assert (str(error), error.output) == ("Cannot resolve [x].", "pip said no")
