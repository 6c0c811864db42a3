"""How a trainer's requirements meet its runtime image (aiptrain/dependencies.py): served by the
image, pinned over it, or resolved within it; pip's conflicts let go or reported in one line.
Pure: no pip, no Docker."""

from __future__ import annotations

import pytest

from aiptrain.dependencies import (
    Conflict,
    Image,
    Resolution,
    conflict_message,
    parse_conflict,
    plan,
    release,
    to_install,
)

IMAGE = Image("2.11", {
    "tensorflow-cpu": "2.11.0", "keras": "2.11.0", "pandas": "1.3.5", "numpy": "1.23.5", "protobuf": "3.19.6",
    "google-cloud-storage": "3.9.0", "google-auth": "2.43.0",
}, bounds=("numpy<1.24", "protobuf<3.20"))
HELD = tuple(f"{n}=={v}" for n, v in sorted(IMAGE.installed.items()))


def held_except(*names: str) -> tuple[str, ...]:
    return tuple(c for c in HELD if c.split("==")[0] not in names)


@pytest.mark.parametrize("requirements, wanted, constraints, pinned", [
    # Served by the image: nothing to install.
    (["tensorflow>=2", "pandas", "google-cloud-storage"], (), HELD + IMAGE.bounds, set()),
    (["TensorFlow_CPU==2.11.0", "Pandas<2"], (), HELD + IMAGE.bounds, set()),
    # Not in the image: resolved within everything the image holds.
    (["tabulate", "google-cloud-bigquery"], ("tabulate", "google-cloud-bigquery"), HELD + IMAGE.bounds, set()),
    # The trainer's pin wins; `tensorflow` is served by the image's tensorflow-cpu build.
    (["tensorflow==2.8.0"], ("tensorflow-cpu==2.8.0",), held_except("tensorflow-cpu") + IMAGE.bounds,
     {"tensorflow-cpu"}),
    (["pandas==1.4.1", "tabulate"], ("pandas==1.4.1", "tabulate"), held_except("pandas") + IMAGE.bounds, {"pandas"}),
    # Pinning past a bound lets go of the bound too.
    (["protobuf>=4"], ("protobuf>=4",), held_except("protobuf") + ("numpy<1.24",), {"protobuf"}),
    # Extras need more than the image holds: resolved, the image's release held.
    (["google-auth[pyopenssl]"], ("google-auth[pyopenssl]",), HELD + IMAGE.bounds, set()),
    # Markers are the replicas' (Python 3.9), not this host's.
    (['importlib-metadata; python_version < "3.10"', 'tomli; python_version >= "3.11"'],
     ("importlib-metadata",), HELD + IMAGE.bounds, set()),
])
def test_requirements_are_served_pinned_or_resolved_within_the_image(requirements, wanted, constraints, pinned):
    resolution = plan(requirements, IMAGE, "3.9")
    assert resolution == Resolution(wanted, constraints, frozenset(pinned))


def test_an_image_that_did_not_record_its_versions_serves_its_names_whatever_they_ask():
    image = Image("2.11", {"tensorflow-cpu": "2.11.0", "google-cloud-storage": None}, ())
    assert plan(["google-cloud-storage>=99", "tensorflow<2.9"], image, "3.9") == Resolution(
        ("tensorflow-cpu<2.9",), (), frozenset({"tensorflow-cpu"}))


def test_a_custom_container_holds_nothing():
    assert plan(["tensorflow==2.8.0"], Image("custom"), "3.9") == Resolution(("tensorflow==2.8.0",), (), frozenset())


PIP_CONFLICT = """\
Collecting tensorflow-cpu==2.8.0
ERROR: Cannot install tensorflow-cpu==2.8.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    tensorflow-cpu 2.8.0 depends on keras<2.9 and >=2.8.0rc0
    The user requested (constraint) keras==2.11.0

Additionally, some packages in these conflicts have no matching distributions available for your environment:
    keras

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/
"""

NEW_LIBRARY_CONFLICT = """\
The conflict is caused by:
    The user requested oldlib==1.0
    oldlib 1.0 depends on protobuf>=4
    The user requested (constraint) numpy<1.24,==1.23.5
    The user requested (constraint) protobuf<3.20,==3.19.6

"""


def test_pips_conflict_is_parsed_into_its_constraints_and_causes():
    assert parse_conflict(PIP_CONFLICT) == Conflict(
        ("keras",), ("tensorflow-cpu 2.8.0 depends on keras<2.9 and >=2.8.0rc0",
                     "The user requested (constraint) keras==2.11.0"))
    assert parse_conflict("ERROR: No matching distribution found for nothing") is None


def test_a_pinned_framework_moves_the_releases_its_dependencies_need():
    resolution = plan(["tensorflow==2.8.0"], IMAGE, "3.9")
    released = release(resolution, parse_conflict(PIP_CONFLICT))
    assert released.requirements == ("tensorflow-cpu==2.8.0",)
    assert "keras==2.11.0" not in released.constraints and "numpy==1.23.5" in released.constraints
    assert released.pinned == {"tensorflow-cpu", "keras"}


def test_without_a_pin_a_conflict_with_the_image_is_real_and_one_line():
    resolution = plan(["oldlib==1.0"], IMAGE, "3.9")
    conflict = parse_conflict(NEW_LIBRARY_CONFLICT)
    assert release(resolution, conflict) is None
    message = conflict_message(conflict, IMAGE)
    assert message == (
        "The trainer's requirements conflict with runtime 2.11's image: oldlib==1.0; oldlib 1.0 requires protobuf>=4; "
        "runtime 2.11 holds numpy 1.23.5; runtime 2.11 holds protobuf 3.19.6. Require a version that fits, or pin "
        "numpy, protobuf in install_requires to install that release over the image's."
    )
    assert "\n" not in message


def test_a_bound_alone_is_never_let_go():
    resolution = plan(["tensorflow==2.8.0"], IMAGE, "3.9")
    conflict = Conflict(("numpy",), ("x 1 depends on numpy>=1.24", "The user requested (constraint) numpy<1.24"))
    resolution = Resolution(resolution.requirements, ("numpy<1.24",), resolution.pinned)
    assert release(resolution, conflict) is None


def test_only_what_the_image_lacks_is_installed():
    resolved = {"tensorflow-cpu": "2.8.0", "keras": "2.8.0", "numpy": "1.23.5", "tf-estimator-nightly": "2.8.0.dev1"}
    assert to_install(resolved, IMAGE) == {"tensorflow-cpu": "2.8.0", "keras": "2.8.0", "tf-estimator-nightly": "2.8.0.dev1"}


def test_an_image_is_what_its_label_recorded_else_the_catalogs_pins():
    from aiptrain.runtimes import held_by, runtime

    recorded = held_by(runtime("2.11"), ["tensorflow-cpu==2.11.0", "Google_Auth==2.43.0"])
    assert recorded == Image("2.11", {"tensorflow-cpu": "2.11.0", "google-auth": "2.43.0"}, ("numpy<1.24", "protobuf<3.20"))
    unlabelled = held_by(runtime("2.11"), [])
    assert unlabelled.installed["tensorflow-cpu"] == "2.11.0" and unlabelled.installed["google-cloud-storage"] is None
    assert "numpy" not in unlabelled.installed
    # The pin is not dropped on an unlabelled image either.
    assert plan(["tensorflow==2.8.0"], unlabelled, "3.9").requirements == ("tensorflow-cpu==2.8.0",)
    assert held_by(runtime("2.11", mapped={"2.11": {"image": "team/tf", "python": "3.9"}}), []).installed == {}


def test_a_requirement_pip_cannot_read_is_one_line():
    from aiptrain.errors import ValidationError

    with pytest.raises(ValidationError) as caught:
        plan(["tensorflow ==> 2"], IMAGE, "3.9")
    assert str(caught.value).startswith("The packages require [tensorflow ==> 2], which pip cannot read (")
