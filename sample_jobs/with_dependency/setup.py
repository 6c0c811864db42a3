"""A trainer package with a dependency. `aiptrain jobs submit training ... --package-path
trainer/` builds it with this setup.py; aiptrain resolves `install_requires` on the host
into a wheelhouse, and each replica installs from it with no package index."""

from setuptools import find_packages, setup

setup(
    name="trainer",
    version="0.1.0",
    packages=find_packages(include=["trainer", "trainer.*"]),
    install_requires=["tabulate>=0.8"],
)
