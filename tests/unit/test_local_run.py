"""`aiptrain local run`'s pure parts: gcloud's checks of its flags, the Dockerfile it builds, the
digest that decides whether to build again, and the CustomJobSpec it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiptrain.errors import ValidationError
from aiptrain.vertex.local_run import (
    IMAGE_REPOSITORY,
    WHEELHOUSE,
    LocalRunArgs,
    build_context,
    dockerfile,
    image_digest,
    image_name,
    job_spec,
    validate,
)

IMAGE = "aiptrain/runtime:2.11"


@pytest.fixture
def work_dir(tmp_path) -> Path:
    """gcloud's example layout: my_training/task.py, dataset/, dep/foo.tar.gz, run.sh."""
    (tmp_path / "my_training" / "__pycache__").mkdir(parents=True)
    (tmp_path / "my_training" / "task.py").write_text("print('training')\n")
    (tmp_path / "my_training" / "__pycache__" / "task.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "small.dat").write_text("1,2\n")
    (tmp_path / "dep").mkdir()
    (tmp_path / "dep" / "foo-0.1.tar.gz").write_bytes(b"sdist")
    (tmp_path / "run.sh").write_text("echo hi\n")
    return tmp_path


def args(work_dir: Path, **given) -> LocalRunArgs:
    return LocalRunArgs(executor_image_uri=IMAGE, local_package_path=str(work_dir), **given)


REFUSED = [
    ("no such script", {"script": "my_training/nope.py"},
     "--script: File 'my_training/nope.py' is not found under the package"),
    ("no such module", {"python_module": "my_training.nope"},
     "--python-module: File 'my_training/nope.py' is not found under the package"),
    ("a script outside the work dir", {"script": "../elsewhere.py"}, "--script: '../elsewhere.py' is outside the package"),
    ("no such package", {"script": "run.sh", "extra_packages": ("dep/bar.whl",)},
     "--extra-packages: Package file 'dep/bar.whl' is not found"),
    ("no such directory", {"script": "run.sh", "extra_dirs": ("config",)}, "--extra-dirs: Directory 'config' is not found"),
    ("build flags without a script", {"requirements": ("pandas",), "extra_dirs": ("dataset",)},
     r"One of \[--script, --python-module\] must be supplied.*remove flags \[--extra-dirs, --requirements\]"),
    ("a bad image name", {"script": "run.sh", "output_image_uri": "Not An Image"}, "--output-image-uri: Invalid image name"),
    ("negative workers", {"worker_count": -1}, "--worker-count must be 0 or more"),
    ("no key file", {"service_account_key_file": "/nonexistent/key.json"}, "--service-account-key-file: File"),
]


@pytest.mark.parametrize("given, message", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_flags_gcloud_refuses_are_refused_in_one_line(work_dir, given, message):
    with pytest.raises(ValidationError, match=message) as refused:
        validate(args(work_dir, **given))
    assert "\n" not in str(refused.value)


def test_a_missing_work_dir_is_refused(tmp_path):
    with pytest.raises(ValidationError, match="--local-package-path: Directory '.*' is not found"):
        validate(args(tmp_path / "nope"))


@pytest.mark.parametrize("given", [
    {},  # the executor image runs as it is
    {"python_module": "my_training.task", "requirements": ("pandas",), "extra_packages": ("dep/foo-0.1.tar.gz",),
     "extra_dirs": ("dataset",), "output_image_uri": "me/trainer:1"},
])
def test_what_gcloud_accepts_is_accepted(work_dir, given):
    assert validate(args(work_dir, **given)) is None  # raises ValidationError for anything gcloud refuses


def test_the_dockerfile_is_gcloud_s_with_offline_installs(work_dir):
    text = dockerfile(args(work_dir, python_module="my_training.task", extra_dirs=("dataset",)), IMAGE,
                      ["six-1.17.0-py2.py3-none-any.whl", "foo-0.1.tar.gz"])
    assert text.splitlines() == [
        f"FROM {IMAGE}",
        "RUN mkdir -m 777 -p /usr/app /home",
        "WORKDIR /usr/app",
        "ENV HOME=/home PYTHONDONTWRITEBYTECODE=1 PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore",
        f'COPY ["{WHEELHOUSE}", "/tmp/{WHEELHOUSE}"]',
        "RUN python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir "
        "--disable-pip-version-check --no-warn-script-location "
        f"/tmp/{WHEELHOUSE}/six-1.17.0-py2.py3-none-any.whl /tmp/{WHEELHOUSE}/foo-0.1.tar.gz && rm -rf /tmp/{WHEELHOUSE}",
        'COPY ["dataset", "dataset"]',
        'COPY ["my_training", "my_training"]',
        'ENTRYPOINT ["python3", "-m", "my_training.task"]',
    ]


@pytest.mark.parametrize("given, copied, entrypoint", [
    ({"script": "my_training/task.py"}, 'COPY ["my_training", "my_training"]',
     'ENTRYPOINT ["python3", "my_training/task.py"]'),
    ({"script": "run.sh"}, 'COPY [".", "."]', 'ENTRYPOINT ["/bin/bash", "run.sh"]'),
    ({"python_module": "task"}, 'COPY [".", "."]', 'ENTRYPOINT ["python3", "-m", "task"]'),
])
def test_the_entrypoint_and_what_is_copied(work_dir, given, copied, entrypoint):
    lines = dockerfile(args(work_dir, **given), IMAGE, []).splitlines()
    assert lines[-2:] == [copied, entrypoint] and not any("pip install" in line for line in lines)


def test_the_context_holds_what_the_dockerfile_copies_and_no_bytecode(work_dir):
    wheel = work_dir.parent / "six-1.17.0-py2.py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    context = build_context(args(work_dir, script="my_training/task.py", extra_dirs=("dataset",),
                                 extra_packages=("dep/foo-0.1.tar.gz",)), IMAGE, [wheel])
    assert [rel for rel, _ in context.files] == [
        f"{WHEELHOUSE}/foo-0.1.tar.gz", f"{WHEELHOUSE}/six-1.17.0-py2.py3-none-any.whl", "dataset/small.dat",
        "my_training/task.py"]


def test_the_digest_changes_with_what_the_image_is_made_of_and_only_then(work_dir):
    run = args(work_dir, python_module="my_training.task", extra_dirs=("dataset",))

    def digest(base_id: str = "sha256:1") -> str:
        return image_digest(build_context(run, IMAGE, []), base_id)

    first = digest()
    assert digest() == first
    (work_dir / "run.sh").write_text("echo changed, but not copied\n")
    assert digest() == first
    (work_dir / "dataset" / "small.dat").write_text("3,4\n")
    second = digest()
    assert second != first
    (work_dir / "my_training" / "task.py").chmod(0o755)
    assert digest() != second
    assert digest("sha256:2") != digest()  # another base image


def test_the_image_is_named_after_the_script_and_its_digest(work_dir):
    assert image_name(args(work_dir, python_module="my_training.task"), "ab" * 32) == \
        f"{IMAGE_REPOSITORY}/task:{'ab' * 8}"
    assert image_name(args(work_dir, script="My Script.sh"), "cd" * 32) == f"{IMAGE_REPOSITORY}/my-script:{'cd' * 8}"
    assert image_name(args(work_dir, script="run.sh", output_image_uri="me/trainer:1"), "ef" * 32) == "me/trainer:1"


def test_the_job_spec_runs_the_image_with_the_user_args(work_dir):
    assert job_spec(args(work_dir, user_args=("--epochs", "1")), "me/trainer:1") == {"workerPoolSpecs": [
        {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
         "containerSpec": {"imageUri": "me/trainer:1", "args": ["--epochs", "1"]}}]}


def test_workers_a_gpu_and_an_output_prefix(work_dir):
    spec = job_spec(args(work_dir, worker_count=2, gpu=True, base_output_dir="gs://b/out"), "me/trainer:1")
    machine = {"machineType": "n1-standard-4", "acceleratorType": "NVIDIA_TESLA_T4", "acceleratorCount": 1}
    assert spec == {
        "workerPoolSpecs": [
            {"machineSpec": machine, "replicaCount": "1", "containerSpec": {"imageUri": "me/trainer:1"}},
            {"machineSpec": machine, "replicaCount": "2", "containerSpec": {"imageUri": "me/trainer:1"}},
        ],
        "baseOutputDirectory": {"outputUriPrefix": "gs://b/out"},
    }


@pytest.mark.parametrize("uri, image, runtime", [
    ("us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-11.py310:latest", "aiptrain/runtime:2.11", "2.11"),
    ("us-docker.pkg.dev/vertex-ai/training/sklearn-cpu.1-0:latest", "aiptrain/runtime:2.11", "2.11"),
    ("example.com/team/trainer:1", "example.com/team/trainer:1", None),  # taken as it is
])
def test_prebuilt_executor_images_run_as_their_runtime(tmp_path, monkeypatch, uri, image, runtime):
    from aiptrain.settings import Settings
    from aiptrain.vertex.local_run import base_image

    monkeypatch.delenv("AIPTRAIN_IMAGE_REPOSITORY", raising=False)
    base, _ = base_image(LocalRunArgs(executor_image_uri=uri, local_package_path=str(tmp_path)),
                         Settings(home=tmp_path / "home"))
    assert (base.image, base.runtime_version) == (image, runtime)


def test_requirements_come_from_requirements_txt_and_setup_py(tmp_path):
    from aiptrain.vertex.local_run import _requirements_txt, setup_py_requirements

    (tmp_path / "requirements.txt").write_text("# pins\npandas==2.2  # the data\n\nsix\n")
    assert _requirements_txt(tmp_path / "requirements.txt") == ["pandas==2.2", "six"]
    (tmp_path / "requirements.txt").write_text("--index-url https://example.com\nsix\n")
    with pytest.raises(ValidationError, match=r"line \[--index-url https://example.com\]: pip options"):
        _requirements_txt(tmp_path / "requirements.txt")
    (tmp_path / "setup.py").write_text("from setuptools import setup\n"
                                       "setup(name='t', version='1', install_requires=['six>=1.0', 'attrs'],\n"
                                       "      extras_require={'x': ['numpy']})\n")
    assert setup_py_requirements(tmp_path) == ["six>=1.0", "attrs"]
    (tmp_path / "setup.py").write_text("raise SystemExit('broken setup')\n")
    with pytest.raises(ValidationError, match="setup.py failed .*broken setup"):
        setup_py_requirements(tmp_path)
