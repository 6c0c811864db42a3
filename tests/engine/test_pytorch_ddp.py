"""A PyTorch DDP trainer (sample_jobs/pytorch_ddp, gloo on CPU) as a CUSTOM job of 1 master +
2 workers on the Docker engine: `init_process_group("gloo")` finds its group from MASTER_ADDR,
MASTER_PORT, WORLD_SIZE and RANK alone (issue 8 part 8).

The replicas need torch: runtime pytorch-2.13's image (torch's CPU build, from the CPU wheel pip
is pointed at: PyPI has only the CUDA build, which needs GBs of nvidia-* wheels to import), built
once when missing or stale and kept, as `aiptrain runtimes build pytorch-2.13` builds it; the
trainer goes into a small image on top of it, built per session. The Vertex tests share it."""

import json
import shutil
import uuid

import pytest
import yaml

from aiptrain.runtime_catalog import PYTORCH, runtime
from aiptrain.runtimes import build_image, image_is_current

from conftest import REPO, job_resources, require_image

BUILD_CACHE = REPO / ".cache" / "runtime-build"  # the runtime builds' wheels, kept between sessions
TRAINER_DOCKERFILE = """\
FROM {image}
WORKDIR /opt/sample
COPY trainer trainer
ENTRYPOINT ["python3", "-m", "trainer.task"]
"""


def _build(docker_api, context, tag: str) -> None:
    for chunk in docker_api.build(path=str(context), tag=tag, rm=True, forcerm=True, decode=True):
        assert "error" not in chunk, chunk["error"]


@pytest.fixture(scope="session")
def torch_image(docker_api) -> str:
    """Runtime pytorch-2.13's image, built once when missing or stale, and kept."""
    rt = runtime(PYTORCH)
    require_image(docker_api, rt.base.image)
    if not image_is_current(rt):
        build_image(rt, BUILD_CACHE)
    return rt.image


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
