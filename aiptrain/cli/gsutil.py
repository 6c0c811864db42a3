"""The `gsutil` that `aiptrain gcloud-shim install` writes beside its `gcloud` (whose
`gcloud storage` is the same commands, below): pipelines copy
their data to `gs://` before they submit (`gsutil mb gs://B`, `gsutil cp -r data gs://B/data`)
and read results after. Where gs:// paths are kept on this machine (AIPTRAIN_GCS=local, or no
Google credentials), those commands work on `$AIPTRAIN_HOME/gcs/BUCKET/PATH`, the directories
trainers see for the same URLs; with Cloud Storage, the real gsutil further on PATH runs.

The subset: `cp [-r] [-n] SRC... DST`, `mv`, `ls [-l] [-r] [URL...]`, `cat URL...`,
`rm [-r] [-f] URL...`, `mb [-l LOCATION] gs://B`, `rb gs://B`; top-level `-m` and `-q` are
accepted (`-o`/`-h` and their values too). Wildcards in gs:// URLs are expanded (`*`, `**`).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from pathlib import Path

import click

from aiptrain.errors import AiptrainError, ValidationError
from aiptrain.storage.local import give_to_replicas

EXIT_FAILED = 1  # gsutil's status for a failed command
TOP_LEVEL_VALUE_OPTIONS = ("-o", "-h", "-u")


class GsutilError(Exception):
    """A command that failed as gsutil reports it: `KIND: message` (CommandException by default), exit 1."""

    def __init__(self, message: str, kind: str = "CommandException"):
        super().__init__(f"{kind}: {message}")


def gcs_root() -> Path | None:
    from aiptrain.settings import Settings
    from aiptrain.storage import gcs_root_for

    settings = Settings()
    return gcs_root_for(settings.gcs_mode, settings.gcs_root)[0]


class LocalGcs:
    """gs:// URLs as paths under `root`, with gsutil's semantics for the commands above."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, url: str) -> Path:
        from aiptrain.storage import check_gcs_uri, local_gcs_path

        check_gcs_uri(url, kept_locally=True)
        return local_gcs_path(self.root, url) if url.rstrip("/").count("/") > 2 else self._bucket(url)

    def _bucket(self, url: str) -> Path:
        return self.root / url[len("gs://"):].strip("/")

    def url(self, path: Path) -> str:
        return "gs://" + path.relative_to(self.root).as_posix()

    def expand(self, url: str) -> list[Path]:
        """The paths a URL names, wildcards expanded; a URL that names nothing is an error."""
        if not url.startswith("gs://"):
            return [Path(url)]
        if "*" in url:
            matches = sorted(Path(p) for p in glob.glob(str(self._bucket(url)), recursive="**" in url))
            if not matches:
                raise GsutilError(f"No URLs matched: {url}")
            return matches
        path = self.path(url)
        if not path.exists():
            raise GsutilError(f"No URLs matched: {url}")
        return [path]

    def bucket_of(self, url: str) -> Path:
        bucket = self.root / url[len("gs://"):].split("/", 1)[0]
        if not bucket.is_dir():
            raise GsutilError(f"404 gs://{bucket.name} bucket does not exist.", "NotFoundException")
        return bucket

    # -- commands ----------------------------------------------------------------------

    def cp(self, sources: list[str], target: str, recursive: bool, no_clobber: bool, move: bool = False) -> None:
        if target.startswith("gs://"):
            self.bucket_of(target)
            destination = self.path(target)
        else:
            destination = Path(target)
        into = target.endswith("/") or destination.is_dir() or len(sources) > 1
        for source in sources:
            for path in self.expand(source):
                if path.is_dir() and not recursive:
                    raise GsutilError(f"Omitting directory \"{source}\". (Did you mean to do cp -r?)")
                final = destination / path.name if into else destination
                if no_clobber and final.exists():
                    continue
                final.parent.mkdir(parents=True, exist_ok=True)
                if path.is_dir():
                    shutil.copytree(path, final, dirs_exist_ok=True)
                else:
                    shutil.copyfile(path, final)
                if final.absolute().is_relative_to(self.root.absolute()):
                    give_to_replicas(self.root, final)
                click.echo(f"Copying {self._show(path)} [Content-Type=application/octet-stream]...", err=True)
                if move:
                    shutil.rmtree(path) if path.is_dir() else path.unlink()

    def _show(self, path: Path) -> str:
        return self.url(path) if path.is_relative_to(self.root) else f"file://{path}"

    def ls(self, urls: list[str], long: bool, recursive: bool) -> None:
        if not [url for url in urls if url.rstrip("/") != "gs:"]:  # `ls gs://` lists the buckets too
            for bucket in sorted(p for p in self.root.glob("*") if p.is_dir() and not p.name.startswith(".")):
                click.echo(f"gs://{bucket.name}/")
            return
        for url in urls:
            self.bucket_of(url)
            for path in self.expand(url):
                entries = sorted(path.rglob("*") if recursive else path.iterdir()) if path.is_dir() else [path]
                for entry in entries:
                    if entry.is_dir() and recursive:
                        continue
                    name = self.url(entry) + ("/" if entry.is_dir() else "")
                    click.echo(f"{entry.stat().st_size:>10}  {name}" if long and entry.is_file() else name)

    def cat(self, urls: list[str]) -> None:
        for url in urls:
            for path in self.expand(url):
                sys.stdout.buffer.write(path.read_bytes())
        sys.stdout.flush()

    def rm(self, urls: list[str], recursive: bool, force: bool) -> None:
        for url in urls:
            try:
                paths = self.expand(url)
            except GsutilError:
                if force:
                    continue
                raise
            for path in paths:
                if path.is_dir() and not recursive:
                    raise GsutilError(f"\"rm\" command will not remove a bucket or prefix without -r: {url}")
                click.echo(f"Removing {self.url(path)}...", err=True)
                shutil.rmtree(path) if path.is_dir() else path.unlink()

    def mb(self, urls: list[str], project: str | None = None) -> None:
        """Buckets of `project` (gsutil's -p; default: the default project, as gsutil takes it)."""
        from aiptrain.settings import Settings
        from aiptrain.storage.projects import tree

        project = project or Settings().default_project
        for url in urls:
            bucket = self.path(url.rstrip("/"))
            click.echo(f"Creating {url.rstrip('/')}/...", err=True)
            if bucket.exists():
                raise GsutilError(f"409 A Cloud Storage bucket named '{bucket.name}' already exists.", "ServiceException")
            tree(self.root).create_bucket(bucket.name, project)

    def rb(self, urls: list[str]) -> None:
        for url in urls:
            bucket = self.bucket_of(url)
            if any(bucket.iterdir()):
                raise GsutilError(f"409 The bucket you tried to delete is not empty: {url}", "BucketNotEmpty")
            click.echo(f"Removing {url.rstrip('/')}/...", err=True)
            from aiptrain.storage.projects import tree

            tree(self.root).delete_bucket(bucket.name)  # and its project's record


MB_VALUE_OPTIONS = ("-l", "-p", "-c", "-b")  # mb's options with a value: no local meaning


def split_options(args: list[str], switches: str, value_options: tuple[str, ...] = ()) -> tuple[set[str], list[str]]:
    """gsutil's short switches (`-r`, `-rf`) before and among the operands; `value_options`
    take the next argument as their value (`mb -l LOCATION`, where `ls -l` is a switch)."""
    found: set[str] = set()
    rest = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            continue
        if arg in value_options:
            skip_value = True
            continue
        if arg.startswith("-") and len(arg) > 1 and not arg.startswith("--"):
            found |= set(arg[1:]) & set(switches)
            continue
        rest.append(arg)
    return found, rest


def run(gcs: LocalGcs, command: str, args: list[str]) -> None:
    options, operands = split_options(args, "rRnlfeapU", MB_VALUE_OPTIONS if command == "mb" else ())
    if command in ("cp", "mv"):
        if len(operands) < 2:
            raise GsutilError(f"Wrong number of arguments for \"{command}\" command.")
        gcs.cp(operands[:-1], operands[-1], bool(options & {"r", "R"}) or command == "mv", "n" in options,
               move=command == "mv")
    elif command == "ls":
        gcs.ls(operands, "l" in options, bool(options & {"r", "R"}))
    elif command == "cat":
        gcs.cat(operands)
    elif command == "rm":
        gcs.rm(operands, bool(options & {"r", "R"}), "f" in options)
    elif command == "mb":
        gcs.mb(operands, _option_value(args, "-p"))
    elif command == "rb":
        gcs.rb(operands)
    else:
        raise ValidationError(
            f"aiptrain's gsutil runs cp, mv, ls, cat, rm, mb and rb on gs:// kept on this machine, not `{command}`."
        )


def _option_value(args: list[str], name: str) -> str | None:
    for index, arg in enumerate(args[:-1]):
        if arg == name:
            return args[index + 1]
    return None


def strip_top_level(argv: list[str]) -> list[str]:
    """Drop gsutil's top-level options (`-m`, `-q`, `-o KEY=VALUE`, ...) before the command."""
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in TOP_LEVEL_VALUE_OPTIONS and rest:
            rest.pop(0)
    return rest


def real_gsutil() -> str | None:
    """The next `gsutil` on PATH that is not this one."""
    return real_tool("gsutil")


def real_tool(name: str) -> str | None:
    """The next executable `name` on PATH that is not aiptrain's shim."""
    me = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(directory) / name
        if (candidate.is_file() and os.access(candidate, os.X_OK) and candidate.resolve() != me
                and "aiptrain" not in candidate.read_text(errors="replace")[:400]):
            return str(candidate)
    return None


# `gcloud storage` spells gsutil's switches long: the same commands on the same tree.
GCLOUD_SWITCHES = {"--recursive": "-r", "--no-clobber": "-n", "--long": "-l", "--continue-on-error": None,
                   "--quiet": None}
GCLOUD_VALUE_OPTIONS = ("--location", "--default-storage-class", "--project", "--uniform-bucket-level-access")


def gcloud_storage_args(args: list[str]) -> tuple[str, list[str]]:
    """`gcloud storage COMMAND ARGS` as the gsutil command that does the same here."""
    if args[:2] == ["buckets", "create"]:
        command, rest = "mb", args[2:]
    elif args and args[0] in ("cp", "mv", "ls", "cat", "rm"):
        command, rest = args[0], args[1:]
    else:
        raise ValidationError(
            f"aiptrain's `gcloud storage` runs cp, mv, ls, cat, rm and buckets create on gs:// kept on this machine, "
            f"not `{' '.join(args[:2]) or '(nothing)'}`."
        )
    translated = []
    skip = False
    for arg in rest:
        if skip:
            skip = False
            continue
        key = arg.split("=", 1)[0]
        if key == "--project":  # the project the bucket goes to, as mb's -p
            translated += ["-p", arg.split("=", 1)[1] if "=" in arg else rest[rest.index(arg) + 1]]
            skip = "=" not in arg
        elif key in GCLOUD_VALUE_OPTIONS:
            skip = "=" not in arg
        elif key in GCLOUD_SWITCHES:
            switch = GCLOUD_SWITCHES[key]
            if switch:
                translated.append(switch)
        else:
            translated.append(arg)
    return command, translated


def gcloud_storage(args: list[str]) -> int:
    """`gcloud storage ...` for the gcloud shim: on gs:// kept on this machine, with gcloud's
    error lines (`ERROR: (gcloud.storage.cp) ...`, exit 1); with Cloud Storage, the real gcloud
    further on PATH runs it."""
    command = "buckets.create" if args[:2] == ["buckets", "create"] else (args[0] if args else "")
    try:
        root = gcs_root()
        if root is None:
            real = real_tool("gcloud")
            if real is None:
                raise ValidationError("gs:// is Cloud Storage here (AIPTRAIN_GCS): install Google's gcloud for it.")
            os.execv(real, [real, "storage", *args])
        run(LocalGcs(root), *gcloud_storage_args(args))
    except GsutilError as exc:
        message = str(exc).split(": ", 1)[1]
        click.echo(f"ERROR: (gcloud.storage.{command}) {message}", err=True)
        return EXIT_FAILED
    except AiptrainError as exc:
        click.echo(f"ERROR: (gcloud.storage) {exc}", err=True)
        return exc.exit_code
    return 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    rest = strip_top_level(argv)
    try:
        root = gcs_root()
        if root is None:
            real = real_gsutil()
            if real is None:
                raise ValidationError("gs:// is Cloud Storage here (AIPTRAIN_GCS): install Google's gsutil for it.")
            os.execv(real, [real, *argv])
        if not rest:
            raise ValidationError("Usage: gsutil [-m] [-q] COMMAND ARGS: cp, mv, ls, cat, rm, mb or rb.")
        run(LocalGcs(root), rest[0], rest[1:])
    except GsutilError as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_FAILED)
    except AiptrainError as exc:
        click.echo(f"ERROR: {exc}", err=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
