"""`aiptrain local run`: gcloud's `ai custom-jobs local-run` with the same flags, run through
aiptrain's own machinery rather than one bare `docker run`.

gcloud builds an image with `docker build --no-cache` at every run and starts one container
with no CLUSTER_SPEC, no AIP_* variables and no record of the run. Here:

- With --script or --python-module, an image is built as gcloud's Dockerfile builds it (the
  script's directory and --extra-dirs under WORKDIR /usr/app; requirements.txt, setup.py's
  requirements, --requirements and --extra-packages installed; the script or module as the
  ENTRYPOINT), except that the requirements are resolved on this host into the cached
  wheelhouse the jobs use (builds and replicas reach no package index here), and the build is
  skipped altogether when nothing it is made of changed: the image's label holds the digest of
  its Dockerfile, its base image and every file it copies.
- The image runs as a Vertex AI CustomJob of one replica (plus --worker-count workers in
  workerPoolSpecs[1]) through the controller, with Vertex's replica contract (CLUSTER_SPEC,
  TF_CONFIG, AIP_*_DIR under --base-output-dir, /gcs), recorded as a customJob that
  `aiptrain serve` lists.

Vertex AI's prebuilt executor images cannot be pulled here: they run as the runtime image that
holds their frameworks (aiptrain.vertex.images). `validate`, `dockerfile`, `image_digest` and
`job_spec` are pure; `prepare_image` and `submit` do the I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from docker.errors import ImageNotFound

from aiptrain import wheelhouse
from aiptrain.backends.engine import connect
from aiptrain.client import Client
from aiptrain.config import SubmitFlags
from aiptrain.dependencies import Image
from aiptrain.errors import EnvironmentNotReady, ValidationError
from aiptrain.runtimes import follow_build, image_contents, image_python, lookup, mapped
from aiptrain.settings import Settings
from aiptrain.validation import validate_image_reference
from aiptrain.vertex.images import executor, is_prebuilt
from aiptrain.vertex.records import CUSTOM_JOBS, JOB_PREFIX, VertexRecords, new_id
from aiptrain.vertex.resources import CustomJob
from aiptrain.vertex.translate import DEFAULT_MACHINE_TYPE, translate

WORKDIR, HOME = "/usr/app", "/home"  # gcloud's, in the image it builds
WHEELHOUSE = "aiptrain-wheelhouse"  # in the build context, and under /tmp while the image is built
DIGEST_LABEL = "aiptrain.local-run.digest"
IMAGE_REPOSITORY = "aiptrain-local-run"
GPU_TYPE = "NVIDIA_TESLA_T4"  # what --gpu records: one GPU, of whichever kind the engine has
SKIPPED = ("__pycache__", ".git")
BUILD_FLAGS = ("--requirements", "--extra-packages", "--extra-dirs", "--output-image-uri")


@dataclass(frozen=True)
class LocalRunArgs:
    executor_image_uri: str
    local_package_path: str  # absolute: gcloud's work dir
    python_module: str | None = None
    script: str | None = None
    requirements: tuple[str, ...] = ()
    extra_packages: tuple[str, ...] = ()
    extra_dirs: tuple[str, ...] = ()
    output_image_uri: str | None = None
    gpu: bool = False
    service_account_key_file: str | None = None
    user_args: tuple[str, ...] = ()
    worker_count: int = 0  # aiptrain's: workers beside the primary, in workerPoolSpecs[1]
    base_output_dir: str | None = None  # aiptrain's: baseOutputDirectory, whence AIP_MODEL_DIR
    display_name: str | None = None

    @property
    def builds(self) -> bool:
        return bool(self.script or self.python_module)

    @property
    def main_script(self) -> str | None:
        """The file that runs: --script, or --python-module as a path (`trainer.task` -> `trainer/task.py`)."""
        if self.script:
            return self.script
        return self.python_module.replace(".", "/") + ".py" if self.python_module else None

    def given_build_flags(self) -> list[str]:
        values = (self.requirements, self.extra_packages, self.extra_dirs, self.output_image_uri)
        return [flag for flag, value in zip(BUILD_FLAGS, values, strict=True) if value]


def validate(args: LocalRunArgs) -> None:
    """gcloud's checks of local-run's flags (command_lib/ai/custom_jobs/validation.py), one line
    each, plus aiptrain's own."""
    work_dir = Path(args.local_package_path)
    if not work_dir.is_dir():
        raise ValidationError(f"--local-package-path: Directory '{work_dir}' is not found.")
    if args.worker_count < 0:
        raise ValidationError(f"--worker-count must be 0 or more, not {args.worker_count}.")
    if args.service_account_key_file and not Path(args.service_account_key_file).is_file():
        raise ValidationError(f"--service-account-key-file: File '{args.service_account_key_file}' is not found.")
    if not args.builds:
        given = args.given_build_flags()
        if given:
            raise ValidationError(
                "One of [--script, --python-module] must be supplied: they are required to build a training "
                f"container image. Otherwise, please remove flags [{', '.join(sorted(given))}] to directly run "
                "the `executor-image-uri`.")
        return
    flag = "--script" if args.script else "--python-module"
    _under(work_dir, args.main_script or "", flag, "File", Path.is_file)
    for package in args.extra_packages:
        _under(work_dir, package, "--extra-packages", "Package file", Path.is_file)
    for directory in args.extra_dirs:
        _under(work_dir, directory, "--extra-dirs", "Directory", Path.is_dir)
    if args.output_image_uri:
        try:
            validate_image_reference(args.output_image_uri)
        except ValidationError as exc:
            raise ValidationError(f"--output-image-uri: {exc}") from None


def _under(work_dir: Path, relative: str, flag: str, what: str, exists: Callable[[Path], bool]) -> None:
    """A path the image copies: under the work dir (the build sees nothing else), and there."""
    path = (work_dir / relative).resolve()
    if not path.is_relative_to(work_dir.resolve()):
        raise ValidationError(f"{flag}: '{relative}' is outside the package '{work_dir}': only what is under "
                              "--local-package-path goes into the image.")
    if not exists(path):
        raise ValidationError(f"{flag}: {what} '{relative}' is not found under the package: '{work_dir}'.")


# -- the image ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildContext:
    """What `docker build` is given: the Dockerfile and the files it copies, by their path in the
    context (the work dir's layout; the wheelhouse under WHEELHOUSE)."""
    dockerfile: str
    files: tuple[tuple[str, Path], ...]


def dockerfile(args: LocalRunArgs, base_image: str, installs: list[str]) -> str:
    """gcloud's Dockerfile (command_lib/ai/docker/build.py), installing `installs` (file names in
    WHEELHOUSE: the resolved wheels, then --extra-packages) offline, without pip's index."""
    script = args.main_script or ""
    source = os.path.dirname(script) or "."
    lines = [
        f"FROM {base_image}",
        f"RUN mkdir -m 777 -p {WORKDIR} {HOME}",
        f"WORKDIR {WORKDIR}",
        # Keeps Python from writing .pyc files; pip may install beside the system's packages.
        f"ENV HOME={HOME} PYTHONDONTWRITEBYTECODE=1 PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore",
    ]
    if installs:
        wheelhouse = f"/tmp/{WHEELHOUSE}"
        files = " ".join(f"{wheelhouse}/{name}" for name in installs)
        lines += [
            f"COPY {json.dumps([WHEELHOUSE, wheelhouse])}",
            "RUN python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir "
            f"--disable-pip-version-check --no-warn-script-location {files} && rm -rf {wheelhouse}",
        ]
    lines += [f"COPY {json.dumps([directory, directory])}" for directory in args.extra_dirs]
    lines.append(f"COPY {json.dumps([source, source])}")
    if args.python_module:
        entrypoint = ["python3", "-m", args.python_module]
    else:
        entrypoint = (["python3"] if script.endswith(".py") else ["/bin/bash"]) + [script]
    lines.append(f"ENTRYPOINT {json.dumps(entrypoint)}")
    return "\n".join(lines) + "\n"


def build_context(args: LocalRunArgs, base_image: str, wheels: list[Path]) -> BuildContext:
    """The Dockerfile and the context's files: the wheels and --extra-packages, the extra dirs and
    the script's directory (bytecode and .git left out)."""
    work_dir = Path(args.local_package_path)
    packages = [work_dir / package for package in args.extra_packages]
    installs = [*wheels, *packages]
    files = [(f"{WHEELHOUSE}/{path.name}", path) for path in installs]
    source = os.path.dirname(args.main_script or "") or "."
    for directory in (*args.extra_dirs, source):
        files += [(rel, path) for rel, path in _walk(work_dir, directory)]
    unique = dict(files)  # a directory named twice (an extra dir holding the script) is copied once
    return BuildContext(dockerfile(args, base_image, [path.name for path in installs]), tuple(sorted(unique.items())))


def _walk(work_dir: Path, directory: str) -> Iterator[tuple[str, Path]]:
    top = (work_dir / directory).resolve()
    for root, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED)
        for name in sorted(names):
            path = Path(root) / name
            if name.endswith((".pyc", ".pyo")) or not (path.is_file() or path.is_symlink()):
                continue
            yield path.relative_to(work_dir.resolve()).as_posix(), path


def image_digest(context: BuildContext, base_image_id: str) -> str:
    """What the image is made of: its Dockerfile, its base image, and every file it copies (its
    path, whether it is executable, its content)."""
    digest = hashlib.sha256()

    def feed(*parts: str | bytes) -> None:
        for part in parts:
            data = part.encode() if isinstance(part, str) else part
            digest.update(len(data).to_bytes(8, "big") + data)

    feed(context.dockerfile, base_image_id)
    for rel, path in context.files:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            feed("link", rel, os.readlink(path))
            continue
        content = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                content.update(block)
        feed("file", rel, "x" if info.st_mode & 0o111 else "-", content.digest())
    return digest.hexdigest()


def image_name(args: LocalRunArgs, digest: str) -> str:
    """--output-image-uri, else a name of the script's and the digest's (gcloud generates one too)."""
    if args.output_image_uri:
        return args.output_image_uri
    stem = re.sub(r"[^a-z0-9._-]+", "-", Path(args.main_script or "trainer").stem.lower()).strip("._-") or "trainer"
    return f"{IMAGE_REPOSITORY}/{stem}:{digest[:16]}"


@dataclass(frozen=True)
class Base:
    """The image the run's image is built from (or that runs, without a build), and what a
    resolution of requirements needs to know of it."""
    image: str
    runtime_version: str | None  # an aiptrain runtime's (a prebuilt executor image's mapping)


def base_image(args: LocalRunArgs, settings: Settings) -> tuple[Base, str | None]:
    """The executor image as this machine has it: a Vertex AI prebuilt image runs as the runtime
    that holds its frameworks (with a note when that differs from its release); anything else is
    taken as it is."""
    uri = args.executor_image_uri
    runtimes = mapped(settings.home)
    if not (is_prebuilt(uri) or uri in runtimes):
        validate_image_reference(uri)
        return Base(uri, None), None
    try:
        found = executor(uri, runtimes)
    except ValidationError as exc:
        raise ValidationError(f"--executor-image-uri: {exc}") from None
    return Base(lookup(found.runtime_version, settings.home, "--executor-image-uri").image, found.runtime_version), \
        found.note


def prepare_image(args: LocalRunArgs, settings: Settings, say: Callable[[str], None]) -> str:
    """The image to run: the executor image itself without --script/--python-module; else the
    image built from the work dir, or the one built before from the same inputs."""
    base, note = base_image(args, settings)
    if note:
        say(note)
    api = connect(timeout=1800)
    base_id = _image_id(api, base.image)
    if base_id is None:
        hint = f"`aiptrain runtimes build {base.runtime_version}` builds it" if base.runtime_version else \
            "pull, load or build it first"
        raise EnvironmentNotReady(f"Image [{base.image}] (--executor-image-uri) is not on this Docker engine: {hint}.")
    if not args.builds:
        return base.image
    context = build_context(args, base.image, requirement_wheels(args, base, settings, api))
    digest = image_digest(context, base_id)
    name = image_name(args, digest)
    if _labels(api, name).get(DIGEST_LABEL) == digest:
        say(f"Reusing the training image [{name}]: nothing it is built from changed.")
        return name
    say(f"Building the training image [{name}] from [{base.image}].")
    _build(api, context, name, digest, say)
    say("A training image is built.")
    return name


def requirement_wheels(args: LocalRunArgs, base: Base, settings: Settings, api) -> list[Path]:
    """What the image needs installed beside its own packages for requirements.txt, setup.py,
    --requirements and --extra-packages, resolved on this host into the cached wheelhouse."""
    work_dir = Path(args.local_package_path)
    requirements = list(args.requirements)
    if (work_dir / "requirements.txt").is_file():
        requirements += _requirements_txt(work_dir / "requirements.txt")
    if (work_dir / "setup.py").is_file():
        requirements += setup_py_requirements(work_dir)
    packages = [work_dir / package for package in args.extra_packages]
    requirements += wheelhouse.requirements_for(packages) if packages else []
    if not requirements:
        return []
    if base.runtime_version:
        rt = lookup(base.runtime_version, settings.home, "--executor-image-uri")
        image, python = image_contents(rt, _labels(api, base.image)), rt.python
    else:
        image, python = Image(base.image), image_python(api, base.image)[0]
    return wheelhouse.resolve_requirements(list(dict.fromkeys(requirements)), settings.cache_dir, python, image)


def _requirements_txt(path: Path) -> list[str]:
    """Its requirement lines; pip's options (-r, -e, --index-url ...) are refused: nothing reaches
    an index or another file here."""
    found = []
    for line in path.read_text().splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise ValidationError(f"{path} line [{line}]: pip options are not followed here; list the "
                                  "requirements themselves (packages go in --extra-packages).")
        found.append(line)
    return found


def setup_py_requirements(work_dir: Path) -> list[str]:
    """setup.py's install_requires, as setuptools writes them (`setup.py egg_info` on this host)."""
    with tempfile.TemporaryDirectory(prefix="aiptrain-egg-info-") as out:
        done = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", out], cwd=work_dir,
                              capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise ValidationError(f"{work_dir / 'setup.py'} failed (`setup.py egg_info`): {last}")
        requires = next(Path(out).glob("*.egg-info/requires.txt"), None)
        return wheelhouse.parse_requires_txt(requires.read_text()) if requires else []


def _image_id(api, image: str) -> str | None:

    try:
        return api.inspect_image(image)["Id"]
    except ImageNotFound:
        return None


def _labels(api, image: str) -> dict[str, str]:

    try:
        return api.inspect_image(image).get("Config", {}).get("Labels") or {}
    except ImageNotFound:
        return {}


def _build(api, context: BuildContext, name: str, digest: str, say: Callable[[str], None]) -> None:
    with tempfile.TemporaryFile() as archive:
        with tarfile.open(fileobj=archive, mode="w") as tar:
            dockerfile_bytes = context.dockerfile.encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size, info.mode = len(dockerfile_bytes), 0o644
            tar.addfile(info, io.BytesIO(dockerfile_bytes))
            for rel, path in context.files:
                tar.add(str(path), arcname=rel, recursive=False, filter=_readable)
        archive.seek(0)
        stream = api.build(fileobj=archive, custom_context=True, tag=name, labels={DIGEST_LABEL: digest},
                           rm=True, forcerm=True, decode=True)
        follow_build(stream, f"the training image [{name}]", say)


def _readable(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Files as the replicas' user (not root, not the owner) can read them."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.mode & 0o111 else 0o644
    return info


# -- the run ---------------------------------------------------------------------------------------


def job_spec(args: LocalRunArgs, image: str) -> dict:
    """The CustomJobSpec that runs the image: the primary, and --worker-count workers."""
    machine: dict = {"machineType": DEFAULT_MACHINE_TYPE}
    if args.gpu:
        machine.update(acceleratorType=GPU_TYPE, acceleratorCount=1)
    container = {"imageUri": image, **({"args": list(args.user_args)} if args.user_args else {})}
    pools = [{"machineSpec": machine, "replicaCount": "1", "containerSpec": container}]
    if args.worker_count:
        pools.append({"machineSpec": machine, "replicaCount": str(args.worker_count), "containerSpec": container})
    spec: dict = {"workerPoolSpecs": pools}
    if args.base_output_dir:
        spec["baseOutputDirectory"] = {"outputUriPrefix": args.base_output_dir}
    return spec


@dataclass(frozen=True)
class Started:
    job_id: str  # the ml v1 job's, in the project
    name: str  # the customJob's resource name


def submit(args: LocalRunArgs, image: str, client: Client, report: Callable[[str], None]) -> tuple[Started, tuple[str, ...]]:
    """Run the image as a CustomJob through the controller, recorded as `aiptrain serve` records
    one; returns once its replicas run, with the notices to show."""
    display = args.display_name or f"local-run-{Path(args.main_script or image).stem}"
    resource = CustomJob.model_validate({"displayName": display, "jobSpec": job_spec(args, image)})
    assert resource.job_spec is not None
    numeric = new_id()
    job_id = JOB_PREFIX[CUSTOM_JOBS] + numeric
    translation = translate(job_id, numeric, resource.job_spec)
    submission = client.prepare(SubmitFlags(job_id=job_id, project=client.project), base=translation.job)
    credentials = None
    if args.service_account_key_file:
        if submission.gcs_root is not None:
            raise ValidationError(
                "--service-account-key-file: gs:// is kept on this machine (AIPTRAIN_GCS) and the replicas reach it "
                "as their project: drop the flag, or set AIPTRAIN_GCS=remote to use Cloud Storage with the key.")
        credentials = Path(args.service_account_key_file).resolve()
    submission = dataclasses.replace(submission, contract=translation.contract, rules=translation.rules,
                                     credentials_file=credentials,
                                     notices=submission.notices + translation.notices)
    location = client.settings.default_region
    records = VertexRecords(client.store)
    record = records.add(client.project, CUSTOM_JOBS, location, resource.to_resource(), numeric_id=numeric)
    try:
        client.submit(submission, report)
    except BaseException:
        records.delete(record)
        raise
    records.set_job_key(record, client.key(job_id))
    return Started(job_id, record.name), submission.notices
