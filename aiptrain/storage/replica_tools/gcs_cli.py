"""`gsutil` and `gcloud storage` inside replicas: the commands trainers and their scripts run
(cp, mv, ls, cat, rm, mb / buckets create), on google-cloud-storage, which reaches whatever
Cloud Storage the replica has (aiptrain's storage endpoint when gs:// is kept on the host).

aiptrain mounts this directory read-only on every runtime replica's PATH; it runs on the
image's Python and google-cloud-storage only (docs/guide/storage.md lists what is supported).
"""

from __future__ import annotations

import os
import re
import sys
import warnings

EXIT_FAILED = 1


class CommandError(Exception):
    def __init__(self, message: str, kind: str = "CommandException"):
        super().__init__(f"{kind}: {message}")


def split_url(url: str) -> tuple[str, str]:
    bucket, _, name = url[len("gs://"):].partition("/")
    return bucket, name


def wildcard_regex(pattern: str) -> str:
    """gsutil's wildcards: `**` any characters, `*` any but '/', `?` one but '/'."""
    pieces = re.split(r"(\*\*|\*|\?)", pattern)
    table = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    return "".join(table.get(piece, re.escape(piece)) for piece in pieces)


def is_gs(url: str) -> bool:
    return url.startswith("gs://")


class Storage:
    """gs:// through google-cloud-storage, with gsutil's meaning of each command."""

    def __init__(self, quiet: bool = False):
        # The image's Python may be older than the client libraries like: their notice is not ours.
        warnings.filterwarnings("ignore", category=FutureWarning)
        from google.cloud import storage

        self.client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or "aiptrain-local")
        self.quiet = quiet

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    # -- names -----------------------------------------------------------------------------

    def objects(self, url: str, recursive: bool) -> list[tuple[str, str]]:
        """(name, path relative to what the URL names) of each object a URL names: the object
        itself, with -r everything under the prefix, or what its wildcards match."""
        bucket, name = split_url(url)
        if "*" in name or "?" in name:
            head = re.split(r"[*?]", name, maxsplit=1)[0]
            regex = re.compile(wildcard_regex(name))
            found = [(b.name, b.name.rsplit("/", 1)[-1]) for b in self.client.list_blobs(bucket, prefix=head)
                     if regex.fullmatch(b.name) and not b.name.endswith("/")]
            if not found:
                raise CommandError(f"No URLs matched: {url}")
            return found
        blob = self.client.bucket(bucket).get_blob(name) if name and not name.endswith("/") else None
        if blob is not None:
            return [(name, name.rsplit("/", 1)[-1])]
        prefix = name.rstrip("/") + "/" if name else ""
        under = [b.name for b in self.client.list_blobs(bucket, prefix=prefix) if not b.name.endswith("/")]
        if under and recursive:
            base = prefix.rstrip("/").rsplit("/", 1)[-1] if prefix else ""
            return [(n, (base + "/" if base else "") + n[len(prefix):]) for n in under]
        if under:
            raise CommandError(f"Omitting prefix \"{url}\". (Did you mean to do cp -r?)")
        raise CommandError(f"No URLs matched: {url}")

    def has_prefix(self, url: str) -> bool:
        bucket, name = split_url(url)
        prefix = name.rstrip("/") + "/" if name else ""
        return any(True for _ in self.client.list_blobs(bucket, prefix=prefix, max_results=1))

    # -- commands --------------------------------------------------------------------------

    def cp(self, sources: list[str], target: str, recursive: bool, no_clobber: bool, move: bool = False) -> None:
        into = target.endswith("/") or len(sources) > 1 or (
            self.has_prefix(target) if is_gs(target) else os.path.isdir(target))
        for source in sources:
            for origin, relative in self._sources(source, recursive):
                destination = self._join(target, relative) if into else self._join_whole(target, relative, source)
                if no_clobber and self._exists(destination):
                    continue
                self.say(f"Copying {origin if is_gs(origin) else 'file://' + origin} [Content-Type=application/"
                         "octet-stream]...")
                self._copy_one(origin, destination)
                if move:
                    self._remove_one(origin)

    def _sources(self, source: str, recursive: bool) -> list[tuple[str, str]]:
        if is_gs(source):
            bucket, _ = split_url(source)
            return [(f"gs://{bucket}/{name}", relative) for name, relative in self.objects(source, recursive)]
        if os.path.isdir(source):
            if not recursive:
                raise CommandError(f"Omitting directory \"{source}\". (Did you mean to do cp -r?)")
            base = os.path.basename(os.path.normpath(source))
            files = []
            for directory, _, names in os.walk(source):
                for name in sorted(names):
                    path = os.path.join(directory, name)
                    files.append((path, os.path.join(base, os.path.relpath(path, source))))
            return files
        if not os.path.exists(source):
            raise CommandError(f"No URLs matched: {source}")
        return [(source, os.path.basename(source))]

    @staticmethod
    def _join(target: str, relative: str) -> str:
        return target.rstrip("/") + "/" + relative if is_gs(target) else os.path.join(target, relative)

    def _join_whole(self, target: str, relative: str, source: str) -> str:
        """Copying one thing to a name that does not exist: it takes that name (a directory's
        files go under it, without the directory's own name)."""
        if "/" in relative and (os.path.isdir(source) or is_gs(source)):
            return self._join(target, relative.split("/", 1)[1])
        return target

    def _exists(self, url: str) -> bool:
        if is_gs(url):
            bucket, name = split_url(url)
            return self.client.bucket(bucket).blob(name).exists()
        return os.path.exists(url)

    def _copy_one(self, origin: str, destination: str) -> None:
        if is_gs(origin) and is_gs(destination):
            source_bucket, source_name = split_url(origin)
            bucket, name = split_url(destination)
            self.client.bucket(source_bucket).copy_blob(self.client.bucket(source_bucket).blob(source_name),
                                                        self.client.bucket(bucket), name)
        elif is_gs(destination):
            bucket, name = split_url(destination)
            self.client.bucket(bucket).blob(name).upload_from_filename(origin)
        else:
            bucket, name = split_url(origin)
            os.makedirs(os.path.dirname(os.path.abspath(destination)), exist_ok=True)
            self.client.bucket(bucket).blob(name).download_to_filename(destination)

    def _remove_one(self, url: str) -> None:
        if is_gs(url):
            bucket, name = split_url(url)
            self.client.bucket(bucket).blob(name).delete()
        else:
            os.unlink(url)

    def ls(self, urls: list[str], long: bool, recursive: bool) -> None:
        if urls and all(url.rstrip("/") == "gs:" for url in urls):
            urls = []  # `ls gs://` lists the buckets, as with no URL
        if not urls:
            for bucket in self.client.list_buckets():
                print(f"gs://{bucket.name}/")
            return
        for url in urls:
            bucket, name = split_url(url)
            if "*" in name:
                for found, _ in self.objects(url, True):
                    print(f"gs://{bucket}/{found}")
                continue
            blob = self.client.bucket(bucket).get_blob(name) if name and not name.endswith("/") else None
            if blob is not None:
                print(self._line(bucket, blob, long))
                continue
            prefix = name.rstrip("/") + "/" if name else ""
            listing = self.client.list_blobs(bucket, prefix=prefix, delimiter=None if recursive else "/")
            blobs = list(listing)
            prefixes = sorted(getattr(listing, "prefixes", ()) or ())
            if not blobs and not prefixes:
                raise CommandError(f"One or more URLs matched no objects: {url}")
            for line in sorted([self._line(bucket, b, long) for b in blobs if b.name != prefix]
                               + [f"gs://{bucket}/{p}" for p in prefixes], key=lambda t: t.split()[-1]):
                print(line)

    @staticmethod
    def _line(bucket: str, blob, long: bool) -> str:
        url = f"gs://{bucket}/{blob.name}"
        if not long:
            return url
        updated = blob.updated.strftime("%Y-%m-%dT%H:%M:%SZ") if blob.updated else ""
        return f"{blob.size:>10}  {updated}  {url}"

    def cat(self, urls: list[str]) -> None:
        for url in urls:
            bucket, _ = split_url(url)
            for name, _ in self.objects(url, False):
                sys.stdout.buffer.write(self.client.bucket(bucket).blob(name).download_as_bytes())
        sys.stdout.flush()

    def rm(self, urls: list[str], recursive: bool, force: bool) -> None:
        for url in urls:
            bucket, name = split_url(url)
            try:
                if not name:
                    if not recursive:
                        raise CommandError(f"\"rm\" command will not remove a bucket without -r: {url}")
                    for blob in self.client.list_blobs(bucket):
                        self.say(f"Removing gs://{bucket}/{blob.name}...")
                        blob.delete()
                    self.client.bucket(bucket).delete()
                    continue
                for found, _ in self.objects(url, recursive):
                    self.say(f"Removing gs://{bucket}/{found}...")
                    self.client.bucket(bucket).blob(found).delete()
            except CommandError:
                if not force:
                    raise

    def mb(self, urls: list[str], location: str | None) -> None:
        from google.api_core.exceptions import Conflict

        for url in urls:
            bucket, _ = split_url(url.rstrip("/"))
            self.say(f"Creating gs://{bucket}/...")
            try:
                self.client.create_bucket(bucket, location=location)
            except Conflict:
                raise CommandError(f"409 A Cloud Storage bucket named '{bucket}' already exists.",
                                   "ServiceException") from None


# -- command lines ------------------------------------------------------------------------------

GSUTIL_TOP_VALUE = ("-o", "-h", "-u")
# Options that take a value: bucket creation's only (`ls -l` is the long listing, `mb -l` a location).
VALUE_OPTIONS = ("-l", "-p", "-c", "-b", "--location", "--project", "--default-storage-class")
BUCKET_COMMANDS = ("mb", "create")


def parse(args: list[str], aliases: dict[str, str], command: str = "mb") -> tuple[set[str], dict[str, str], list[str]]:
    """(switches, options with values, operands) of `command`'s arguments: short switches may be
    grouped (-rf); long ones are mapped through `aliases` (--recursive -> r)."""
    value_options = VALUE_OPTIONS if command in BUCKET_COMMANDS else ()
    switches: set[str] = set()
    values: dict[str, str] = {}
    operands: list[str] = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            operands.extend(rest)
            break
        key, has_value, value = arg.partition("=")
        if key in value_options:
            values[key.lstrip("-")[0]] = value if has_value else (rest.pop(0) if rest else "")
        elif arg.startswith("--"):
            if key in aliases:
                switches.add(aliases[key])
        elif arg.startswith("-") and len(arg) > 1:
            switches |= set(arg[1:])
        else:
            operands.append(arg)
    return switches, values, operands


def run_gsutil(argv: list[str]) -> None:
    quiet = False
    while argv and argv[0].startswith("-"):
        option = argv.pop(0)
        quiet = quiet or option == "-q"
        if option in GSUTIL_TOP_VALUE and argv:
            argv.pop(0)
    if not argv:
        raise CommandError("Usage: gsutil [-m] [-q] cp|mv|ls|cat|rm|mb ARGS")
    command, args = argv[0], argv[1:]
    switches, values, operands = parse(args, {}, command)
    run(Storage(quiet), command, switches, values, operands)


GCLOUD_ALIASES = {"--recursive": "r", "--no-clobber": "n", "--long": "l", "--continue-on-error": "c",
                  "--quiet": "q"}


def run_gcloud(argv: list[str]) -> None:
    argv = [a for a in argv if not a.startswith("--verbosity") and not a.startswith("--format")]
    if argv[:1] != ["storage"]:
        raise CommandError("Inside aiptrain's replicas, gcloud runs `gcloud storage` commands only.",
                           "ERROR: (gcloud)")
    argv = argv[1:]
    if argv[:2] == ["buckets", "create"]:
        switches, values, operands = parse(argv[2:], GCLOUD_ALIASES, "create")
        return Storage().mb(operands, values.get("l"))
    if argv[:2] == ["buckets", "list"]:
        return Storage().ls([], False, False)
    if not argv:
        raise CommandError("Usage: gcloud storage cp|mv|ls|cat|rm|buckets create|buckets list ARGS",
                           "ERROR: (gcloud.storage)")
    switches, values, operands = parse(argv[1:], GCLOUD_ALIASES, argv[0])
    run(Storage("q" in switches), argv[0], switches, values, operands)


def run(storage: Storage, command: str, switches: set[str], values: dict[str, str], operands: list[str]) -> None:
    recursive = bool(switches & {"r", "R"})
    if command in ("cp", "mv"):
        if len(operands) < 2:
            raise CommandError(f"Wrong number of arguments for \"{command}\" command.")
        storage.cp(operands[:-1], operands[-1], recursive or command == "mv", "n" in switches, move=command == "mv")
    elif command in ("ls", "list"):
        storage.ls(operands, "l" in switches, recursive)
    elif command == "cat":
        storage.cat(operands)
    elif command == "rm":
        storage.rm(operands, recursive, "f" in switches)
    elif command == "mb":
        storage.mb(operands, values.get("l"))
    else:
        raise CommandError(f"aiptrain's {command!r} is not supported here: cp, mv, ls, cat, rm, mb.")


def main(tool: str) -> None:
    try:
        (run_gsutil if tool == "gsutil" else run_gcloud)(sys.argv[1:])
    except CommandError as exc:
        print(str(exc), file=sys.stderr)
        sys.exit(EXIT_FAILED)
    except Exception as exc:  # noqa: BLE001 - the client's errors, one line as the real tools print them
        print(f"{'CommandException' if tool == 'gsutil' else 'ERROR: (gcloud.storage)'}: {exc}", file=sys.stderr)
        sys.exit(EXIT_FAILED)
