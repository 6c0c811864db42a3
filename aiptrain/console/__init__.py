"""The browser console's files (static/), served by `aiptrain serve` at `/` and `/console/NAME`.

The console is a page of plain JavaScript that reads only the REST API of the same server
(projects.jobs, entries:list, and projects.locations.customJobs / hyperparameterTuningJobs get
for the Vertex AI jobs among the jobs) with the caller's token; nothing here touches the store.
Imported only when a console path is asked for, so the CLI never loads it.
"""

from __future__ import annotations

import html
import re
from importlib import resources

TYPES = {".html": "text/html; charset=UTF-8", ".js": "text/javascript; charset=UTF-8",
         ".css": "text/css; charset=UTF-8", ".svg": "image/svg+xml", ".png": "image/png"}
# The page loads only its own files and talks only to its own origin: a log line or a label that
# holds markup cannot run script even if it reached the page as HTML.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*\.[a-z]+")
_PROJECT_MARK = "{{default_project}}"


def asset(path: str, default_project: str) -> tuple[bytes, str] | None:
    """(bytes, content type) of the console file a request path names; None when there is none.
    `/` is the page, with the server's default project filled in."""
    name = "index.html" if path == "/" else path.removeprefix("/console/")
    suffix = "." + name.rsplit(".", 1)[-1]
    if not _NAME.fullmatch(name) or suffix not in TYPES:  # no path steps, no hidden or odd files
        return None
    file = resources.files(__package__) / "static" / name
    if not file.is_file():
        return None
    data = file.read_bytes()
    if name == "index.html":
        data = data.replace(_PROJECT_MARK.encode(), html.escape(default_project, quote=True).encode())
    return data, TYPES[suffix]
