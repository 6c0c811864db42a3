"""A scikit-learn/XGBoost trainer. Both frameworks come with the TensorFlow runtime images,
as on AI Platform, so these requirements are served by the image and nothing is installed."""

from setuptools import find_packages, setup

setup(
    name="trainer",
    version="0.1.0",
    packages=find_packages(include=["trainer", "trainer.*"]),
    install_requires=["scikit-learn", "xgboost", "cloudml-hypertune"],
)
