"""The gsutil and gcloud storage that replicas get (aiptrain/storage/replica_tools), run as
replicas run them (the scripts, on google-cloud-storage) against the storage endpoint served in
this process: no Docker. Their command lines as the real tools read them."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer

import pytest

from aiptrain.storage.endpoint_server import OPEN_SCOPE, Handler, Tree, Uploads

TOOLS = __import__("pathlib").Path(__file__).parents[2] / "aiptrain" / "storage" / "replica_tools"
sys.path.insert(0, str(TOOLS))
from gcs_cli import parse  # noqa: E402

ALIASES = {"--recursive": "r", "--long": "l"}


@pytest.mark.parametrize(("command", "args", "expected"), [
    ("ls", ["-l", "gs://b/x.txt"], ({"l"}, {}, ["gs://b/x.txt"])),  # the long listing, not a location
    ("ls", ["-lr", "gs://b"], ({"l", "r"}, {}, ["gs://b"])),
    ("ls", ["--long", "gs://b"], ({"l"}, {}, ["gs://b"])),
    ("mb", ["-l", "us-central1", "gs://b"], (set(), {"l": "us-central1"}, ["gs://b"])),
    ("create", ["--location=us-east1", "gs://b"], (set(), {"l": "us-east1"}, ["gs://b"])),
    ("cp", ["-r", "-n", "a", "gs://b/"], ({"r", "n"}, {}, ["a", "gs://b/"])),
    ("rm", ["--recursive", "--", "-odd"], ({"r"}, {}, ["-odd"])),
])
def test_options_are_read_as_each_command_reads_them(command, args, expected):
    assert parse(args, ALIASES, command) == expected


@pytest.fixture
def endpoint_env(tmp_path):
    root = tmp_path / "gcs"
    (root / "data" / "dir").mkdir(parents=True)
    (root / "data" / "dir" / "x.txt").write_text("twelve bytes")
    (root / "models").mkdir()
    handler = type("TestHandler", (Handler,), {"tree": Tree(str(root)), "uploads": Uploads(), "scheme": "http",
                                         "fixed_scope": OPEN_SCOPE})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_GCE_CHECK": "true",
           "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{server.server_address[1]}"}
    yield env
    server.shutdown()
    server.server_close()


def tool(env, *argv):
    script = TOOLS / ("gsutil" if argv[0] == "gsutil" else "gcloud")
    return subprocess.run([sys.executable, str(script), *argv[1:]], env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("argv", [("gsutil", "ls"), ("gsutil", "ls", "gs://"), ("gcloud", "storage", "ls", "gs://"),
                                  ("gcloud", "storage", "buckets", "list")])
def test_listing_without_a_bucket_lists_the_buckets(endpoint_env, argv):
    result = tool(endpoint_env, *argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["gs://data/", "gs://models/"]


@pytest.mark.parametrize("argv", [("gsutil", "ls", "-l", "gs://data/dir/x.txt"),
                                  ("gcloud", "storage", "ls", "--long", "gs://data/dir/x.txt")])
def test_a_long_listing_names_the_object_with_its_size(endpoint_env, argv):
    result = tool(endpoint_env, *argv)
    assert result.returncode == 0, result.stderr
    size, _updated, url = result.stdout.split()
    assert (size, url) == ("12", "gs://data/dir/x.txt")


def test_mb_still_takes_a_location(endpoint_env):
    result = tool(endpoint_env, "gsutil", "mb", "-l", "us-central1", "gs://new-bucket")
    assert result.returncode == 0, result.stderr
    assert "gs://new-bucket/" in tool(endpoint_env, "gsutil", "ls").stdout.split()
