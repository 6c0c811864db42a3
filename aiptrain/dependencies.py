"""How a trainer's requirements meet its runtime image, as `pip install` on AI Platform met the
service's images: pure rules (aiptrain/wheelhouse.py runs pip with what they decide).

- A requirement that the image's installed release satisfies is served by the image: nothing
  is installed for it.
- One that the image does not satisfy (`tensorflow==2.8.0` on runtime 2.11, `pandas==1.4.1`)
  is the trainer's pin, and it wins, as it did on the service: that release is installed over
  the image's. `tensorflow` is served by the image's `tensorflow-cpu` build of the same release.
- Everything else resolves with the image's installed releases held as constraints, and its
  bounds (`numpy<1.24`, `protobuf<3.20`): a new library cannot move protobuf from under the
  image's TensorFlow.
- A held release that contradicts a dependency of what the trainer pinned (TensorFlow 2.8 needs
  keras 2.8) moves with the pin. Any other contradiction is a real conflict: one line naming
  both sides.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiptrain.errors import ValidationError

# The image's build that serves a requirement of another distribution of the same module.
SERVED_BY = {"tensorflow": "tensorflow-cpu"}


def canonical_name(name: str) -> str:
    """PEP 503: `Foo_Bar.baz` and `foo-bar-baz` are the same project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def replica_environment(python_version: str) -> dict[str, str]:
    """Marker values (PEP 508) for a replica: Linux, CPython `python_version`."""
    return {
        "python_version": python_version, "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython", "platform_python_implementation": "CPython",
        "sys_platform": "linux", "os_name": "posix", "platform_system": "Linux", "extra": "",
    }


@dataclass(frozen=True)
class Image:
    """What a runtime image holds: {canonical name: installed version, or None where unknown
    (an image built before it recorded them)}, and the bounds it was resolved within."""

    version: str  # the runtime version, for messages
    installed: Mapping[str, str | None] = field(default_factory=dict)
    bounds: tuple[str, ...] = ()


@dataclass(frozen=True)
class Resolution:
    """What pip is asked: the requirements to install, the constraints they resolve within, and
    the names the trainer's pins move off the image's releases."""

    requirements: tuple[str, ...]
    constraints: tuple[str, ...]
    pinned: frozenset[str] = frozenset()


def plan(requirements: list[str], image: Image, python_version: str) -> Resolution:
    from packaging.requirements import InvalidRequirement, Requirement

    environment = replica_environment(python_version)
    wanted, pinned = [], set()
    for text in requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise ValidationError(f"The packages require [{text}], which pip cannot read ({exc}): fix it in "
                                  "install_requires.") from None
        if requirement.marker and not requirement.marker.evaluate(environment):
            continue
        name = canonical_name(requirement.name)
        if name not in image.installed and SERVED_BY.get(name) in image.installed:
            name = SERVED_BY[name]
            requirement.name = name
            requirement.extras = set()
        if name in image.installed:
            version = image.installed[name]
            if version is None or requirement.specifier.contains(version, prereleases=True):
                if not requirement.extras:
                    continue  # served by the image
            else:
                pinned.add(name)
        requirement.marker = None
        if str(requirement) not in wanted:
            wanted.append(str(requirement))
    held = [f"{name}=={version}" for name, version in sorted(image.installed.items())
            if version is not None and name not in pinned]
    bounds = [b for b in image.bounds if _name(b) not in pinned]
    return Resolution(tuple(wanted), tuple(held + bounds), frozenset(pinned))


@dataclass(frozen=True)
class Conflict:
    """pip's ResolutionImpossible: the constraints it names and every cause it gives."""

    constrained: tuple[str, ...]  # canonical names of the constraints in the conflict
    causes: tuple[str, ...]  # "tensorflow-cpu 2.8.0 depends on keras<2.9 and >=2.8.0rc0", ...


_CONSTRAINT_CAUSE = re.compile(r"The user requested \(constraint\) ([A-Za-z0-9._-]+)")


def parse_conflict(pip_output: str) -> Conflict | None:
    lines = pip_output.splitlines()
    try:
        start = lines.index("The conflict is caused by:") + 1
    except ValueError:
        return None
    causes = []
    for line in lines[start:]:
        if not line.strip():
            break
        causes.append(line.strip())
    constrained = [canonical_name(m.group(1)) for c in causes if (m := _CONSTRAINT_CAUSE.match(c))]
    return Conflict(tuple(constrained), tuple(causes))


def release(resolution: Resolution, conflict: Conflict) -> Resolution | None:
    """The resolution with the held releases in `conflict` let go, when the trainer pinned
    something (its dependencies move with it); None when nothing may be let go: a real conflict."""
    releasable = set(conflict.constrained) & {_name(c) for c in resolution.constraints if "==" in c}
    if not resolution.pinned or not releasable:
        return None
    kept = tuple(c for c in resolution.constraints if not (_name(c) in releasable and "==" in c))
    return Resolution(resolution.requirements, kept, resolution.pinned | releasable)


def conflict_message(conflict: Conflict, image: Image) -> str:
    """One line: what the trainer's requirements need, against what the image holds."""
    def side(cause: str) -> str:
        match = _CONSTRAINT_CAUSE.match(cause)
        if match:
            name = canonical_name(match.group(1))
            version = image.installed.get(name)
            held = f"{name} {version}" if version else cause.removeprefix("The user requested (constraint) ")
            return f"runtime {image.version} holds {held}"
        return cause.removeprefix("The user requested ").replace("depends on", "requires")

    names = ", ".join(conflict.constrained) or "it"
    return (
        f"The trainer's requirements conflict with runtime {image.version}'s image: "
        f"{'; '.join(side(c) for c in conflict.causes)}. Require a version that fits, or pin {names} in "
        "install_requires to install that release over the image's."
    )


def to_install(resolved: Mapping[str, str], image: Image) -> dict[str, str]:
    """The resolved releases the image does not already hold."""
    return {name: version for name, version in resolved.items() if image.installed.get(name) != version}


def _name(requirement: str) -> str:
    return canonical_name(re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0])
