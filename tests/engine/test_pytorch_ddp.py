"""A PyTorch DDP trainer (sample_jobs/pytorch_ddp, gloo on CPU) as a CUSTOM job of 1 master +
2 workers on the Docker engine: `init_process_group("gloo")` finds its group from MASTER_ADDR,
MASTER_PORT, WORLD_SIZE and RANK alone (issue 8 part 8).

The replicas need torch: `aiptrain-test/pytorch:latest` is the base image plus torch's CPU
build, installed from a wheelhouse the host downloads once into .cache/ (replicas cannot reach
a package index). torch is downloaded first without its dependencies, to check that pip found
the CPU build (a local wheel; PyPI has only the CUDA build, which needs GBs of nvidia-* wheels
to import), then its dependencies. The image is built once and kept; the trainer goes into a
small image on top of it, built per session."""

import json
import platform
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml

from aiptrain.runtimes import image_python
from aiptrain.settings import Settings
from aiptrain.wheelhouse import PLATFORM_TAGS, read_metadata, requirement_name

from conftest import REPO, job_resources, require_image
from conftest import _unavailable as unavailable

TORCH = "torch==2.13.0"
TORCH_IMAGE = "aiptrain-test/pytorch:latest"
WHEELHOUSE = REPO / ".cache" / f"pytorch-wheelhouse-{TORCH.replace('==', '-')}"
CUDA_ONLY = ("nvidia-", "triton", "cuda-")

INSTALL_STAGE_LABEL = "aiptrain-test.stage=pytorch-install"
TORCH_DOCKERFILE = """\
FROM {base} AS install
LABEL aiptrain-test.stage=pytorch-install
COPY wheelhouse /wheelhouse
RUN python3 -m pip install --no-index --find-links /wheelhouse --target /install --no-cache-dir \\
      --disable-pip-version-check --no-warn-script-location --break-system-packages torch
FROM {base}
COPY --from=install /install {site}
RUN python3 -c "import torch, torch.distributed; assert torch.distributed.is_gloo_available()"
"""
TRAINER_DOCKERFILE = """\
FROM {image}
WORKDIR /opt/sample
COPY trainer trainer
ENTRYPOINT ["python3", "-m", "trainer.task"]
"""


def _pip_download(destination: Path, *requirements: str, no_deps: bool = False) -> None:
    platforms = [arg for tag in PLATFORM_TAGS.get(platform.machine(), PLATFORM_TAGS["x86_64"])
                 for arg in ("--platform", tag)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
         "--implementation", "cp", "--python-version", "3.11", *platforms, *(["--no-deps"] if no_deps else []),
         "--dest", str(destination), *requirements],
        check=True,
    )


def torch_wheelhouse() -> Path:
    """torch and the dependencies a CPU import needs, downloaded once (kept in .cache/)."""
    if (WHEELHOUSE / "complete").is_file():
        return WHEELHOUSE
    WHEELHOUSE.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".pytorch-wheelhouse-", dir=WHEELHOUSE.parent))
    try:
        _pip_download(partial, TORCH, no_deps=True)
        _, requires = read_metadata(next(partial.glob("torch-*.whl")))
        if any(requirement_name(r).startswith(CUDA_ONLY) for r in requires):
            # PyPI's Linux wheel is the CUDA build: it does not import without ~3 GB of nvidia-*
            # wheels (tried: "libcudnn.so.9: cannot open shared object file"). A CPU build comes
            # only from a local wheel or download.pytorch.org, which pip must be pointed at.
            unavailable(f"pip resolves {TORCH} to a CUDA build here: give pip a CPU wheel "
                        "(PIP_FIND_LINKS=DIR holding torch-*+cpu-*.whl) to run the PyTorch test")
        needed = [r for r in requires if "extra ==" not in r]
        needed.append("numpy")  # optional for torch, but it warns at every start without it
        _pip_download(partial, *needed)
        (partial / "complete").write_text("\n".join([TORCH, *needed]))
        shutil.rmtree(WHEELHOUSE, ignore_errors=True)
        partial.rename(WHEELHOUSE)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return WHEELHOUSE


def _build(docker_api, context: Path, tag: str) -> None:
    for chunk in docker_api.build(path=str(context), tag=tag, rm=True, forcerm=True, decode=True):
        assert "error" not in chunk, chunk["error"]


@pytest.fixture(scope="session")
def torch_image(docker_api, tmp_path_factory) -> str:
    """Kept between sessions: built only when missing (`docker rmi` it to rebuild)."""
    import docker.errors

    try:
        docker_api.inspect_image(TORCH_IMAGE)
        return TORCH_IMAGE
    except docker.errors.ImageNotFound:
        pass
    base = Settings().base_image
    require_image(docker_api, base)
    context = tmp_path_factory.mktemp("pytorch-image")
    shutil.copytree(torch_wheelhouse(), context / "wheelhouse")
    _, site = image_python(docker_api, base)
    (context / "Dockerfile").write_text(TORCH_DOCKERFILE.format(base=base, site=site))
    _build(docker_api, context, TORCH_IMAGE)
    # The legacy builder keeps the install stage (and its wheelhouse) as an untagged image.
    for image in docker_api.images(filters={"dangling": True, "label": INSTALL_STAGE_LABEL}, quiet=True):
        docker_api.remove_image(image, force=True)
    return TORCH_IMAGE


@pytest.fixture(scope="module")
def ddp_image(docker_api, torch_image, tmp_path_factory):
    context = tmp_path_factory.mktemp("pytorch-ddp-image")
    shutil.copytree(REPO / "sample_jobs" / "pytorch_ddp" / "trainer", context / "trainer")
    (context / "Dockerfile").write_text(TRAINER_DOCKERFILE.format(image=torch_image))
    tag = f"aiptrain-test/pytorch-ddp:{uuid.uuid4().hex[:12]}"
    _build(docker_api, context, tag)
    yield tag
    docker_api.remove_image(tag, force=True)


def test_gloo_ddp_trainer_finds_its_group_from_the_environment(cli, home, docker_api, ddp_image, tmp_path):
    job_id = f"torch_ddp_{uuid.uuid4().hex[:8]}"
    job_dir = tmp_path / "ddp-out"
    result = cli(
        "jobs", "submit", "training", job_id, "--master-image-uri", ddp_image, "--region", "us-central1",
        "--scale-tier", "custom", "--master-machine-type", "n1-standard-4",
        "--worker-machine-type", "n1-standard-4", "--worker-count", "2",
        "--job-dir", str(job_dir), "--stream-logs", "--", "--steps", "50",
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    assert yaml.safe_load(result.stdout)["state"] == "SUCCEEDED"
    outcome = json.loads((job_dir / "result.json").read_text())
    assert outcome["world_size"] == 3 and outcome["rank_sum"] == 1 + 2 + 3, outcome
    assert outcome["weight"] == pytest.approx(3.0, abs=0.1) and outcome["bias"] == pytest.approx(1.0, abs=0.1)
    master = f"{job_id.replace('_', '-')}-master-0:2222"
    for rank in range(3):
        assert f"rank {rank} of 3: joined the group at {master}" in result.stderr, result.stderr[-3000:]
    assert job_resources(docker_api, job_id) == []
