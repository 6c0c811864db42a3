"""Who may do what through the REST API. Pure: no I/O but reading the tokens file.

With no tokens file (the default, loopback only) every caller may do everything, as anyone
who can run `aiptrain` on the machine can. With one, a caller proves who it is with
`Authorization: Bearer TOKEN` (what google-auth credentials send) and may use only the
projects its token names, read-only or not, and the Cloud Storage buckets of those projects.
The tokens file (YAML or JSON):

    - name: ci-pipeline          # shown in the server's log and in IAM policies, never the token
      token: 8c1b0e7d5f2a4e6b9d3c  # at least 16 characters
      projects: [team-a]         # or ["*"] for every project
      readOnly: false
      buckets:                   # optional: other projects' buckets shared on purpose
        - shared-data            # read and write (unless the entry is readOnly)
        - {name: reference-sets, readOnly: true}
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

from aiptrain.errors import ValidationError
from aiptrain.storage import validate_bucket_name

MIN_TOKEN_CHARS = 16
ANY_PROJECT = "*"
READ_PERMISSIONS = ("ml.jobs.get", "ml.jobs.list", "ml.jobs.getIamPolicy")
WRITE_PERMISSIONS = ("ml.jobs.create", "ml.jobs.update", "ml.jobs.cancel", "ml.jobs.setIamPolicy")
VIEWER_ROLE, DEVELOPER_ROLE = "roles/ml.viewer", "roles/ml.developer"
LOCAL_MEMBER = "allUsers"  # no tokens: whoever reaches the loopback port


@dataclass(frozen=True)
class Grant:
    """What one token may do."""

    name: str
    projects: frozenset[str]
    read_only: bool
    buckets: tuple[tuple[str, bool], ...] = ()  # (bucket, writable) shared with this token beyond its projects'

    def reaches(self, project: str) -> bool:
        return ANY_PROJECT in self.projects or project in self.projects

    def allows(self, project: str, write: bool) -> bool:
        return self.reaches(project) and not (write and self.read_only)


OPEN = Grant("local", frozenset({ANY_PROJECT}), read_only=False)


class Refused(Exception):
    """A request the caller may not make: 401 (who are you?) or 403 (not you)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Access:
    """The tokens in force (by their SHA-256, so a lookup compares no secret byte by byte);
    None: no tokens, everyone may do everything."""

    grants: dict[str, Grant] | None = None

    @property
    def open(self) -> bool:
        return self.grants is None

    def caller(self, authorization: str | None) -> Grant:
        """The grant of the `Authorization` header's bearer token; Refused(401) without a good one."""
        if self.grants is None:
            return OPEN
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Refused(401, "Request is missing required authentication credential: send "
                          "`Authorization: Bearer TOKEN` with a token from the server's --tokens file.")
        grant = self.grants.get(_digest(token.strip()))
        if grant is None:
            raise Refused(401, "Request had invalid authentication credentials: the bearer token is not in the "
                          "server's --tokens file.")
        return grant

    def check(self, grant: Grant, project: str, write: bool) -> None:
        """Refused(403) unless `grant` may use `project` (and change things in it, when `write`)."""
        if not grant.reaches(project):
            raise Refused(403, f"Permission denied on project [{project}]: the caller's token does not name it.")
        if write and grant.read_only:
            raise Refused(403, f"Permission denied on project [{project}]: the caller's token is read-only.")

    def shared_with(self, project: str) -> tuple[tuple[str, bool], ...]:
        """The buckets the tokens of `project` are given beyond its own (writable where any
        token that names the project may write it): what its jobs' replicas may use too."""
        writable: dict[str, bool] = {}
        for grant in (self.grants or {}).values():
            if project in grant.projects:
                for bucket, may_write in grant.buckets:
                    writable[bucket] = writable.get(bucket, False) or may_write
        return tuple(sorted(writable.items()))

    def permissions(self, grant: Grant, project: str, asked: list[str]) -> list[str]:
        """testIamPermissions: those of `asked` that `grant` holds on `project`'s jobs."""
        held = set(READ_PERMISSIONS) if grant.reaches(project) else set()
        if grant.allows(project, write=True):
            held |= set(WRITE_PERMISSIONS)
        return [permission for permission in asked if permission in held]

    def policy(self, project: str) -> dict:
        """getIamPolicy: the tokens file's grants on `project` as IAM bindings (members by name)."""
        if self.grants is None:
            return {"version": 1, "bindings": [{"role": DEVELOPER_ROLE, "members": [LOCAL_MEMBER]}],
                    "etag": _policy_etag(LOCAL_MEMBER)}
        roles: dict[str, list[str]] = {}
        for grant in self.grants.values():
            if grant.reaches(project):
                role = VIEWER_ROLE if grant.read_only else DEVELOPER_ROLE
                roles.setdefault(role, []).append(f"serviceAccount:{grant.name}")
        bindings = [{"role": role, "members": sorted(members)} for role, members in sorted(roles.items())]
        policy = {"version": 1, "bindings": bindings} if bindings else {"version": 1}
        return {**policy, "etag": _policy_etag(repr(bindings))}


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _policy_etag(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest()[:8]).decode()


def load_tokens(path: str | Path) -> Access:
    """The tokens file as an Access; ValidationError (exit 2) naming the entry that is wrong."""
    where = f"--tokens file [{path}]"
    try:
        entries = yaml.safe_load(Path(path).expanduser().read_text())
    except FileNotFoundError:
        raise ValidationError(f"{where} does not exist: create it (see docs/reference/rest-api.md).") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValidationError(f"{where} cannot be read as YAML: {type(exc).__name__}; fix the file.") from None
    if not isinstance(entries, list) or not entries:
        raise ValidationError(f"{where} must be a non-empty list of entries with token, name, projects, readOnly.")
    grants: dict[str, Grant] = {}
    for index, entry in enumerate(entries):
        grant, token = _entry(entry, f"{where} entry {index + 1}")
        if _digest(token) in grants:
            raise ValidationError(f"{where} entry {index + 1}: the same token appears twice: give each its own.")
        grants[_digest(token)] = grant
    return Access(grants)


def _entry(entry: object, where: str) -> tuple[Grant, str]:
    if not isinstance(entry, dict):
        raise ValidationError(f"{where} must be a mapping with token, name, projects and readOnly.")
    unknown = sorted(set(entry) - {"token", "name", "projects", "readOnly", "buckets"})
    if unknown:
        raise ValidationError(f"{where} has unknown key(s) {', '.join(map(str, unknown))}: "
                              "use token, name, projects, readOnly, buckets.")
    token, name, projects = entry.get("token"), entry.get("name"), entry.get("projects")
    if not isinstance(token, str) or len(token.strip()) < MIN_TOKEN_CHARS or token != token.strip():
        raise ValidationError(f"{where}: token must be a string of at least {MIN_TOKEN_CHARS} characters "
                              "without blanks around it (e.g. from `openssl rand -hex 24`).")
    if not isinstance(name, str) or not name.strip():
        raise ValidationError(f"{where}: name is required (it names the caller in the server's log).")
    if not isinstance(projects, list) or not projects or not all(isinstance(p, str) and p for p in projects):
        raise ValidationError(f"{where}: projects must be a non-empty list of project IDs (or [\"*\"]).")
    read_only = entry.get("readOnly", False)
    if not isinstance(read_only, bool):
        raise ValidationError(f"{where}: readOnly must be true or false.")
    return Grant(name.strip(), frozenset(projects), read_only, _shared_buckets(entry.get("buckets", []), read_only,
                                                                         where)), token


def _shared_buckets(buckets: object, read_only: bool, where: str) -> tuple[tuple[str, bool], ...]:
    """`buckets:` as (bucket, writable): a name, or {name: B, readOnly: true}."""
    fix = f"{where}: buckets must be a list of bucket names or {{name: BUCKET, readOnly: true}} entries."
    if not isinstance(buckets, list):
        raise ValidationError(fix)
    shared = []
    for item in buckets:
        name, only_read = (item, False) if isinstance(item, str) else (None, None)
        if isinstance(item, dict) and set(item) <= {"name", "readOnly"}:
            name, only_read = item.get("name"), item.get("readOnly", False)
        if not isinstance(name, str) or not isinstance(only_read, bool):
            raise ValidationError(fix)
        validate_bucket_name(name)
        shared.append((name, not (read_only or only_read)))
    return tuple(shared)
