"""The tuning sample's package: it reports its metric with cloudml-hypertune, which aiptrain
builds into the job's wheelhouse on the host (it is published only as an sdist)."""

from setuptools import find_packages, setup

setup(
    name="trainer",
    version="0.1.0",
    packages=find_packages(include=["trainer", "trainer.*"]),
    install_requires=["cloudml-hypertune"],
)
