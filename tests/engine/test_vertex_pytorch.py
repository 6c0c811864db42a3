"""A Vertex AI CustomJob on Google's prebuilt PyTorch executor image: a pythonPackageSpec naming
`pytorch-cpu.2-1.py310` runs its package on runtime pytorch-2.13 (torch's CPU build), and a DDP
trainer of 1 primary + 1 worker finds its gloo group from MASTER_ADDR, MASTER_PORT, WORLD_SIZE
and RANK alone, as Google's PyTorch samples do.

The runtime image is built once (`aiptrain runtimes build pytorch-2.13` would do the same) from
the torch CPU wheel pip is pointed at (PIP_FIND_LINKS), and kept; its wheelhouse is cached in
.cache/ across sessions."""

from __future__ import annotations

import json

from aiptrain.settings import Settings

from conftest import job_resources
from test_pytorch_ddp import torch_image  # noqa: F401 (a fixture)
from test_vertex_contract import job_key, sdk, server, staged_trainer  # noqa: F401 (server: a fixture)

PROJECT = "vertex-contract"  # test_vertex_contract's `server` and `sdk` serve this project
EXECUTOR = "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-1.py310:latest"

# A few DDP steps of a linear model; each rank writes what it saw under /gcs/BUCKET/ddp/RANK.json.
DDP_TASK = '''\
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")  # MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(dist.get_rank())
for _ in range(5):
    inputs = torch.randn(8, 4, generator=generator)
    loss = ((model(inputs) - inputs.sum(dim=1, keepdim=True)) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()  # DDP all-reduces the gradients: the ranks keep the same weights
    optimizer.step()
weights = [round(value, 6) for value in model.module.weight.detach().flatten().tolist()]
bucket = os.environ["AIP_MODEL_DIR"][len("gs://"):].split("/", 1)[0]
os.makedirs(f"/gcs/{bucket}/ddp", exist_ok=True)
with open(f"/gcs/{bucket}/ddp/{dist.get_rank()}.json", "w") as handle:
    json.dump({"rank": dist.get_rank(), "world": dist.get_world_size(), "weights": weights, "torch": torch.__version__,
               "env": {name: os.environ.get(name) for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK",
                                                               "CLUSTER_SPEC")}}, handle)
dist.barrier()  # both ranks done before the group goes: gloo aborts one whose peer left mid-teardown (exit 134)
dist.destroy_process_group()
'''


def test_a_ddp_package_on_the_prebuilt_pytorch_image_finds_its_group(server, docker_api, torch_image,  # noqa: F811
                                                                      tmp_path):
    _, package = staged_trainer(tmp_path, DDP_TASK)
    spec = {"executor_image_uri": EXECUTOR, "package_uris": [package],
            "python_module": "trainer.task"}

    job = sdk(server).CustomJob(
        display_name="torch-package",
        worker_pool_specs=[{"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
                            "python_package_spec": spec} for _ in range(2)],
        base_output_dir=f"gs://{PROJECT}-b/out",
    )
    job.run(sync=True)
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    root = Settings().gcs_root / f"{PROJECT}-b" / "ddp"
    ranks = {path.stem: json.loads(path.read_text()) for path in sorted(root.glob("*.json"))}
    assert sorted(ranks) == ["0", "1"]
    for rank, seen in ranks.items():
        env = seen["env"]
        assert seen["torch"] == "2.13.0+cpu"
        assert (seen["rank"], seen["world"]) == (int(env["RANK"]), int(env["WORLD_SIZE"])) == (int(rank), 2)
        primary = json.loads(env["CLUSTER_SPEC"])["cluster"]["workerpool0"][0]
        assert f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" == primary
    assert ranks["0"]["weights"] == ranks["1"]["weights"]  # DDP kept the replicas in step
    assert job_resources(docker_api, job_key(job)) == []
