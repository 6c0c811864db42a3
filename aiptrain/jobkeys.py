"""A job's key: what names it inside one installation, since job IDs are unique per project only.

Two projects may both have a job `census_1` (as on the service). The store keys each job by its
`JobKey`, and everything the installation keeps per job derives from that key alone: its row and
events, its log (`logs/<key>.jsonl`), lock and work dir (aiptrain.jobpaths), its containers,
networks and services and their `LABEL_JOB` label (aiptrain.planning), its folder in the default
staging bucket. The key is chosen once, when the job is created, and stored:

- the job ID itself for a job of the installation's default project (`core/project`, else
  `aiptrain`) whose ID no other job holds as its key: a single-user home, and every job made
  before job IDs were per project, keep their names, logs and containers;
- otherwise `<project label>--<job ID>`.

A job ID holds letters, digits and `_` only, so a plain key never equals a qualified one; a
project label holds no `--` and does not end with `-`, and a job ID holds no `-`, so the names
built from keys (`<key>-trial-3`, `<key>-master-0`) stay distinct from job to job. Keys keep to
the strictest of the engine's name rules, a Swarm service's (letters and digits, joined by `-`
or `_`; no `.`). Hostnames inside a job's network come from its job ID, not its key (they are
its own): a trainer sees nothing of other projects.
"""

from __future__ import annotations

import hashlib
import re
from typing import NewType

JobKey = NewType("JobKey", str)
# The installation's default project when core/project is not set (aiptrain.settings).
DEFAULT_PROJECT = "aiptrain"

# A project label as it is: a Google Cloud project ID's shape (lowercase letters and digits,
# single `-` between them), at most 30 characters as there.
_PLAIN_LABEL = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_PLAIN_MOST = 30
SEPARATOR = "--"
# Any other project (upper case, `.`, `:`, too long) is named by a digest of it: the leading
# capital tells it from every plain label.
_DIGEST_CHARS = 16


def project_label(project: str) -> str:
    """The project as it appears in keys: itself when it is a plain project ID, else `P` and a digest."""
    if len(project) <= _PLAIN_MOST and _PLAIN_LABEL.fullmatch(project):
        return project
    return "P" + hashlib.sha256(project.encode()).hexdigest()[:_DIGEST_CHARS]


def qualified_key(project: str, job_id: str) -> JobKey:
    return JobKey(f"{project_label(project)}{SEPARATOR}{job_id}")


def new_key(project: str, job_id: str, default_project: str, plain_taken: bool) -> JobKey:
    """The key a new job (project, job_id) gets: its ID when it is in the default project and no
    job holds that ID as its key (`plain_taken`: a job of another project made before job IDs
    were per project, or when the default project was another), else the qualified key."""
    if project == default_project and not plain_taken:
        return JobKey(job_id)
    return qualified_key(project, job_id)


# What a key looks like (a lock file's name is checked against it before it is removed).
KEY_PATTERN = re.compile(r"(?:(?:[a-z0-9]+(?:-[a-z0-9]+)*|P[0-9a-f]{16})--)?[A-Za-z][A-Za-z0-9_]{0,127}")
