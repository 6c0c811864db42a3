"""Pure checks of user input: one clear ValidationError each."""

import pytest

from aiptrain.errors import ValidationError
from aiptrain.validation import (
    parse_duration_seconds,
    validate_job_id,
    validate_labels,
    validate_module_name,
    validate_package_path,
)


@pytest.mark.parametrize("job_id", ["a", "my_job_1", "A" + "b" * 127, "Job_With_CAPS"])
def test_valid_job_ids(job_id):
    assert validate_job_id(job_id) == job_id


@pytest.mark.parametrize(
    "job_id, problem",
    [
        ("1abc", "must start with a letter"),
        ("_abc", "must start with a letter"),
        ("a-b", "only letters, digits and underscores"),
        ("a b", "only letters, digits and underscores"),
        ("a" * 129, "129 characters long"),
        ("", "is empty"),
    ],
)
def test_invalid_job_ids_name_the_problem(job_id, problem):
    with pytest.raises(ValidationError, match=problem) as error:
        validate_job_id(job_id)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("module", ["trainer.task", "task", "_x.y_2"])
def test_valid_module_names(module):
    assert validate_module_name(module) == module


@pytest.mark.parametrize("module", ["", "trainer/task", "trainer.", "1trainer", "trainer.task.py-x"])
def test_invalid_module_names(module):
    with pytest.raises(ValidationError, match="--module-name"):
        validate_module_name(module)


def test_package_path_must_be_a_directory(tmp_path):
    with pytest.raises(ValidationError, match="is not a directory"):
        validate_package_path(str(tmp_path / "missing"))


def test_package_path_needs_init_py_with_gclouds_message(tmp_path):
    with pytest.raises(ValidationError) as error:
        validate_package_path(str(tmp_path))
    assert str(error.value) == (
        f"[{tmp_path}] is not a valid Python package because it does not contain an `__init__.py` file. "
        "Please create one and try again. Also, please ensure that --package-path refers to a local directory."
    )


def test_labels():
    assert validate_labels({"team": "ml-infra", "env": "ci_1"}) == {"team": "ml-infra", "env": "ci_1"}
    with pytest.raises(ValidationError, match="label key"):
        validate_labels({"Team": "x"})
    with pytest.raises(ValidationError, match="label value"):
        validate_labels({"team": "ML"})


def test_durations():
    assert parse_duration_seconds("7200s", "maxRunningTime") == 7200
    assert parse_duration_seconds("1.5s", "maxRunningTime") == 1.5
    with pytest.raises(ValidationError, match="7200s"):
        parse_duration_seconds("2h", "maxRunningTime")
