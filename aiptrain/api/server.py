"""The HTTP listener around app.App: the standard library's ThreadingHTTPServer (one thread per
connection; HTTP/1.1 keep-alive, which httplib2 under googleapiclient uses). It reads a
bounded body, hands a Request to the App and writes its Response.

On the same port it serves Cloud Storage's JSON API over the installation's gs:// tree
($AIPTRAIN_HOME/gcs), with the storage endpoint the replicas use (aiptrain.storage.endpoint_server),
so a client's google-cloud-storage with STORAGE_EMULATOR_HOST=<this URL> uploads the packages a
create names as gs://: one URL for a whole pipeline. Its requests pass the API's token rules first."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from http.server import ThreadingHTTPServer
from urllib.parse import urlsplit

from aiptrain.api.access import Access, Refused
from aiptrain.api.app import App
from aiptrain.api.calls import MAX_BODY_BYTES, Request, Response, error_response
from aiptrain.errors import ValidationError
from aiptrain.storage import endpoint_server
from aiptrain.storage.local import REPLICA_IDS

log = logging.getLogger("aiptrain.api")

LINGER_SECONDS = 2
LINGER_BYTES = 16 * MAX_BODY_BYTES


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listening(host: str, access: Access) -> None:
    """Only loopback without tokens: anyone who reaches the port could run jobs otherwise."""
    if not is_loopback(host) and access.open:
        raise ValidationError(f"--host [{host}] is not a loopback address: listening there needs --tokens FILE "
                              "(who may use which projects), or use --host 127.0.0.1.")


class _Handler(endpoint_server.Handler):
    """The API's requests go to the App; Cloud Storage's (is_storage_path) to the storage
    endpoint's handler this class extends, once the caller may make them."""

    protocol_version = "HTTP/1.1"
    server_version = "aiptrain"
    scheme = "http"  # of the upload session URLs the storage handler hands out
    timeout = 120  # seconds a connection may sit idle or trickle a request before it is dropped
    app: App  # set on the class made by make_server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: without this, Nagle's algorithm holds the body
        # until the client's delayed ACK (40 ms on Linux) on every kept-alive request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, headers too long, an unknown
        method) in Google's body too, not in HTML."""
        self.close_connection = True
        self._write(error_response(code, message or self.responses.get(code, ("Error",))[0]))

    def _serve(self) -> None:
        self.body_left_unread = False
        if is_storage_path(self.path):
            refusal = self._storage_refusal()
            if refusal is None:
                return self._dispatch()  # the storage endpoint reads (and streams) its own bodies
            self.close_connection = self.body_left_unread = self.command not in ("GET", "HEAD", "DELETE")
            self._write(refusal)
        else:
            self._write(self._read_and_handle())
        if self.body_left_unread:
            self._discard_unread_body()

    def caller_scope(self) -> endpoint_server.Scope:
        """Cloud Storage through the API's tokens: a token uses the buckets of the projects it
        names and those the tokens file shares with it; every bucket on a server without tokens."""
        access = self.app.access
        grant = access.caller(self.headers.get("Authorization"))  # checked by _storage_refusal first
        return endpoint_server.Scope(f"serviceAccount:{grant.name}", grant.projects, dict(grant.buckets),
                                     grant.read_only, unowned=access.open)

    def _storage_refusal(self) -> Response | None:
        """401 for a caller the tokens file does not know; None when the call may go on (what it
        may do is the storage handler's to check, bucket by bucket: caller_scope)."""
        try:
            self.app.access.caller(self.headers.get("Authorization"))
        except Refused as refused:
            log.warning("refused %s %s %s from %s: %s", refused.code, self.command, urlsplit(self.path).path,
                        self.client_address[0], refused)
            return error_response(refused.code, str(refused))
        return None

    def _write(self, response: Response) -> None:
        data = response.encoded()
        self.send_response(response.code)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _read_and_handle(self) -> Response:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = self.body_left_unread = True  # the stream cannot be reused
            return error_response(400, "Chunked request bodies are not taken: send Content-Length.")
        length_text = self.headers.get("Content-Length") or "0"
        if not length_text.isdigit():
            self.close_connection = True
            return error_response(400, f"Content-Length [{length_text}] is not a number.")
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            self.close_connection = self.body_left_unread = True
            return error_response(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.")
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        request = Request(
            method=self.command, path=parts.path, query=parts.query,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body, client=self.client_address[0],
        )
        return self.app.handle(request)

    def _discard_unread_body(self) -> None:
        """A lingering close, as nginx does: closing a socket with unread data makes the kernel send
        a reset, and a client still sending its body then sees a broken pipe instead of our answer.
        So stop writing, and read and drop what the client still sends, bounded in bytes and time."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(LINGER_SECONDS)
            left = LINGER_BYTES
            while left > 0 and (chunk := self.connection.recv(min(left, 65536))):
                left -= len(chunk)
        except OSError:
            pass  # the client went away first: nothing more to do

    do_GET = do_HEAD = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - BaseHTTPRequestHandler's signature
        log.info("%s %s", self.client_address[0], format % args)


def replica_owner() -> tuple[int, int] | None:
    """Who what the server writes in the gcs tree belongs to: the replicas' user when it runs as
    root (as every host-side writer of the tree does, aiptrain.storage.local.give_to_replicas),
    so the endpoint in the replicas' container may write beside it."""
    return REPLICA_IDS if os.geteuid() == 0 else None


def is_storage_path(target: str) -> bool:
    """Whether a request target is Cloud Storage's JSON API (objects, uploads, downloads, batch)."""
    path = urlsplit(target).path.lstrip("/")
    return path.startswith(endpoint_server.API_PREFIXES) or path.startswith("batch/storage/")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address, handler, family):
        self.address_family = family
        super().__init__(address, handler)


def make_server(app: App, host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    """A server bound to (host, port) but not yet serving: `.serve_forever()`, `.shutdown()`;
    `.server_address[1]` is the port (port 0 picks a free one)."""
    check_listening(host, app.access)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    tree = endpoint_server.Tree(str(app.settings.gcs_root), replica_owner())  # gs://BUCKET/NAME: gcs/BUCKET/NAME
    handler = type("Handler", (_Handler,), {"app": app, "tree": tree, "uploads": endpoint_server.Uploads()})
    try:
        return _Server((host, port), handler, family)
    except OSError as exc:
        raise ValidationError(f"Cannot listen on {host}:{port}: {exc.strerror}; choose another --port.") from None
