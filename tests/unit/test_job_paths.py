"""JobPaths (aiptrain/jobpaths.py) against the home layout's record (docs/design/home-layout.md):
every path a job has is named once in code and listed once in the record, and the two agree.
The layout itself never moves: homes made by earlier releases keep working."""

import inspect
import re
from pathlib import Path

import pytest

from aiptrain.jobpaths import JobPaths
from aiptrain.settings import Settings

LAYOUT = Path(__file__).parents[2] / "docs" / "design" / "home-layout.md"
HOME = Path("/a/home")
# How the record writes what JobPaths' methods take.
PLACEHOLDERS = {"trial_id": "<trial>", "task_name": "<task>"}


def layout_paths() -> list[str]:
    """The paths of the record's table, as its first column writes them (`work/<key>/packages/`)."""
    decision = LAYOUT.read_text().split("\n## Decision\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in decision.splitlines() if line.startswith("| `")]
    return [path for row in rows for path in re.findall(r"`([^`]+)`", row)]


def documented_job_paths() -> set[str]:
    """The rows named by a job's key. (`logs/<job>.project`, left by releases before keys, is
    read once by the store's migration, by a glob over logs/: no job's file.)"""
    return {path.rstrip("/") for path in layout_paths() if "<key>" in path}


def named_paths() -> dict[str, str]:
    """Every path JobPaths names (its properties, and its methods with the record's
    placeholders as arguments), relative to the home as the record writes it."""
    paths = JobPaths(HOME, "<key>")
    named = {}
    for name, member in inspect.getmembers(JobPaths):
        if isinstance(member, property):
            value = getattr(paths, name)
        elif inspect.isfunction(member) and not name.startswith("_"):
            arguments = list(inspect.signature(member).parameters)[1:]
            value = member(paths, *(PLACEHOLDERS[argument] for argument in arguments))
        else:
            continue
        assert isinstance(value, Path), name
        named[name] = value.relative_to(HOME).as_posix()
    return named


def test_the_record_lists_the_job_paths_in_its_table():
    assert {"logs/<key>.jsonl", "locks/<key>.lock", "work/<key>"} <= documented_job_paths()


def test_every_path_jobpaths_names_is_in_the_record():
    """A directory the record lists only through what it holds (`work/<key>/trials/`) counts."""
    documented = documented_job_paths()
    with_parents = documented | {parent.as_posix() for path in documented for parent in Path(path).parents}
    missing = {name: path for name, path in named_paths().items() if path not in with_parents}
    assert not missing, f"add these to {LAYOUT.name}'s table: {missing}"


def test_every_job_path_the_record_lists_is_named_by_jobpaths():
    missing = documented_job_paths() - set(named_paths().values())
    assert not missing, f"JobPaths names none of {sorted(missing)}"


@pytest.mark.parametrize(("path", "expected"), [
    (lambda p: p.log, "logs/census_1.jsonl"),
    (lambda p: p.lock, "locks/census_1.lock"),
    (lambda p: p.work_dir, "work/census_1"),
    (lambda p: p.packages, "work/census_1/packages"),
    (lambda p: p.wheelhouse, "work/census_1/packages/wheelhouse"),
    (lambda p: p.plan_inputs, "work/census_1/plan-inputs.json"),
    (lambda p: p.contract, "contracts/census_1.json"),
    (lambda p: p.launch_started, "work/census_1/launch-started"),
    (lambda p: p.launched_dir, "work/census_1/launched"),
    (lambda p: p.launched("3"), "work/census_1/launched/3"),
    (lambda p: p.trials_dir, "work/census_1/trials"),
    (lambda p: p.trial_dir("3"), "work/census_1/trials/3"),
    (lambda p: p.metric_file("3", "master-replica-0"), "work/census_1/trials/3/master-replica-0.metrics"),
])
def test_a_job_s_files_are_where_homes_have_always_kept_them(path, expected):
    """Spelled out, not derived: a home made by an earlier release is read where it wrote."""
    assert path(JobPaths(HOME, "census_1")) == HOME / expected


def test_a_job_of_another_project_is_named_by_its_qualified_key():
    paths = Settings(home=HOME).job_paths("team-b--census_1")
    assert paths == JobPaths(HOME, "team-b--census_1")
    assert (paths.log, paths.lock, paths.work_dir) == (
        HOME / "logs/team-b--census_1.jsonl", HOME / "locks/team-b--census_1.lock", HOME / "work/team-b--census_1")


def test_the_home_s_directories_hold_the_jobs_files():
    settings = Settings(home=HOME)
    paths = settings.job_paths("census_1")
    assert (paths.log.parent, paths.lock.parent) == (settings.logs_dir, settings.locks_dir)
