"""How a Kubernetes pod of an exported job learns its cluster as aiptrain's replicas do: every
pod runs BOOTSTRAP_PY before the replica's command, and it sets TF_CONFIG, CLUSTER_SPEC and
PyTorch's MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK exactly as planning.ClusterConfig.env
does (same keys, same order, json.dumps' defaults), the pods' DNS names standing for Docker's
hostnames. Used by the TrainJob (aiptrain.trainjob), whose JobSet pods know their names, and by
the TFJob (aiptrain.tfjob) of a job whose CLUSTER_SPEC names its task types its own way (a
Vertex AI job's contract), whose pods read the training operator's TF_CONFIG. Pure: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from aiptrain.planning import TF_PORT, ClusterConfig, ContainerSpec

# Reads AIPTRAIN_CLUSTER (cluster_variable: the roles as [task type, name, pods, first pod
# index], the primary's TF_CONFIG type, CLUSTER_SPEC's names of the task types, the port,
# TF_CONFIG's `job`). The hosts and the pod's own task come from the JobSet's and replicated
# job's names (downward API) and JOB_COMPLETION_INDEX in a JobSet's pod (`name` is the replicated
# job), else from the TF_CONFIG the training operator gives a TFJob's pod (`name` is its key there).
BOOTSTRAP_PY = """\
import json, os, sys
env = os.environ
spec = json.loads(env["AIPTRAIN_CLUSTER"])
names = spec["names"]
if "JOBSET_NAME" in env:
    jobset = env["JOBSET_NAME"]
    def hosts_of(name, count, first):
        return ["%s-%s-0-%d.%s" % (jobset, name, first + i, jobset) for i in range(count)]
    mine, pod = env["REPLICATED_JOB_NAME"], int(env["JOB_COMPLETION_INDEX"])
else:
    given = json.loads(env["TF_CONFIG"])
    def hosts_of(name, count, first):
        if name not in given["cluster"]:
            sys.exit("aiptrain: the training operator's TF_CONFIG lists no %s: use training-operator 1.5 or later" % name)
        return [address.rsplit(":", 1)[0] for address in given["cluster"][name]]
    mine, pod = given["task"]["type"], int(given["task"]["index"])
hosts, tf_cluster, cluster_spec, task = {}, {}, {}, None
for kind, name, count, first in spec["roles"]:
    hosts[kind] = hosts_of(name, count, first)
    addresses = ["%s:%d" % (host, spec["port"]) for host in hosts[kind]]
    if kind != "evaluator":
        tf_cluster[spec["primary"] if kind == "master" else kind] = addresses
    cluster_spec[names.get(kind, kind)] = addresses
    if name == mine and first <= pod < first + count:
        task = (kind, pod - first)
if task is None:
    sys.exit("aiptrain: pod %d of %s is no replica of AIPTRAIN_CLUSTER" % (pod, mine))
kind, index = task
def describe(cluster, task_type):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index},
                       "job": spec["job"], "environment": "cloud"})
env["TF_CONFIG"] = describe(tf_cluster, spec["primary"] if kind == "master" else kind)
env["CLUSTER_SPEC"] = describe(cluster_spec, names.get(kind, kind))
env["MASTER_ADDR"] = env.get("PET_MASTER_ADDR", hosts["master"][0])
env["MASTER_PORT"] = env.get("PET_MASTER_PORT", str(spec["port"]))
env["WORLD_SIZE"] = env.get("PET_NNODES", str(1 + len(hosts.get("worker", []))))
if kind in ("master", "worker"):
    env["RANK"] = env.get("PET_NODE_RANK", str(0 if kind == "master" else index + 1))
os.execvp(sys.argv[1], sys.argv[1:])
"""


@dataclass(frozen=True)
class Role:
    """One task type as pods: the name its pods go by (a JobSet's replicated job, a TFJob's
    replica type), its pods, and the first pod index it takes there."""

    task_type: str
    name: str
    count: int
    first: int = 0


def cluster_variable(cluster: ClusterConfig, roles: list[Role]) -> str:
    """AIPTRAIN_CLUSTER: what BOOTSTRAP_PY builds the variables from, the roles in the plan's
    order (TF_CONFIG's key order)."""
    return json.dumps({"primary": cluster.primary, "port": TF_PORT, "names": cluster.spec_names,
                       "roles": [[r.task_type, r.name, r.count, r.first] for r in roles], "job": cluster.job})


def bootstrap_command(spec: ContainerSpec, image_entrypoint: list[str] | None) -> list[str]:
    """`python3 -c BOOTSTRAP_PY` then the replica's command line: Docker's ENTRYPOINT (the
    plan's, else the image's) and CMD."""
    return ["python3", "-c", BOOTSTRAP_PY, *(spec.entrypoint or image_entrypoint or []), *spec.command]


def unknown_entrypoints(specs: list[ContainerSpec], entrypoints: dict[str, list[str]]) -> list[str]:
    """The images whose ENTRYPOINT the bootstrap must run but nobody told: custom images run
    without a command (no working dir set: not a runtime's) that the engine does not have."""
    return sorted({spec.image for spec in specs
                   if spec.entrypoint is None and spec.working_dir is None and spec.image not in entrypoints})


def unknown_entrypoint_warning(images: list[str]) -> str:
    return (f"The ENTRYPOINT of {', '.join(images)} is not known here (the image is not on this engine): the "
            "bootstrap runs the job's args as the command; put the image's ENTRYPOINT in front of them.")
