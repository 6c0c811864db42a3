"""Every 2.x runtime's requirements resolve to wheels for its image's Python and platform, as
the image build resolves them (sdist-only dependencies such as wrapt 1.12.1, termcolor 1.1.0 and
cloudml-hypertune built into pure wheels on this host), without building any image: pip's
resolver with --dry-run --report, from the package index (CI reaches it)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor

import pytest
from packaging.requirements import Requirement

from aiptrain import wheelhouse
from aiptrain.runtime_catalog import GOOGLE_LIBRARIES, RUNTIMES

VERSIONS = [v for v in RUNTIMES if v.startswith("2.")]
# Each resolution is about half waiting for the index and half pip's own CPU (38 s, 19 s of it
# CPU, here): a few at once take the module from about 9 minutes to about 2. Each runs in a
# process of its own: pip's processes started from threads of the test process failed once in
# CI (execv: EFAULT, CPython 3.11.7, whose subprocess vforks with the GIL released).
RESOLVING_AT_ONCE = 4


@pytest.fixture(scope="module")
def resolutions(request) -> Iterator[dict[str, Future[dict[str, str]]]]:
    """The resolutions of the runtimes this run tests, started together: each test waits for its own."""
    selected = [item.callspec.params["version"] for item in request.session.items
                if getattr(item, "originalname", "") == test_the_runtimes_requirements_resolve_to_wheels_for_its_image.__name__]
    with ProcessPoolExecutor(max_workers=RESOLVING_AT_ONCE, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield {version: pool.submit(wheelhouse.resolve_versions, list(RUNTIMES[version].packages),
                                    RUNTIMES[version].python, wheelhouse.platform_tags("x86_64"), hint="")
               for version in selected}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_runtimes_requirements_resolve_to_wheels_for_its_image(version, resolutions):
    rt = RUNTIMES[version]
    resolved = resolutions[version].result()
    for package in rt.packages:
        requirement = Requirement(package)
        name = wheelhouse.canonical_name(requirement.name)
        assert name in resolved, f"{name} is not in runtime {version}'s resolution"
        assert requirement.specifier.contains(resolved[name], prereleases=True), (package, resolved[name])
    assert set(GOOGLE_LIBRARIES) <= set(resolved)


def test_the_check_covers_every_2x_runtime():
    assert VERSIONS == ["2.11", "2.10", "2.9", "2.8", "2.7", "2.6", "2.5", "2.4", "2.3", "2.2", "2.1"]
