"""gcloud's command line around aiptrain's: prefixes, gcloud-wide flags, --format, the shim,
and every flag of `jobs submit training` with its status (the table in docs/reference/flags.md, row by row)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from aiptrain.cli.formats import render
from aiptrain.cli.gcloud import GcloudUsageError, normalize

from conftest import REPO, SAMPLE_TRAINER

# --- argv normalisation (pure) ---------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["jobs", "list"], ["jobs", "list"]),
        (["ai-platform", "jobs", "list"], ["jobs", "list"]),
        (["ml-engine", "jobs", "list"], ["jobs", "list"]),
        (["beta", "ai-platform", "jobs", "list"], ["jobs", "list"]),
        (["alpha", "ml-engine", "local", "train"], ["local", "train"]),  # any group, present or future
        (["--quiet", "beta", "ml-engine", "jobs", "list"], ["jobs", "list"]),
        (["--project", "p", "ai-platform", "jobs", "describe", "j", "--format=json"], ["jobs", "describe", "j"]),
        (["beta", "jobs", "list"], ["beta", "jobs", "list"]),  # not gcloud's: click refuses it
        (["jobs", "submit", "training", "j", "--", "--project", "x", "-q"],
         ["jobs", "submit", "training", "j", "--", "--project", "x", "-q"]),  # the trainer's own
    ],
)
def test_prefixes_and_global_flags_are_taken_out(argv, expected):
    assert normalize(argv)[0] == expected


def test_global_flag_values_both_spellings_last_wins():
    _, flags = normalize(["--project=a", "jobs", "list", "--project", "b", "--format", "json", "-q",
                          "--verbosity=info", "--account", "me@example.com", "--no-log-http"])
    assert (flags.project, flags.format, flags.quiet, flags.verbosity) == ("b", "json", True, "info")
    assert flags.without_local_effect() == [
        "--account has no local effect: jobs run as the calling user, with no Google account.",
        "--log-http has no local effect: there is no HTTP traffic to log.",
    ]


def test_switches_take_an_explicit_boolean():
    _, flags = normalize(["jobs", "list", "--quiet=false", "--user-output-enabled=false"])
    assert flags.quiet is False and "--user-output-enabled" in flags.given
    assert normalize(["-q", "jobs"])[1].quiet is True


@pytest.mark.parametrize("argv, message", [
    (["jobs", "--log-http=maybe"], "argument --log-http: give true or false, not [maybe]"),
    (["jobs", "list", "--project"], "argument --project: expected one argument"),
    (["jobs", "list", "--format", "--", "x"], "argument --format: expected one argument"),
    (["--verbosity", "loud", "jobs"], "Invalid choice: 'loud'"),
    (["--project=", "jobs"], "argument --project: give a non-empty value"),
])
def test_malformed_global_flags(argv, message):
    with pytest.raises(GcloudUsageError, match=re.escape(message)):
        normalize(argv)


def test_flags_file_is_spliced_in_place(tmp_path):
    flags_file = tmp_path / "flags.yaml"
    flags_file.write_text("--region: europe-west1\n--packages: [a.tar.gz, b.tar.gz]\n--enable-web-access: true\n"
                          "--labels: {team: ml}\n--project: from-file\n")
    argv, flags = normalize(["jobs", "submit", "training", "j", "--flags-file", str(flags_file), "--", "x"])
    assert argv == ["jobs", "submit", "training", "j", "--region", "europe-west1", "--packages",
                    "a.tar.gz,b.tar.gz", "--enable-web-access", "--labels", "team=ml", "--", "x"]
    assert flags.project == "from-file"


# --- --format (pure) ---------------------------------------------------------------------------

RESOURCE = {"jobId": "j1", "state": "SUCCEEDED", "labels": {"a": "1"},
            "trainingInput": {"region": "us-central1", "args": ["--steps", "3"]}}


@pytest.mark.parametrize("spec, expected", [
    ("value(state)", "SUCCEEDED\n"),
    ("value(jobId,trainingInput.region)", "j1\tus-central1\n"),
    ("value(trainingInput.args,labels,missing)", "--steps;3\ta=1\t\n"),
    ("json(jobId)", '{\n  "jobId": "j1"\n}\n'),
    ("yaml(trainingInput.region)", "trainingInput:\n  region: us-central1\n"),
    ("none", ""),
])
def test_formats(spec, expected):
    assert render(RESOURCE, spec) == expected


def test_formats_of_lists():
    assert render([RESOURCE, {**RESOURCE, "jobId": "j2"}], "value(jobId)") == "j1\nj2\n"
    assert json.loads(render([RESOURCE], "json")) == [RESOURCE]
    assert render([], "json") == "[]\n"
    assert list(yaml.safe_load_all(render([RESOURCE, RESOURCE], "yaml"))) == [RESOURCE, RESOURCE]


# --- the CLI, in process (fast) ----------------------------------------------------------------


def test_every_prefix_reaches_the_same_command(run, package):
    submit = ["jobs", "submit", "training", "same", "--packages", str(package), "--module-name", "trainer.task",
              "--region", "us-central1", "--dry-run", "--", "--steps", "1"]
    outputs = {prefix: run(*prefix.split(), *submit) for prefix in
               ("", "ai-platform", "ml-engine", "beta ai-platform", "alpha ml-engine", "--quiet beta ml-engine")}
    assert {code for code, _, _ in outputs.values()} == {0}
    assert len({out for _, out, _ in outputs.values()}) == 1


def test_prefixed_help_and_unknown_flags(run):
    code, out, _ = run("beta", "ai-platform", "jobs", "--help")
    assert code == 0 and "submit" in out
    code, _, err = run("ml-engine", "jobs", "list", "--bogus")
    assert code == 2 and "No such option '--bogus'" in err
    code, out, _ = run("--help")
    assert code == 0 and "ai-platform" in out and "--project" in out
    assert out.count("ml-engine") == 1  # the prefixes are named once, not listed as commands


def test_list_formats(run):
    assert run("ai-platform", "jobs", "list", "--format=json") == (0, "[]\n", "")
    assert run("jobs", "list", "--format", "value(jobId)") == (0, "", "Listed 0 items.\n")  # nothing printed
    assert run("jobs", "list")[2] == "Listed 0 items.\n"


def test_verbosity_info_reports_flags_without_local_effect_once(cli):
    result = cli("--account", "a@example.com", "ml-engine", "jobs", "list", "--account=b@example.com",
                 "--verbosity", "info", "--billing-project", "p", "--log-http", check_code=0)
    info = [line for line in result.stderr.splitlines() if line.startswith("INFO:")]
    assert [line.split(" has")[0] for line in info] == ["INFO: --account", "INFO: --billing-project", "INFO: --log-http"]


# --- every flag of `jobs submit training`: where it lands (docs/reference/flags.md) ---------------

def _tf_job(plan: dict, index: int = 0) -> dict:
    return json.loads(plan["containers"][index]["env"]["TF_CONFIG"])["job"]


def _by_type(plan: dict, task_type: str) -> list[dict]:
    return [c for c in plan["containers"] if c["task_type"] == task_type]


CUSTOM = ["--scale-tier", "custom", "--master-machine-type", "n1-standard-8"]
IMAGE = ["--master-image-uri", "example.com/trainer:1"]
WORKERS = ["--worker-machine-type", "n1-standard-8", "--worker-count", "2"]
PS = ["--parameter-server-machine-type", "n1-highmem-8", "--parameter-server-count", "1"]

# flag -> (extra arguments, check of the dry-run plan and stderr). Rows that need files use
# {config}, {flags_file} and {package_path}, filled in by the test.
ACCEPTED = {
    "--config": (["--config", "{config}"], lambda p, e: len(p["containers"]) == 8),
    "--job-dir": (["--job-dir", "{job_dir}"], lambda p, e: p["containers"][0]["command"][-2:] == ["--job-dir", _tf_job(p)["job_dir"]]),
    "--labels": (["--labels", "team=ml"], None),  # on the job resource only: see test_labels_and_staging_bucket
    "--module-name": (["--module-name", "other.task"], lambda p, e: "other.task" in p["containers"][0]["command"]),
    "--package-path": (["--package-path", "{package_path}"],
                       lambda p, e: "trainer-0.0.0.tar.gz" in p["containers"][0]["env"]["AIPTRAIN_PACKAGES"]),
    "--packages": ([], lambda p, e: p["containers"][0]["env"]["AIPTRAIN_PACKAGES"].endswith("/trainer-0.1.tar.gz")),
    "--staging-bucket": (["--staging-bucket", "{bucket}"], None),  # see test_labels_and_staging_bucket
    "--region": (["--region", "europe-west4"], lambda p, e: _tf_job(p)["region"] == "europe-west4"),
    "--scale-tier": (["--scale-tier", "STANDARD_1"], lambda p, e: len(_by_type(p, "worker")) == 4),
    "--runtime-version": (["--runtime-version", "minimal"], lambda p, e: p["containers"][0]["image"] == "aiptrain/runtime:minimal"),
    "--python-version": (["--python-version", "3.7"], lambda p, e: _tf_job(p)["python_version"] == "3.7"),
    "--master-machine-type": (["--master-machine-type", "a2-highgpu-2g"],
                              lambda p, e: p["containers"][0]["gpus"] == 2 and _tf_job(p)["master_type"] == "a2-highgpu-2g"),
    "--master-accelerator": (CUSTOM + ["--master-accelerator", "type=nvidia-tesla-t4,count=2"],
                             lambda p, e: p["containers"][0]["gpus"] == 2),
    "--master-image-uri": (IMAGE, lambda p, e: p["containers"][0]["image"] == "example.com/trainer:1"
                           and p["containers"][0]["entrypoint"][:2] == ["sh", "-c"]),
    "--worker-machine-type": (CUSTOM + WORKERS, lambda p, e: len(_by_type(p, "worker")) == 2),
    "--worker-count": (CUSTOM + WORKERS, lambda p, e: _tf_job(p)["worker_count"] == "2"),
    "--worker-accelerator": (CUSTOM + WORKERS + ["--worker-accelerator", "type=nvidia-tesla-v100,count=1"],
                             lambda p, e: [c["gpus"] for c in _by_type(p, "worker")] == [1, 1]),
    "--worker-image-uri": (CUSTOM + WORKERS + IMAGE + ["--worker-image-uri", "example.com/worker:1"],
                           lambda p, e: _by_type(p, "worker")[0]["image"] == "example.com/worker:1"),
    "--parameter-server-machine-type": (CUSTOM + PS, lambda p, e: len(_by_type(p, "ps")) == 1),
    "--parameter-server-count": (CUSTOM + PS, lambda p, e: _tf_job(p)["parameter_server_count"] == "1"),
    "--parameter-server-accelerator": (CUSTOM + PS + ["--parameter-server-accelerator", "type=nvidia-tesla-p100,count=1"],
                                       lambda p, e: _by_type(p, "ps")[0]["gpus"] == 1),
    "--parameter-server-image-uri": (CUSTOM + PS + IMAGE + ["--parameter-server-image-uri", "example.com/ps:1"],
                                     lambda p, e: _by_type(p, "ps")[0]["image"] == "example.com/ps:1"),
    "--use-chief-in-tf-config": (IMAGE + ["--use-chief-in-tf-config", "true"],
                                 lambda p, e: '"type": "chief"' in p["containers"][0]["env"]["TF_CONFIG"]),
    "--service-account": (["--service-account", "sa@p.iam.gserviceaccount.com"],
                          lambda p, e: _tf_job(p)["service_account"] == "sa@p.iam.gserviceaccount.com"),
    "--enable-web-access": (["--enable-web-access"], lambda p, e: _tf_job(p)["enable_web_access"] is True),
    "--kms-key": (["--kms-key", "k", "--kms-keyring", "r", "--kms-location", "us", "--kms-project", "p"],
                  lambda p, e: _tf_job(p)["encryption_config"]["kms_key_name"]
                  == "projects/p/locations/us/keyRings/r/cryptoKeys/k"),
    "--kms-keyring": (["--kms-key", "k", "--kms-keyring", "r", "--kms-location", "us", "--project", "q"],
                      lambda p, e: "projects/q/locations/us/keyRings/r/" in _tf_job(p)["encryption_config"]["kms_key_name"]),
    "--kms-location": (["--kms-key", "projects/p/locations/eu/keyRings/r/cryptoKeys/k"],
                       lambda p, e: "/locations/eu/" in _tf_job(p)["encryption_config"]["kms_key_name"]),
    "--kms-project": (["--kms-key", "k", "--kms-keyring", "r", "--kms-location", "us", "--kms-project", "p"],
                      lambda p, e: _tf_job(p)["encryption_config"]["kms_key_name"].startswith("projects/p/")),
    "--network": (["--network", "projects/1/global/networks/n"],
                  lambda p, e: _tf_job(p)["network"] == "projects/1/global/networks/n"),
    "--async": (["--async"], lambda p, e: "--async flag is deprecated" in e),
    "--stream-logs": (["--stream-logs"], lambda p, e: True),  # a dry run has nothing to stream
    "--limit-resources": (["--limit-resources"], lambda p, e: p["containers"][0]["nano_cpus"] is not None),
    "--dry-run": ([], lambda p, e: "containers" in p),
    "--backend": (["--backend", "docker"], lambda p, e: "containers" in p),  # the same plan on every backend
    # gcloud-wide flags
    "--project": (["--project", "my-project"], lambda p, e: True),  # recorded at submit: see the Docker test
    "--format": (["--format", "json"], lambda p, e: True),  # the plan parsed as YAML is JSON too
    "--verbosity": (["--verbosity", "error"], lambda p, e: True),
    "--quiet": (["--quiet"], lambda p, e: True),
    "-q": (["-q"], lambda p, e: True),
    "--configuration": (["--configuration", "default"], lambda p, e: True),
    "--account": (["--account=me@example.com"], lambda p, e: True),
    "--impersonate-service-account": (["--impersonate-service-account", "sa@p.iam.gserviceaccount.com"], lambda p, e: True),
    "--billing-project": (["--billing-project", "p"], lambda p, e: True),
    "--log-http": (["--log-http"], lambda p, e: True),
    "--user-output-enabled": (["--no-user-output-enabled"], lambda p, e: True),
    "--trace-token": (["--trace-token", "t"], lambda p, e: True),
    "--access-token-file": (["--access-token-file", "/nonexistent"], lambda p, e: True),
    "--flags-file": (["--flags-file", "{flags_file}"], lambda p, e: _tf_job(p)["region"] == "asia-east1"),
}
REFUSED = {
    "--tpu-tf-version": (["--tpu-tf-version", "1.15"], "TPU workers, which aiptrain cannot emulate"),
    "--master-accelerator": (CUSTOM + ["--master-accelerator", "type=tpu-v3,count=8"], "TPUs cannot be emulated"),
    "--scale-tier": (["--scale-tier", "basic-tpu"], "BASIC_TPU needs a Cloud TPU"),
    "--master-machine-type": (["--master-machine-type", "cloud_tpu"], "Cloud TPU, which aiptrain cannot emulate"),
    "--kms-key": (["--kms-key", "k"], "Encryption key not fully specified."),
}


@pytest.fixture
def files(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("trainingInput:\n  scaleTier: STANDARD_1\n")
    flags_file = tmp_path / "flags.yaml"
    flags_file.write_text("--region: asia-east1\n")
    return {"config": config, "flags_file": flags_file, "package_path": SAMPLE_TRAINER,
            "job_dir": tmp_path / "out", "bucket": tmp_path / "bucket"}


def _submit(run, package, files, extra):
    args = [a.format(**files) for a in extra]
    return run("jobs", "submit", "training", "flags", "--packages", str(package), "--module-name", "trainer.task",
               "--region", "us-central1", "--dry-run", *args, "--", "--steps", "1")


@pytest.mark.parametrize("flag", sorted(ACCEPTED))
def test_accepted_flag_lands_where_the_table_says(flag, run, package, files):
    code, out, err = _submit(run, package, files, ACCEPTED[flag][0])
    assert code == 0, err
    check = ACCEPTED[flag][1]
    if check is not None:
        assert check(yaml.safe_load(out), err), out


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_refused_flag_says_why(flag, run, package, files):
    code, out, err = _submit(run, package, files, REFUSED[flag][0])
    assert code == 2 and REFUSED[flag][1] in err and not out


def test_labels_and_staging_bucket(home, package, tmp_path):
    from aiptrain.config import SubmitFlags
    from aiptrain.settings import Settings
    from aiptrain.submission import prepare

    submission = prepare(SubmitFlags(job_id="j", labels={"team": "ml"}, packages=[str(package)],
                                     module_name="m", staging_bucket=str(tmp_path / "b")), Settings())
    assert submission.job.labels == {"team": "ml"}
    assert submission.staging_bucket == str(tmp_path / "b")


def test_the_tables_cover_every_flag_and_the_reference_lists_them():
    from aiptrain.cli.gcloud import NO_LOCAL_EFFECT, SWITCHES, VALUE_FLAGS
    from aiptrain.cli.jobs import training

    flags = {opt for param in training.params for opt in param.opts if opt.startswith("-")}
    flags |= set(VALUE_FLAGS) | {"--flags-file", "-q"} | {s for s in SWITCHES if not s.startswith("--no-")}
    assert flags - set(ACCEPTED) - set(REFUSED) == set()
    reference = (REPO / "docs" / "reference" / "flags.md").read_text()
    table = reference[reference.index("## Flags of `jobs submit training`"):]
    table = table[:table.index("\n## ", 1)]
    rows = set(re.findall(r"^\| `(-[-\w]+)", table, re.MULTILINE))
    assert flags - rows == set() and set(NO_LOCAL_EFFECT) <= rows


# --- image and package together; the shim ------------------------------------------------------


def test_package_in_image_rules(home, package, tmp_path):
    from aiptrain.config import SubmitFlags
    from aiptrain.errors import ValidationError
    from aiptrain.settings import Settings
    from aiptrain.submission import prepare

    with pytest.raises(ValidationError, match="--module-name is required to run a package"):
        prepare(SubmitFlags(job_id="j", master_image_uri="img", packages=[str(package)]), Settings())
    config = tmp_path / "command.yaml"
    config.write_text("trainingInput:\n  masterConfig:\n    imageUri: img\n    containerCommand: [x]\n")
    with pytest.raises(ValidationError, match="cannot be combined with a package and --module-name"):
        prepare(SubmitFlags(job_id="j", config=str(config), packages=[str(package)], module_name="m"), Settings())


def test_package_uris_from_config_run_in_the_image(run, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("trainingInput:\n  pythonModule: trainer.task\n  packageUris: [gs://my-bucket/trainer-1.0.tar.gz]\n"
                      "  masterConfig:\n    imageUri: example.com/tf:2\n")
    code, out, err = run("jobs", "submit", "training", "cfg", "--config", str(config), "--dry-run")
    master = yaml.safe_load(out)["containers"][0]
    assert code == 0, err
    assert master["image"] == "example.com/tf:2" and master["command"] == ["trainer.task"]
    assert master["env"]["AIPTRAIN_PACKAGES"] == "/opt/aiptrain/packages/trainer-1.0.tar.gz"
    assert master["working_dir"] == "/tmp"


def test_shim_forwards_ai_platform_and_refuses_the_rest(home, tmp_path):
    bin_dir = tmp_path / "bin"
    install = subprocess.run([sys.executable, "-m", "aiptrain", "gcloud-shim", "install", str(bin_dir)],
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    assert f'export PATH="{bin_dir}:$PATH"' in install.stderr
    script = tmp_path / "pipeline.sh"
    script.write_text(f"""#!/bin/bash
set -euo pipefail
gcloud ai-platform jobs submit training shim_job --package-path {SAMPLE_TRAINER} --module-name trainer.task \\
    --region us-central1 --dry-run --format='value(containers.task_name)' -- --steps 1
gcloud ml-engine jobs list
gcloud --quiet beta ai-platform jobs list --format json
gcloud --project p ml-engine jobs submit training shim_job2 --packages {SAMPLE_TRAINER}/task.py \\
    --module-name trainer.task --master-machine-type e2-standard-4 --dry-run --format 'value(containers.task_name)'
if gcloud compute instances list; then exit 99; else echo "refused with $?"; fi
""")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": ""}
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["master-replica-0", "[]", "master-replica-0", "refused with 2"]
    refusal = [line for line in result.stderr.splitlines() if "gcloud compute" in line]
    assert refusal == ["ERROR: (gcloud) this `gcloud` is aiptrain's shim: it runs only `gcloud ai-platform ...`, "
                       "`gcloud ml-engine ...` and `gcloud storage ...`; run `gcloud compute instances` with the real "
                       "gcloud."]
    other = tmp_path / "other"
    other.mkdir()
    (other / "gcloud").write_text("#!/bin/sh\necho real gcloud\n")
    again = subprocess.run([sys.executable, "-m", "aiptrain", "gcloud-shim", "install", str(other)],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "is not aiptrain's shim" in again.stderr
    assert (other / "gcloud").read_text() == "#!/bin/sh\necho real gcloud\n"


