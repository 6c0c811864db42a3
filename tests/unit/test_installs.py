"""Install once, not per replica: one install container per (image, packages), mounted by
every replica; resubmits install nothing; a package that fails to install is refused."""


from aiptrain.installs import install_key
from aiptrain.planning import INSTALL, INSTALL_TARGET, PACKAGES_DIR, Mount, install_container


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


