"""Packaging: the sdist cache (tree hash, reuse, rebuild on change) and hermetic replicas
(the dependencies' wheelhouse, resolved on the host, installed with no index)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from aiptrain.errors import ValidationError
from aiptrain.packaging import (
    build_sdist,
    build_with_setuptools,
    cached_sdist,
    plain_package_modules,
    source_tree_hash,
)
from aiptrain.wheelhouse import canonical_name, read_metadata, requirements_for, resolve

from conftest import REPO, trainer_with_setup_py

SAMPLE = REPO / "sample_jobs" / "basic" / "trainer"
WITH_DEPENDENCY = REPO / "sample_jobs" / "with_dependency" / "trainer"


@pytest.fixture
def trainer(tmp_path) -> Path:
    """A copy of the basic sample trainer (no setup.py: one is generated)."""
    root = tmp_path / "src"
    shutil.copytree(SAMPLE, root / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    return root / "trainer"


def project_with_setup_py(root: Path) -> Path:
    """A copy of the sample with a dependency: a package root with its own setup.py."""
    shutil.copytree(WITH_DEPENDENCY.parent, root, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return root


# -- tree hash ---------------------------------------------------------------------------------


def test_tree_hash_is_stable_and_ignores_what_the_build_ignores(trainer):
    first = source_tree_hash(trainer)
    assert source_tree_hash(trainer) == first
    (trainer / "__pycache__").mkdir()
    (trainer / "__pycache__" / "task.cpython-311.pyc").write_bytes(b"\0junk")
    (trainer / "stale.pyc").write_bytes(b"\0")
    (trainer / ".git").mkdir()
    (trainer / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    assert source_tree_hash(trainer) == first


@pytest.mark.parametrize(
    "change",
    [
        lambda t: (t / "task.py").write_text((t / "task.py").read_text() + "\n# changed\n"),
        lambda t: (t / "extra.py").write_text("X = 1\n"),
        lambda t: (t / "task.py").rename(t / "train.py"),
        lambda t: os.chmod(t / "task.py", 0o755),
        lambda t: (t / "data").mkdir(),
        lambda t: (t.parent / "setup.py").write_text("from setuptools import setup\nsetup(name='trainer')\n"),
    ],
    ids=["content", "new file", "rename", "exec bit", "new dir", "user setup.py"],
)
def test_tree_hash_changes_with_the_tree(trainer, change):
    before = source_tree_hash(trainer)
    change(trainer)
    assert source_tree_hash(trainer) != before


def test_tree_hash_covers_the_package_root_when_it_has_a_setup_py(tmp_path):
    root = project_with_setup_py(tmp_path / "src")
    before = source_tree_hash(root / "trainer")
    (root / "README.md").write_text("docs\n")  # beside the package: part of what the build copies
    assert source_tree_hash(root / "trainer") != before


def test_tree_hash_of_a_generated_setup_ignores_the_package_roots_other_files(trainer):
    before = source_tree_hash(trainer)
    (trainer.parent / "notes.txt").write_text("not part of the package\n")
    assert source_tree_hash(trainer) == before


def test_a_fifo_or_a_socket_in_the_project_is_left_out_of_the_build(trainer, tmp_path):
    """No sdist holds one, and copying one for the build fails (a FIFO could block a reader)."""
    root = project_with_setup_py(tmp_path / "with_setup")
    hashes = {package: source_tree_hash(package) for package in (trainer, root / "trainer")}
    with contextlib.closing(socket.socket(socket.AF_UNIX)) as listening:
        listening.bind(str(root / "agent.sock"))
        os.mkfifo(root / "controller.wake")
        os.mkfifo(trainer / "pipe.py")
        assert {package: source_tree_hash(package) for package in hashes} == hashes
        assert plain_package_modules(trainer) == plain_package_modules(SAMPLE)
        for package in hashes:
            out = tmp_path / f"out-{package.parent.name}"
            out.mkdir()
            assert build_sdist(package, out).path.is_file()


def test_an_aiptrain_home_kept_in_the_project_is_left_out_of_the_build(tmp_path):
    """AIPTRAIN_HOME=./.aiptrain in a CI workspace: its files change with every job."""
    root = project_with_setup_py(tmp_path / "project")
    home = root / ".aiptrain"
    (home / "logs").mkdir(parents=True)
    os.mkfifo(home / "controller.wake")
    first = cached_sdist(root / "trainer", home / "cache", (home,))
    (home / "logs" / "job_1.jsonl").write_text("{}\n")
    assert cached_sdist(root / "trainer", home / "cache", (home,)) == first  # not built again
    with tarfile.open(first.path) as archive:
        assert not [name for name in archive.getnames() if ".aiptrain" in name]
    assert source_tree_hash(root / "trainer", (home,)) != source_tree_hash(root / "trainer")


# -- the sdist cache ---------------------------------------------------------------------------


def test_unchanged_tree_reuses_the_same_sdist(trainer, tmp_path):
    cache = tmp_path / "cache"
    first = cached_sdist(trainer, cache)
    stat = first.path.stat()
    second = cached_sdist(trainer, cache)
    assert second == first  # same file, same sha256: the staging path will not change
    assert second.path.stat().st_mtime_ns == stat.st_mtime_ns and second.path.stat().st_ino == stat.st_ino
    assert first.path.parent == cache / "sdists" / source_tree_hash(trainer)
    assert [p.name for p in (cache / "sdists").iterdir()] == [first.path.parent.name]  # no leftovers


def test_a_changed_file_always_rebuilds(trainer, tmp_path):
    cache = tmp_path / "cache"
    first = cached_sdist(trainer, cache)
    (trainer / "task.py").write_text((trainer / "task.py").read_text().replace("3 * x + 1", "5 * x + 2"))
    second = cached_sdist(trainer, cache)
    assert second.sha256 != first.sha256 and second.path != first.path
    with tarfile.open(second.path) as archive:
        task = next(m for m in archive if m.name.endswith("trainer/task.py"))
        assert b"5 * x + 2" in archive.extractfile(task).read()
    assert first.path.is_file()  # the old entry stays valid for its own tree


def test_an_emptied_cache_entry_is_rebuilt(trainer, tmp_path):
    cache = tmp_path / "cache"
    first = cached_sdist(trainer, cache)
    first.path.unlink()
    again = cached_sdist(trainer, cache)
    assert again.path.is_file() and again.path.parent == first.path.parent


def test_build_failure_leaves_no_cache_entry(tmp_path):
    root = tmp_path / "src"
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("")
    (root / "setup.py").write_text("raise SystemExit('broken setup.py')\n")
    with pytest.raises(ValidationError, match="Packaging of user Python code failed"):
        cached_sdist(root / "trainer", tmp_path / "cache")
    assert list((tmp_path / "cache" / "sdists").iterdir()) == []


# -- the generated setup.py's build, without setuptools ------------------------------------------

# Trees that the generated setup.py treats in every way it can: what find_packages skips
# (a directory without __init__.py and what is below it, a dotted name), what build_py skips
# (data files, hidden and upper-case modules), what the build never copies (__pycache__,
# build/), subpackages at depth, a module named setup.py inside the package, an executable.
PLAIN_TREES = {
    "flat": {"__init__.py": "", "task.py": "print('task')\n", "README.md": "# r\n", "data.json": "{}",
             ".hidden.py": "x = 1\n", "model.PY": "y = 2\n"},
    "nested": {"__init__.py": "", "task.py": "import trainer.sub.m\n", "sub/__init__.py": "", "sub/m.py": "m = 1\n",
               "sub/deeper/__init__.py": "", "sub/deeper/x.py": "x = 1\n", "notpkg/x.py": "no = 1\n",
               "notpkg/inner/__init__.py": "", "notpkg/inner/y.py": "y = 1\n", "a.b/__init__.py": "",
               "a.b/z.py": "", "build/__init__.py": "", "build/b.py": "", "__pycache__/t.cpython-311.pyc": "",
               "setup.py": "print('a module, not the build')\n", "sub/empty_dir/.keep": "",
               "run.py": "#!/usr/bin/env python3\n"},
}


def _tree(root: Path, files: dict[str, str]) -> Path:
    package = root / "trainer"
    for relative, text in files.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text)
    if "run.py" in files:
        (package / "run.py").chmod(0o755)
    return package


def _what_it_holds(built) -> tuple[dict, dict]:
    """(sdist member -> (content, executable) or None for a directory; wheel member -> content),
    leaving out the wheel's WHEEL and RECORD, which name the program that wrote them."""
    with tarfile.open(built.path) as archive:
        sdist = {m.name: (archive.extractfile(m).read(), bool(m.mode & 0o100)) if m.isfile() else None
                 for m in archive}
    with zipfile.ZipFile(built.wheel) as archive:
        wheel = {n: archive.read(n) for n in archive.namelist() if not n.endswith(("/WHEEL", "/RECORD"))}
    return sdist, wheel


@pytest.mark.parametrize("tree", sorted(PLAIN_TREES))
def test_a_plain_tree_builds_here_what_setuptools_builds(tree, tmp_path):
    package = _tree(tmp_path / "src", PLAIN_TREES[tree])
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for out in (ours, theirs):
        out.mkdir()
    here = build_sdist(package, ours, ours)
    setuptools = build_with_setuptools(package, theirs, theirs)
    assert here.path.name == setuptools.path.name == "trainer-0.0.0.tar.gz"
    assert here.wheel.name == setuptools.wheel.name == "trainer-0.0.0-py3-none-any.whl"
    assert _what_it_holds(here) == _what_it_holds(setuptools)


def test_a_built_wheel_records_every_file_it_holds(tmp_path):
    """installer (aiptrain.installs) checks each file against RECORD."""
    from installer.sources import WheelFile

    package = _tree(tmp_path / "src", PLAIN_TREES["nested"])
    built = build_sdist(package, tmp_path, tmp_path)
    with WheelFile.open(built.wheel) as wheel:
        wheel.validate_record()  # raises on a file missing from RECORD or a wrong hash or size


def test_the_same_tree_builds_the_same_bytes(tmp_path):
    package = _tree(tmp_path / "src", PLAIN_TREES["nested"])
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        out.mkdir()
    assert build_sdist(package, first, first).sha256 == build_sdist(package, second, second).sha256
    assert (first / "trainer-0.0.0-py3-none-any.whl").read_bytes() == (second / "trainer-0.0.0-py3-none-any.whl").read_bytes()


def _link(package: Path) -> None:
    (package / "linked.py").symlink_to(package / "task.py")


def _linked_dir(package: Path) -> None:
    (package / "other").symlink_to(package.parent, target_is_directory=True)


def _dir_named_like_a_module(package: Path) -> None:
    (package / "odd.py").mkdir()


def _link_in_a_subpackage(package: Path) -> None:
    (package / "sub").mkdir()
    (package / "sub" / "__init__.py").symlink_to(package / "__init__.py")


@pytest.mark.parametrize("make", [_link, _linked_dir, _dir_named_like_a_module, _link_in_a_subpackage])
def test_a_tree_setuptools_reads_otherwise_goes_to_setuptools(make, tmp_path):
    package = _tree(tmp_path / "src", PLAIN_TREES["flat"])
    make(package)
    assert plain_package_modules(package) is None


def test_a_package_name_that_is_no_identifier_goes_to_setuptools(tmp_path):
    package = tmp_path / "my-trainer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    assert plain_package_modules(package) is None
    assert plain_package_modules(_tree(tmp_path / "src", PLAIN_TREES["flat"])) == ["trainer/__init__.py",
                                                                                   "trainer/task.py"]


# -- reading requirements --------------------------------------------------------------------------


def _sdist(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    path = tmp_path / f"{name}-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-1.0/{member}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def _wheel(tmp_path: Path, name: str, requires: list[str]) -> Path:
    path = tmp_path / f"{name}-1.0-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-1.0.dist-info/METADATA", metadata)
    return path


def test_requirements_come_from_requires_txt_when_pkg_info_has_none(tmp_path):
    sdist = _sdist(tmp_path, "trainer", {
        "PKG-INFO": "Metadata-Version: 2.1\nName: trainer\nVersion: 1.0\n",
        "trainer.egg-info/requires.txt": 'six>=1.10\n\n[:python_version >= "3"]\ntabulate\n\n[gpu]\ntorch\n',
    })
    assert read_metadata(sdist) == ("trainer", ["six>=1.10", 'tabulate; python_version >= "3"'])


def test_requirements_from_pkg_info_and_wheels(tmp_path):
    sdist = _sdist(tmp_path, "trainer", {
        "PKG-INFO": "Metadata-Version: 2.2\nName: trainer\nVersion: 1.0\nRequires-Dist: helpers_lib>=1\n"
                    "Requires-Dist: six\n",
    })
    wheel = _wheel(tmp_path, "helpers_lib", ["six", "tabulate==0.9.0"])
    # helpers-lib is provided by the packages themselves: only the rest comes from an index.
    assert requirements_for([wheel, sdist]) == ["six", "tabulate==0.9.0"]
    assert canonical_name("Helpers_Lib.x") == "helpers-lib-x"


def test_the_built_sample_declares_its_dependency(tmp_path):
    sdist = build_sdist(WITH_DEPENDENCY, tmp_path)
    assert read_metadata(sdist.path) == ("trainer", ["tabulate>=0.8"])


def test_unreadable_package_is_one_line(tmp_path):
    bogus = tmp_path / "bogus-1.0.tar.gz"
    bogus.write_bytes(b"not an archive")
    with pytest.raises(ValidationError) as caught:
        read_metadata(bogus)
    assert "\n" not in str(caught.value) and "bogus-1.0.tar.gz" in str(caught.value)


# -- resolving (the host's pip, its configured index) ----------------------------------------------


def test_no_requirements_no_wheelhouse(tmp_path):
    sdist = build_sdist(SAMPLE, tmp_path)
    assert resolve([sdist.path], tmp_path / "cache", "3.11") == []
    assert not (tmp_path / "cache" / "wheelhouses").exists()


def test_wheelhouse_is_resolved_once_and_cached(tmp_path):
    sdist = build_sdist(WITH_DEPENDENCY, tmp_path)
    wheels = resolve([sdist.path], tmp_path / "cache", "3.11")
    assert [w.name.split("-")[0] for w in wheels] == ["tabulate"]
    assert wheels[0].name.endswith("-py3-none-any.whl")
    mtime = wheels[0].stat().st_mtime_ns
    assert resolve([sdist.path], tmp_path / "cache", "3.11") == wheels
    assert wheels[0].stat().st_mtime_ns == mtime


def test_unresolvable_dependency_is_one_line(tmp_path):
    wheel = _wheel(tmp_path, "trainer", ["aiptrain-no-such-project-xyz==1.0"])
    with pytest.raises(ValidationError) as caught:
        resolve([wheel], tmp_path / "cache", "3.11")
    message = str(caught.value)
    assert "\n" not in message
    assert "Python 3.11" in message and "aiptrain-no-such-project-xyz" in message and "--packages" in message
    assert not any((tmp_path / "cache" / "wheelhouses").iterdir())


# -- replicas install from the wheelhouse, offline -------------------------------------------------


def test_dry_run_installs_with_no_index_from_the_wheelhouse(cli, tmp_path):
    result = cli(
        "jobs", "submit", "training", "dep_plan", "--package-path", str(WITH_DEPENDENCY),
        "--module-name", "trainer.task", "--job-dir", str(tmp_path / "out"), "--runtime-version", "minimal",
        "--dry-run", check_code=0,
    )
    container = yaml.safe_load(result.stdout)["containers"][0]
    assert container["env"]["AIPTRAIN_WHEELHOUSE"] == "/opt/aiptrain/packages/wheelhouse"
    script = container["command"][2]
    assert "--no-index" in script and "--no-deps" in script and "$AIPTRAIN_WHEELHOUSE/*.whl" in script


def test_requirements_served_by_the_runtime_image_are_not_resolved_again(tmp_path):
    from aiptrain.runtimes import runtime
    from aiptrain.wheelhouse import requirements_for

    package = trainer_with_setup_py(tmp_path / "tfjob", (
        "from setuptools import setup\n"
        "setup(name='trainer', packages=['trainer'], install_requires=['tensorflow>=2', 'pandas', 'tabulate'])\n"
    ))
    sdist = build_sdist(package, tmp_path).path
    assert requirements_for([sdist], runtime("2.11").provides) == ["tabulate"]
    assert requirements_for([sdist], runtime("minimal").provides) == ["tensorflow>=2", "pandas", "tabulate"]


def test_a_wheel_that_does_not_build_costs_only_the_wheel(tmp_path):
    """The wheel beside the sdist is an extra (aiptrain.installs): its failure leaves the sdist."""
    package = trainer_with_setup_py(tmp_path / "src", (
        "from setuptools import setup\n"
        "from setuptools.command.build_py import build_py\n"
        "class Refuse(build_py):\n"
        "    def run(self):\n"
        "        raise SystemExit('no wheel here')\n"
        "setup(name='trainer', version='0.1', packages=['trainer'], cmdclass={'build_py': Refuse})\n"
    ))
    out = tmp_path / "out"
    out.mkdir()
    built = build_sdist(package, out, wheel_dir=out)
    assert built.path.name == "trainer-0.1.tar.gz" and built.path.is_file() and built.wheel is None
