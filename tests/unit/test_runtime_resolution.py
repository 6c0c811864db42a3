"""Every 2.x runtime's requirements resolve to wheels for its image's Python and platform, as
the image build resolves them (sdist-only dependencies such as wrapt 1.12.1, termcolor 1.1.0 and
cloudml-hypertune built into pure wheels on this host), without building any image: pip's
resolver with --dry-run --report, from the package index (CI reaches it)."""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement

from aiptrain import wheelhouse
from aiptrain.runtime_catalog import GOOGLE_LIBRARIES, RUNTIMES

VERSIONS = [v for v in RUNTIMES if v.startswith("2.")]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_runtimes_requirements_resolve_to_wheels_for_its_image(version):
    rt = RUNTIMES[version]
    resolved = wheelhouse.resolve_versions(list(rt.packages), rt.python, wheelhouse.platform_tags("x86_64"), hint="")
    for package in rt.packages:
        requirement = Requirement(package)
        name = wheelhouse.canonical_name(requirement.name)
        assert name in resolved, f"{name} is not in runtime {version}'s resolution"
        assert requirement.specifier.contains(resolved[name], prereleases=True), (package, resolved[name])
    assert set(GOOGLE_LIBRARIES) <= set(resolved)


def test_the_check_covers_every_2x_runtime():
    assert VERSIONS == ["2.11", "2.10", "2.9", "2.8", "2.7", "2.6", "2.5", "2.4", "2.3", "2.2", "2.1"]
