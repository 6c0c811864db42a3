"""`aiptrain local run` on the engine: gcloud's `ai custom-jobs local-run` flags build an image of
the work dir (requirements resolved on this host, installed offline) and run it as a Vertex AI
CustomJob with the replica contract; a second run with nothing changed builds nothing; each run
is recorded as a customJob; a changed file builds again; a failing trainer fails the run."""

from __future__ import annotations

import json

from aiptrain.settings import Settings

from conftest import require_image, runtime_image

MINIMAL = runtime_image("minimal")
IMAGE = "aiptrain-test/local-run:contract"
TASK = """\
import json, os, sys
import six  # from --requirements: resolved on the host, installed in the image offline
spec = json.loads(os.environ["CLUSTER_SPEC"])
seen = {"task": spec["task"], "tf": json.loads(os.environ["TF_CONFIG"])["task"], "args": sys.argv[1:],
        "model": os.environ.get("AIP_MODEL_DIR"), "data": open("dataset/small.dat").read(), "cwd": os.getcwd(),
        "six": six.__version__}
print("SEEN " + json.dumps(seen), flush=True)
primary = spec["task"]["type"] == "workerpool0"
sys.exit(int(sys.argv[sys.argv.index("--exit") + 1]) if primary and "--exit" in sys.argv else 0)
"""


def seen_lines(stderr: str) -> dict[str, dict]:
    found = {}
    for line in stderr.splitlines():
        if "SEEN " in line:
            seen = json.loads(line.split("SEEN ", 1)[1])
            found[f"{seen['task']['type']}-{seen['task']['index']}"] = seen
    return found


def recorded_custom_jobs() -> list:
    from aiptrain.store import JobStore
    from aiptrain.vertex.records import CUSTOM_JOBS, VertexRecords

    with JobStore(Settings().store_path) as store:
        return VertexRecords(store).list(Settings().default_project, CUSTOM_JOBS, None)


def test_local_run_builds_once_and_runs_a_custom_job_with_the_contract(cli, gcs_home, docker_api, tmp_path):
    require_image(docker_api, MINIMAL)
    (tmp_path / "my_training").mkdir()
    (tmp_path / "my_training" / "task.py").write_text(TASK)
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "small.dat").write_text("1,2\n")
    flags = ("local", "run", "--executor-image-uri", MINIMAL, "--local-package-path", str(tmp_path),
             "--python-module", "my_training.task", "--requirements", "six", "--extra-dirs", "dataset",
             "--worker-count", "1", "--base-output-dir", "gs://local-run-b/out", "--output-image-uri", IMAGE)
    try:
        first = cli(*flags, "--", "--epochs", "1", timeout=600)
        assert first.returncode == 0, first.stderr[-5000:]
        assert "A training image is built." in first.stderr
        assert first.stdout.strip() == f"A local run is finished successfully using custom image: {IMAGE}."
        seen = seen_lines(first.stderr)
        assert sorted(seen) == ["workerpool0-0", "workerpool1-0"]
        assert seen["workerpool0-0"]["tf"] == {"type": "chief", "index": 0}
        assert seen["workerpool1-0"]["tf"] == {"type": "worker", "index": 0}
        for replica in seen.values():
            assert replica["args"] == ["--epochs", "1"] and replica["model"] == "gs://local-run-b/out/model/"
            assert replica["data"] == "1,2\n" and replica["cwd"] == "/usr/app" and replica["six"]

        again = cli(*flags, "--", "--epochs", "1", timeout=600)
        assert again.returncode == 0, again.stderr[-5000:]
        assert f"Reusing the training image [{IMAGE}]: nothing it is built from changed." in again.stderr
        assert "Step 1/" not in again.stderr

        (tmp_path / "dataset" / "small.dat").write_text("changed\n")
        failed = cli(*flags, "--", "--exit", "3", timeout=600)
        assert failed.returncode == 1 and "A training image is built." in failed.stderr, failed.stderr[-5000:]
        assert "The local run ended FAILED: The replica workerpool0-0 exited with a non-zero status of 3." in \
            failed.stderr
        assert seen_lines(failed.stderr)["workerpool0-0"]["data"] == "changed\n"
    finally:
        docker_api.remove_image(IMAGE, force=True)
    records = recorded_custom_jobs()
    assert len(records) == 3 and all(r.body["displayName"] == "local-run-task" and r.job_key for r in records)
