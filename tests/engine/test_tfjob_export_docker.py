"""The TFJob and TrainJob exports of a job that ran on the real engine."""

from __future__ import annotations

import yaml

from aiptrain import tfjob
from aiptrain.planning import BOOTSTRAP


def test_export_of_a_real_basic_job(cli, submit_args, home):
    cli(*submit_args("tf_real"), "--stream-logs", check_code=0)
    result = cli("jobs", "export", "tf_real", "--format", "tfjob", check_code=0)
    manifest = tfjob.TFJob.model_validate(yaml.safe_load(result.stdout))
    chief = manifest.spec.tf_replica_specs[tfjob.ReplicaType.CHIEF].template["spec"]["containers"][0]
    assert chief["args"][:4] == ["sh", "-c", BOOTSTRAP, "trainer.task"] and chief["args"][-2] == "--job-dir"
    assert "local bucket" in result.stderr  # the default bucket is a directory of this machine
    # The default format: the TrainJob and its runtime, the same bootstrap and command in the pod.
    result = cli("jobs", "export", "tf_real", check_code=0)
    runtime, trainjob = yaml.safe_load_all(result.stdout)
    assert trainjob["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert node["containers"][0]["command"][3:7] == ["sh", "-c", BOOTSTRAP, "trainer.task"]
