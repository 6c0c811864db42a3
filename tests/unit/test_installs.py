"""Install once, not per replica: one install container per (image, packages), mounted by
every replica; resubmits install nothing; a package that fails to install is refused; a pure
trainer with aiptrain's own setup.py is unpacked on the host instead."""


import shutil
from pathlib import Path

import pytest

from aiptrain.errors import ValidationError
from aiptrain.installs import COMPLETE, PureTrainer, ensure_installed, install_key, unpacks_on_host
from aiptrain.packaging import build_sdist
from aiptrain.planning import INSTALL, INSTALL_TARGET, PACKAGES_DIR, Mount, install_container

from conftest import REPO, trainer_with_setup_py
from fakes import FakeBackend

SAMPLE = REPO / "sample_jobs" / "basic" / "trainer"


def test_the_install_container_runs_the_replicas_pip_install_once_without_network():
    spec = install_container("aiptrain/runtime:minimal", "/work/pkgs", ("a.tar.gz", "trainer.tar.gz"),
                             "wheelhouse", "/cache/installs/x", "65534:65534", {"aiptrain.install-for": "j"})
    assert spec.command == ["sh", "-c", INSTALL]
    assert spec.env == {
        "HOME": "/tmp",
        "PYTHONUSERBASE": INSTALL_TARGET,
        "AIPTRAIN_PACKAGES": f"{PACKAGES_DIR}/a.tar.gz {PACKAGES_DIR}/trainer.tar.gz",
        "AIPTRAIN_WHEELHOUSE": f"{PACKAGES_DIR}/wheelhouse",
    }
    assert spec.mounts == (Mount("/work/pkgs", PACKAGES_DIR, True), Mount("/cache/installs/x", INSTALL_TARGET, False))
    assert spec.user == "65534:65534" and spec.gpus == 0
    assert spec.labels == {"aiptrain.install-for": "j"}  # a submit killed meanwhile is cleaned up with its job


def test_the_install_key_follows_the_image_and_every_byte(tmp_path):
    (tmp_path / "wheelhouse").mkdir()
    (tmp_path / "trainer.tar.gz").write_bytes(b"one")
    (tmp_path / "wheelhouse" / "dep.whl").write_bytes(b"dep")
    key = install_key("sha256:image", tmp_path, ["trainer.tar.gz"], "wheelhouse")
    assert key == install_key("sha256:image", tmp_path, ["trainer.tar.gz"], "wheelhouse")
    assert key != install_key("sha256:other", tmp_path, ["trainer.tar.gz"], "wheelhouse")
    assert key != install_key("sha256:image", tmp_path, ["trainer.tar.gz"], None)
    (tmp_path / "wheelhouse" / "dep.whl").write_bytes(b"dep 2")
    assert key != install_key("sha256:image", tmp_path, ["trainer.tar.gz"], "wheelhouse")




# -- a pure trainer unpacked on the host ---------------------------------------------------------


def _trainer_with_setup(tmp_path, setup_args: str) -> Path:
    return trainer_with_setup_py(tmp_path / "src", "from setuptools import setup\nsetup(name='trainer', "
                                 f"version='0.1', packages=['trainer'], {setup_args})\n")


def _install(tmp_path, built, python="3.7"):
    backend = FakeBackend()
    package_dir = built.path.parent
    target, installed_now = ensure_installed(backend, "aiptrain/runtime:2.1", "sha256:2.1", package_dir, [built.path.name], None,
                                             tmp_path / "cache", "65534:65534", {},
                                             PureTrainer(built.wheel, python) if built.wheel else None)
    return backend, target, installed_now


def test_a_trainer_without_a_setup_py_is_unpacked_here_in_the_images_user_scheme(tmp_path):
    """aiptrain's own generated setup.py builds a pure wheel beside the sdist: no install container."""
    from aiptrain.packaging import cached_sdist

    shutil.copytree(SAMPLE, tmp_path / "src" / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    built = cached_sdist(tmp_path / "src" / "trainer", tmp_path / "cache")
    assert built.wheel is not None and built.wheel.name.endswith("-py3-none-any.whl")
    backend, target, installed_now = _install(tmp_path, built)
    assert installed_now and not [c for c in backend.calls if c[0] == "run_to_completion"]
    site = target / "lib" / "python3.7" / "site-packages"  # where PYTHONUSERBASE=... puts Python 3.7's user site
    assert (site / "trainer" / "task.py").read_bytes() == (SAMPLE / "task.py").read_bytes()
    info = next(site.glob("trainer-*.dist-info"))
    assert (info / "INSTALLER").read_text() == "aiptrain\n" and (info / "RECORD").is_file()
    assert (target / COMPLETE).is_file()
    assert cached_sdist(tmp_path / "src" / "trainer", tmp_path / "cache").wheel == built.wheel  # kept with the sdist


def test_a_trainers_own_setup_py_gets_no_wheel_here_it_installs_in_the_image(tmp_path):
    from aiptrain.packaging import cached_sdist

    built = cached_sdist(_trainer_with_setup(tmp_path, ""), tmp_path / "cache")
    assert built.wheel is None
    backend, _, _ = _install(tmp_path, built)
    assert [c[0] for c in backend.calls if c[0] == "run_to_completion"] == ["run_to_completion"]


@pytest.mark.parametrize("setup_args", [
    "entry_points={'console_scripts': ['train = trainer.task:main']}",  # a script to write for the image
    "data_files=[('share/trainer', ['trainer/task.py'])]",  # files outside site-packages
])
def test_a_wheel_that_needs_more_than_unpacking_installs_in_the_container(tmp_path, setup_args):
    package = _trainer_with_setup(tmp_path, setup_args)
    built = build_sdist(package, tmp_path, wheel_dir=tmp_path)  # as if aiptrain's own build had made it
    assert built.wheel is not None and not unpacks_on_host(built.wheel)
    backend, _, _ = _install(tmp_path, built)
    assert [c[0] for c in backend.calls if c[0] == "run_to_completion"] == ["run_to_completion"]


def test_a_wheel_for_a_newer_python_is_refused_as_pip_refuses_it_and_nothing_is_left(tmp_path):
    built = build_sdist(_trainer_with_setup(tmp_path, "python_requires='>=3.8'"), tmp_path, wheel_dir=tmp_path)
    with pytest.raises(ValidationError) as refused:
        _install(tmp_path, built, python="3.7")
    assert "requires a different Python: 3.7 not in '>=3.8'" in str(refused.value)
    assert list((tmp_path / "cache" / "installs").iterdir()) == []
    _, target, _ = _install(tmp_path, built, python="3.11")
    assert (target / "lib" / "python3.11" / "site-packages" / "trainer" / "task.py").is_file()
