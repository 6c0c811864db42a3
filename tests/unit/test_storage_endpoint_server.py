"""The storage endpoint's protocol over a plain directory tree, in this process (no Docker): what
TensorFlow's GCS filesystem sends (chunked resumable uploads, XML-API ranged reads, rewrite),
what google-cloud-storage does, and the rules that keep a root-run host safe from a trainer's
files (no link followed, regular files only, no name leaves the tree)."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import ssl
import threading
from http.server import ThreadingHTTPServer

import pytest

from aiptrain.storage.endpoint_server import (
    OPEN_SCOPE,
    SCOPES,
    Handler,
    Tree,
    Uploads,
    checksums,
    multipart_boundary,
    multipart_parts,
    object_parts,
    parse_range,
)

JOB_TOKEN = "aiptrain-job-token-of-team-a"
AS_JOB = {"Authorization": f"Bearer {JOB_TOKEN}"}


@pytest.fixture
def endpoint(tmp_path):
    root = tmp_path / "gcs"
    root.mkdir()
    handler = type("TestHandler", (Handler,), {"tree": Tree(str(root)), "uploads": Uploads(), "scheme": "http",
                                         "fixed_scope": OPEN_SCOPE})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, server.server_address[1]
    server.shutdown()
    server.server_close()


def request(port: int, method: str, path: str, body=None, headers: dict | None = None, chunked: bool = False):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, dict(response.getheaders()), data


@pytest.fixture
def client(endpoint, monkeypatch):
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{endpoint[1]}")
    return storage.Client(project="test")


def test_a_chunked_resumable_upload_stores_the_bytes_not_the_framing(endpoint):
    root, port = endpoint
    (root / "bkt").mkdir()
    status, headers, _ = request(port, "POST", "/upload/storage/v1/b/bkt/o?uploadType=resumable&name=ckpt%2Fmodel.index",
                                 body=b"", headers={"Content-Length": "0"})
    assert status == 200
    session = "/" + headers["Location"].split("/", 3)[3]
    payload = [b"written by tf\n" * 50, b"second chunk\n"]
    total = sum(len(p) for p in payload)
    status, _, body = request(port, "PUT", session, body=iter(payload),
                              headers={"Content-Range": f"bytes 0-{total - 1}/{total}",
                                       "Transfer-Encoding": "chunked"}, chunked=True)
    assert status == 200, body
    assert (root / "bkt" / "ckpt" / "model.index").read_bytes() == b"".join(payload)
    resource = json.loads(body)
    assert resource["size"] == str(total) and resource["crc32c"] == checksums(str(root / "bkt/ckpt/model.index"))["crc32c"]


# gcloud 528's apitools: the boundary in Python's repr (single quotes), lines ending in LF alone,
# a media part that keeps its own last newline (seen with `gcloud storage cp --log-http`).
GCLOUD_BOUNDARY = "===============9038652523444828921=="
GCLOUD_BODY = (f"--{GCLOUD_BOUNDARY}\nContent-Type: application/json\nMIME-Version: 1.0\n\n"
               '{"bucket": "bkt", "contentType": "text/plain", "name": "f.txt"}\n'
               f"--{GCLOUD_BOUNDARY}\nContent-Type: text/plain\nMIME-Version: 1.0\nContent-Transfer-Encoding: binary\n\n"
               f"hello\r\n\n\n--{GCLOUD_BOUNDARY}--\n").encode()


@pytest.mark.parametrize("content_type, boundary", [
    (f"multipart/related; boundary='{GCLOUD_BOUNDARY}'", GCLOUD_BOUNDARY.encode()),  # gcloud's apitools
    ('multipart/related; boundary="==0123=="', b"==0123=="),  # google-cloud-storage
    ("multipart/related; boundary=abc; charset=x", b"abc"),
    ("Multipart/Related;BOUNDARY=abc", b"abc"),
    ("multipart/related", None),
    ("multipart/related; boundary=''", None),
])
def test_multipart_boundaries_quoted_every_way_clients_quote_them(content_type, boundary):
    assert multipart_boundary(content_type) == boundary


@pytest.mark.parametrize("content_type, body, expected", [
    (f"multipart/related; boundary='{GCLOUD_BOUNDARY}'", GCLOUD_BODY,
     [b'{"bucket": "bkt", "contentType": "text/plain", "name": "f.txt"}', b"hello\r\n\n"]),
    ('multipart/related; boundary="b1"',  # CRLF lines, as google-cloud-storage writes them
     b'--b1\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n{"name": "x"}\r\n'
     b"--b1\r\ncontent-type: application/octet-stream\r\n\r\n\x00\r\n\r\ndata\r\n--b1--",
     [b'{"name": "x"}', b"\x00\r\n\r\ndata"]),
    ("multipart/related; boundary=b2",  # an empty media part, and a base64 one
     b"--b2\n\n{}\n--b2\nContent-Transfer-Encoding: base64\n\naGk=\n--b2\nContent-Type: x/y\n\n\n--b2--\n",
     [b"{}", b"hi", b""]),
    ("multipart/related; boundary=b3", b"no delimiter at all", []),
    ("application/json", b"--b3\n\n{}\n--b3--", []),
])
def test_multipart_parts_as_each_client_writes_them(content_type, body, expected):
    assert [payload for _, payload in multipart_parts(content_type, body)] == expected


def test_gcloud_storage_uploads_multipart_and_resumable_under_its_own_paths(endpoint):
    root, port = endpoint
    (root / "bkt").mkdir()
    status, _, body = request(port, "POST", "/upload/storage/v1/b/bkt/o?alt=json&uploadType=multipart", body=GCLOUD_BODY,
                              headers={"Content-Type": f"multipart/related; boundary='{GCLOUD_BOUNDARY}'"})
    assert status == 200, body
    assert (root / "bkt" / "f.txt").read_bytes() == b"hello\r\n\n" and json.loads(body)["size"] == "8"
    status, headers, _ = request(port, "POST", "/resumable/upload/storage/v1/b/bkt/o?alt=json&uploadType=resumable",
                                 body=b'{"name": "big.bin"}', headers={"Content-Type": "application/json"})
    assert status == 200
    session = "/" + headers["Location"].split("/", 3)[3]
    status, _, body = request(port, "PUT", session, body=b"0123456789", headers={"Content-Range": "bytes 0-9/10"})
    assert status == 200 and (root / "bkt" / "big.bin").read_bytes() == b"0123456789"


def test_resumable_uploads_in_content_range_pieces_report_progress_with_308(endpoint):
    root, port = endpoint
    status, headers, _ = request(port, "POST", "/upload/storage/v1/b/new-bucket/o?uploadType=resumable",
                                 body=json.dumps({"name": "big.bin"}).encode(),
                                 headers={"Content-Type": "application/json"})
    session = "/" + headers["Location"].split("/", 3)[3]
    status, headers, _ = request(port, "PUT", session, body=b"a" * 10, headers={"Content-Range": "bytes 0-9/*"})
    assert status == 308 and headers["Range"] == "bytes=0-9"
    status, headers, _ = request(port, "PUT", session, body=b"", headers={"Content-Range": "bytes */*"})
    assert status == 308 and headers["Range"] == "bytes=0-9"
    status, _, _ = request(port, "PUT", session, body=b"b" * 5, headers={"Content-Range": "bytes 10-14/15"})
    assert status == 200
    assert (root / "new-bucket" / "big.bin").read_bytes() == b"a" * 10 + b"b" * 5  # the first write made the bucket
    assert os.listdir(root / ".aiptrain-uploads") == []


def test_ranged_reads_through_both_apis(endpoint):
    root, port = endpoint
    (root / "bkt" / "d").mkdir(parents=True)
    (root / "bkt" / "d" / "f.txt").write_bytes(b"0123456789")
    status, headers, body = request(port, "GET", "/bkt/d/f.txt", headers={"Range": "bytes=2-4"})
    assert (status, body, headers["Content-Range"]) == (206, b"234", "bytes 2-4/10")
    status, _, body = request(port, "GET", "/storage/v1/b/bkt/o/d%2Ff.txt?alt=media", headers={"Range": "bytes=-3"})
    assert (status, body) == (206, b"789")
    assert request(port, "GET", "/bkt/d/f.txt", headers={"Range": "bytes=10-"})[0] == 416  # TensorFlow's end of file
    assert request(port, "GET", "/download/storage/v1/b/bkt/o/d%2Ff.txt?alt=media")[2] == b"0123456789"


@pytest.mark.parametrize("header, size, expected", [
    ("bytes=0-", 5, (0, 4)), ("bytes=3-100", 5, (3, 4)), ("bytes=-2", 5, (3, 4)), (None, 5, None), ("items=1-2", 5, None),
])
def test_range_headers(header, size, expected):
    assert parse_range(header, size) == expected


def test_google_cloud_storage_lists_pages_copies_rewrites_and_deletes(client, endpoint):
    root, _ = endpoint
    bucket = client.create_bucket("data-bucket")
    for name in ("a/1.csv", "a/2.csv", "a/sub/3.csv", "top.txt"):
        bucket.blob(name).upload_from_string(name.encode())
    assert [b.name for b in client.list_blobs("data-bucket", page_size=1)] == ["a/1.csv", "a/2.csv", "a/sub/3.csv",
                                                                               "top.txt"]
    listing = client.list_blobs("data-bucket", prefix="a/", delimiter="/")
    assert [b.name for b in listing] == ["a/1.csv", "a/2.csv"] and listing.prefixes == {"a/sub/"}
    bucket.copy_blob(bucket.blob("top.txt"), bucket, "copied.txt")
    bucket.blob("rewritten.txt").rewrite(bucket.blob("a/1.csv"))
    assert (root / "data-bucket" / "rewritten.txt").read_bytes() == b"a/1.csv"
    bucket.blob("a/sub/3.csv").delete()
    assert not (root / "data-bucket" / "a" / "sub").exists()  # no object implies that "directory" any more
    assert bucket.get_blob("copied.txt").size == len(b"top.txt")
    big = os.urandom(3 << 20)
    blob = bucket.blob("big.bin")
    blob.chunk_size = 1 << 20  # resumable, in pieces, checked by the client against crc32c
    blob.upload_from_string(big)
    assert bucket.blob("big.bin").download_as_bytes() == big


def test_a_directory_marker_is_a_directory_and_empty_ones_are_listed(client, endpoint):
    root, port = endpoint
    (root / "bkt").mkdir()
    status, _, _ = request(port, "POST", "/upload/storage/v1/b/bkt/o?uploadType=media&name=run%2Flogs%2F&ifGenerationMatch=0",
                           body=b"")
    assert status == 200 and (root / "bkt" / "run" / "logs").is_dir()
    assert [b.name for b in client.list_blobs("bkt", prefix="run/")] == ["run/logs/"]
    status, _, _ = request(port, "POST", "/upload/storage/v1/b/bkt/o?uploadType=media&name=x&ifGenerationMatch=0",
                           body=b"1")
    assert status == 200
    assert request(port, "POST", "/upload/storage/v1/b/bkt/o?uploadType=media&name=x&ifGenerationMatch=0",
                   body=b"2")[0] == 412  # exists already: TensorFlow's "create only"


@pytest.mark.parametrize("name", ["../escape", "a/../../b", "a//b", "./x", ".aiptrain-uploads/x", ""])
def test_names_a_tree_cannot_hold_as_given_are_refused(name):
    from aiptrain.storage.endpoint_server import ApiError

    with pytest.raises(ApiError) as caught:
        object_parts(name)
    assert caught.value.code == 400


def test_links_and_special_files_a_trainer_planted_are_never_followed_or_opened(endpoint, tmp_path):
    root, port = endpoint
    secret = tmp_path / "secret.txt"
    secret.write_text("root only")
    (root / "bkt" / "d").mkdir(parents=True)
    (root / "bkt" / "link.txt").symlink_to(secret)
    (root / "bkt" / "linkdir").symlink_to(tmp_path)
    (root / "bkt" / "d" / "ok.txt").write_text("fine")
    os.mkfifo(root / "bkt" / "fifo")
    for path in ("/bkt/link.txt", "/bkt/linkdir/secret.txt", "/bkt/fifo", "/storage/v1/b/bkt/o/link.txt"):
        status, _, body = request(port, "GET", path)
        assert status == 404 and b"root only" not in body, path
    status, _, body = request(port, "GET", "/storage/v1/b/bkt/o")
    assert [item["name"] for item in json.loads(body)["items"]] == ["d/ok.txt"]
    status, _, _ = request(port, "POST", "/upload/storage/v1/b/bkt/o?uploadType=media&name=linkdir%2Fplanted",
                           body=b"x")
    assert status == 409 and not (tmp_path / "planted").exists()
    assert request(port, "GET", "/storage/v1/b/.aiptrain-uploads")[0] == 400


def test_a_batch_of_deletes_as_gcsfs_sends_it(endpoint):
    root, port = endpoint
    (root / "bkt" / "d").mkdir(parents=True)
    for name in ("1.csv", "2.csv"):
        (root / "bkt" / "d" / name).write_text("x")
    part = ("\n--==b==\nContent-Type: application/http\nContent-Transfer-Encoding: binary\nContent-ID: <x+{i}>\n\n"
            "DELETE /storage/v1/b/bkt/o/{key} HTTP/1.1\nContent-Type: application/json\ncontent-length: 0\n")
    body = "".join(part.format(i=i, key=key) for i, key in enumerate(["d%2F1.csv", "d%2F2.csv", "d%2Fnone"]))
    status, headers, data = request(port, "POST", "/batch/storage/v1", body=(body + "\n--==b==--").encode(),
                                    headers={"Content-Type": 'multipart/mixed; boundary="==b=="'})
    boundary = headers["Content-Type"].split("=", 1)[1]
    answers = data.decode().split(boundary)[1:-1]
    assert status == 200 and [a.split("HTTP/1.1 ")[1][:3] for a in answers] == ["204", "204", "404"]
    assert not (root / "bkt" / "d").exists()


@pytest.fixture
def endpoint_as_another_user():
    """The endpoint serving a tree it may write, except the bucket `by-hand`, made as another
    user (root, or read-only when these tests do not run as root) as someone staging data by
    hand would. As root the server runs as the replicas' user, `nobody`, as aiptrain runs it."""
    import shutil
    import socket
    import subprocess
    import sys
    import tempfile

    from conftest import wait_for

    # Not under tmp_path: `nobody` may not pass through pytest's directories (nor read the
    # checkout, under /root say), so the tree and a copy of the server file go to a fresh directory.
    base = tempfile.mkdtemp(prefix="aiptrain-endpoint-")
    root = os.path.join(base, "gcs")
    server = None
    try:
        os.chmod(base, 0o755)
        os.makedirs(os.path.join(root, "by-hand", "data"))
        os.makedirs(os.path.join(root, "ours"))
        Tree(root, (65534, 65534) if os.geteuid() == 0 else None).write_record(SCOPES, hashlib.sha256(JOB_TOKEN.encode()).hexdigest(),
                                json.dumps({"project": "team-a"}))  # the credential of a job of team-a
        server_file = shutil.copy(sys.modules[Handler.__module__].__file__, os.path.join(base, "server.py"))
        os.chmod(server_file, 0o644)
        if os.geteuid() == 0:
            for path in (root, os.path.join(root, "ours")):
                os.chown(path, 65534, 65534)
            user = 65534
            # The server is standard library only: the system's Python, which `nobody` may run.
            python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
        else:
            for path in (os.path.join(root, "by-hand", "data"), os.path.join(root, "by-hand")):
                os.chmod(path, 0o555)
            user, python = None, sys.executable
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = subprocess.Popen([python, server_file, "--root", root, "--port", str(port)], user=user,
                                  stderr=subprocess.DEVNULL)

        def answering() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return server.poll() is not None  # exited: let the test's request show why

        wait_for(answering, what="the endpoint to listen")
        yield root, port
    finally:
        if server is not None:
            server.kill()
            server.wait()
        for path in (os.path.join(root, "by-hand"), os.path.join(root, "by-hand", "data")):
            if os.path.isdir(path):
                os.chmod(path, 0o755)
        shutil.rmtree(base)


@pytest.mark.parametrize("name", ["model.bin", "data/model.bin", "jobs/run1/model.bin"])
def test_a_write_the_endpoint_may_not_make_is_refused_at_once_with_403_naming_the_fix(endpoint_as_another_user, name):
    """Not a 500 (TensorFlow retries those for minutes) nor a 409 about object names."""
    root, port = endpoint_as_another_user
    status, _, body = request(port, "POST", f"/upload/storage/v1/b/by-hand/o?uploadType=media&name={name}",
                              body=b"weights", headers=AS_JOB)
    assert status == 403, body
    message = json.loads(body)["error"]["message"]
    assert "may not write here" in message and "aiptrain's gsutil" in message and "chown" in message
    assert not os.path.exists(os.path.join(root, "by-hand", name))
    assert os.listdir(os.path.join(root, ".aiptrain-uploads")) == []  # the partial upload went
    status, _, body = request(port, "POST", f"/upload/storage/v1/b/ours/o?uploadType=media&name={name}", body=b"w",
                              headers=AS_JOB)
    assert status == 200, body


def test_a_request_before_the_server_accepts_waits_for_it_instead_of_being_refused(tmp_path, capfd):
    """Run as the endpoint, the server listens and says it serves before its imports
    (`listen_early`): replicas are started on that line and may ask at once."""
    from aiptrain.storage.endpoint_server import listen_early, serve

    root = tmp_path / "gcs"
    root.mkdir()
    listening = listen_early(["server.py", "--root", str(root), "--port", "0"])
    assert listening is not None and "serving" in capfd.readouterr().err
    port = listening.getsockname()[1]
    answered: dict[str, int] = {}
    asking = threading.Thread(target=lambda: answered.update(status=request(port, "GET", "/storage/v1/b?project=p")[0]))
    asking.start()
    asking.join(0.3)
    assert asking.is_alive() and not answered  # connected, and waiting: nothing accepts yet
    threading.Thread(target=serve, args=(str(root), port, None, None, listening), daemon=True).start()
    asking.join(10)
    assert answered == {"status": 401}  # answered (an anonymous caller's answer)


def test_a_client_that_connects_and_says_nothing_holds_up_no_other(tmp_path, capfd):
    """Each connection's TLS handshake is its own (a trainer that opens a connection and sends
    nothing used to hold up every replica's gs:// of the installation); a client that goes
    before its handshake, as a replica's wait for the endpoint does, leaves nothing in the log."""
    from aiptrain.storage.endpoint import prepare_files
    from aiptrain.storage.endpoint_server import listen_early, serve

    tls, root = tmp_path / "tls", tmp_path / "gcs"
    prepare_files(tls, root)
    cert, key = str(tls / "server.pem"), str(tls / "server.key")
    listening = listen_early(["server.py", "--root", str(root), "--port", "0", "--cert", cert, "--key", key])
    assert listening is not None
    port = listening.getsockname()[1]
    threading.Thread(target=serve, args=(str(root), port, cert, key, listening), daemon=True).start()
    socket.create_connection(("127.0.0.1", port)).close()
    with socket.create_connection(("127.0.0.1", port)):
        context = ssl.create_default_context(cafile=str(tls / "trust.pem"))
        connection = http.client.HTTPSConnection("localhost", port, context=context, timeout=5)
        connection.request("GET", "/storage/v1/b?project=p")
        assert connection.getresponse().status == 401  # answered: anonymous callers get nothing
        connection.close()
    assert "Traceback" not in capfd.readouterr().err
