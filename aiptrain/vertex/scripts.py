"""The SDK's packaged scripts in containers of the user's own image, made to run offline. Pure.

`CustomJob.from_local_script(script_path=..., container_uri=IMAGE, requirements=[...])` with an
image that is not one of Vertex AI's prebuilt training images packages the script as an sdist
(`aiplatform_custom_trainer_script`, google/cloud/aiplatform/utils/source_utils.py), uploads it
to the staging bucket and gives each pool a containerSpec whose command installs it from the
bucket's Cloud Storage FUSE mount (google/cloud/aiplatform/jobs.py):

    sh -c "pip install --upgrade pip && pip3 install -q --user /gcs/BUCKET/...tar.gz
           && python3 -m aiplatform_custom_trainer_script.task [ARGS]"

Replicas here have no package index. Without one, pip retries the index for the upgrade of pip
and for each requirement until it gives up. With no index at all (PIP_NO_INDEX), the upgrade finds
pip already satisfied, the sdist builds with the image's own setuptools, and a requirement the
image already holds is satisfied by it; one it lacks fails the install with pip's one line, "No
matching distribution found for NAME": such requirements belong in the image, or the script on
a prebuilt image (pythonPackageSpec), whose requirements aiptrain resolves on this host.
"""

from __future__ import annotations

import re

from aiptrain.vertex.resources import ContainerSpec

SDK_LAUNCHER = re.compile(
    r"pip install --upgrade pip && pip3 install -q --user (?P<package>/gcs/\S+) && python3 -m (?P<module>\S+)"
    r"(?: .*)?", re.DOTALL,
)
# pip's settings for a replica with no package index. PIP_NO_BUILD_ISOLATION=0 *disables* build
# isolation (pip reads a --no-X option's variable as the value of X), so that pip builds the sdist
# with the image's setuptools instead of fetching one into an isolated environment.
OFFLINE_PIP = {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_BUILD_ISOLATION": "0"}


def launched_package(container: ContainerSpec) -> str | None:
    """The /gcs path of the package a container of the SDK's script launcher installs, else None."""
    command = container.command or []
    if len(command) != 3 or command[:2] != ["sh", "-c"]:
        return None
    match = SDK_LAUNCHER.fullmatch(command[2])
    return match["package"] if match else None


def offline_env(container: ContainerSpec) -> dict[str, str]:
    """The variables that let the SDK's script launcher install offline (none for other
    containers); the pool's own env, applied after them, wins."""
    return dict(OFFLINE_PIP) if launched_package(container) else {}
