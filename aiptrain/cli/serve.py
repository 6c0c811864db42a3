"""`aiptrain serve`: the ml v1 REST API (projects.jobs), Cloud Logging's entries.list for job
logs and Cloud Storage's JSON API for uploads, over this installation's jobs (aiptrain.api)."""

from __future__ import annotations

import click

# The server's thread switch interval (see serve's body); Python's default is 5 ms.
SWITCH_INTERVAL_SECONDS = 0.0005


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --tokens.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to listen on (0: any free port, printed at start).")
@click.option("--tokens", "tokens_file", type=click.Path(dir_okay=False),
              help="YAML file of bearer tokens: each with a name, the projects it may use and readOnly.")
def serve(host: str, port: int, tokens_file: str | None) -> None:
    """Serve the AI Platform Training REST API (ml v1 projects.jobs), job logs in Cloud
    Logging's shape and Cloud Storage uploads (STORAGE_EMULATOR_HOST=the same URL), so
    googleapiclient, Airflow, pipelines and `aiptrain` with AIPTRAIN_API drive this installation.

    \b
    from google.auth.credentials import AnonymousCredentials
    from googleapiclient import discovery
    ml = discovery.build("ml", "v1", static_discovery=True, credentials=AnonymousCredentials(),
                         client_options={"api_endpoint": "http://127.0.0.1:8080"})
    """
    import logging
    import signal
    import sys

    from aiptrain.api.access import Access, load_tokens
    from aiptrain.api.app import App
    from aiptrain.api.server import make_server

    access = load_tokens(tokens_file) if tokens_file else Access()
    app = App(access=access)
    server = make_server(app, host, port)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    api_log = logging.getLogger("aiptrain.api")
    api_log.addHandler(handler)
    api_log.propagate = False
    # Refusals and failures always; each request too at --verbosity info or debug.
    api_log.setLevel(min(logging.getLogger("aiptrain").getEffectiveLevel(), logging.WARNING))
    if not access.open:
        _serve_teams(app.settings.gcs_root)
    address, bound_port = server.server_address[:2]
    address = address.decode() if isinstance(address, (bytes, bytearray)) else address  # str for AF_INET(6)
    shown = f"[{address}]" if ":" in address else address
    who = "tokens from " + tokens_file if tokens_file else "no tokens (loopback only)"
    click.echo(f"Serving the ml v1 API, Cloud Logging entries.list and Cloud Storage on http://{shown}:{bound_port} "
               f"({who}), the console at http://{shown}:{bound_port}/; Ctrl-C stops.", err=True)
    signal.signal(signal.SIGTERM, _stop)  # a service manager's stop: as Ctrl-C, the port is released
    # A thread per kept-alive connection, each request a millisecond or two of Python: with the
    # default 5 ms switch interval, a request waited behind whole slices of its neighbours'.
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        app.close()


def _serve_teams(gcs_root) -> None:
    """A team server's tree: buckets of no project are nobody's; said once, with the fix."""
    from aiptrain.storage.projects import serve_teams

    unowned = serve_teams(gcs_root)
    if unowned:
        shown = ", ".join(unowned[:5]) + (f" and {len(unowned) - 5} more" if len(unowned) > 5 else "")
        click.echo(f"WARNING: {len(unowned)} bucket(s) belong to no project ({shown}): no token of this team server "
                   "may use them until they are assigned: `aiptrain buckets assign BUCKET... --project PROJECT`.",
                   err=True)


def _stop(signum, frame) -> None:
    raise KeyboardInterrupt
