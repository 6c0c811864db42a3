"""Projects own buckets (issue: a team server that keeps teams apart): through the API's door
with the real google-cloud-storage client, two teams as a tokens file names them; the rules
themselves as a table; and a submit naming another project's bucket refused in one line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from google.api_core.exceptions import Forbidden, NotFound
from google.oauth2.credentials import Credentials

from aiptrain.api.access import load_tokens
from aiptrain.api.app import App
from aiptrain.api.server import make_server
from aiptrain.errors import ValidationError
from aiptrain.settings import Settings
from aiptrain.storage.endpoint_server import OPEN_SCOPE, SCOPES, Scope, Tree
from aiptrain.storage.projects import check_buckets, project_credential

from conftest import SAMPLE_TRAINER, wait_for
from test_rest_api import raw

ALICE, BOB, CAROL, ADMIN = "a" * 24, "b" * 24, "c" * 24, "z" * 24
TOKENS = [
    {"name": "alice", "token": ALICE, "projects": ["team-a"]},
    {"name": "bob", "token": BOB, "projects": ["team-b"], "buckets": [{"name": "reference-sets", "readOnly": True}]},
    {"name": "carol", "token": CAROL, "projects": ["team-b"], "buckets": ["scratch"]},
    {"name": "admin", "token": ADMIN, "projects": ["*"], "readOnly": True},
]


@pytest.mark.parametrize("scope, owner, write, allowed", [
    (Scope("a", ["team-a"]), "team-a", True, True),
    (Scope("a", ["team-a"]), "team-b", False, False),
    (Scope("a", ["team-a"], read_only=True), "team-a", True, False),
    (Scope("a", ["team-a"], read_only=True), "team-a", False, True),
    (Scope("a", ["team-a"]), None, False, False),  # a bucket of no project on a team server: nobody's
    (Scope("a", ["team-a"], unowned=True), None, True, True),  # ...and everybody's on a tree of one user
    (Scope("a", ["team-a"], {"shared": False}), "team-b", False, True),  # shared read-only: read
    (Scope("a", ["team-a"], {"shared": False}), "team-b", True, False),  # ...never written
    (Scope("a", ["team-a"], {"shared": True}), "team-b", True, True),
    (Scope("a", [Scope.ANY]), "team-b", True, True),
    (Scope("a", [Scope.ANY]), None, True, True),
    (OPEN_SCOPE, "team-b", True, True),
])
def test_who_may_use_a_bucket(scope, owner, write, allowed):
    assert scope.may("shared" if scope.shared else "data", owner, write) is allowed


@pytest.mark.parametrize("projects, asked, made_for", [
    (["team-a"], None, "team-a"),  # the caller's only project
    (["team-a", "team-b"], "team-b", "team-b"),
    ([Scope.ANY], None, None),  # of no project: an installation's administrator
])
def test_the_project_a_new_bucket_goes_to(projects, asked, made_for):
    assert Scope("x", projects).project_for_new_bucket(asked) == made_for


def test_a_bucket_for_a_project_the_caller_cannot_use_is_refused():
    with pytest.raises(Exception, match="storage.buckets.create access to the Google Cloud project team-b"):
        Scope("x", ["team-a"]).project_for_new_bucket("team-b")
    with pytest.raises(Exception, match="Required parameter: project"):
        Scope("x", ["team-a", "team-b"]).project_for_new_bucket(None)


@pytest.fixture
def teams(home, tmp_path):
    """`aiptrain serve --tokens` for two teams (in this process): a client per token."""
    from google.cloud import storage

    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(json.dumps(TOKENS))
    access = load_tokens(tokens)
    server = make_server(App(Settings(), access), "127.0.0.1", 0)
    Tree(str(Settings().gcs_root)).mark_team()  # what `aiptrain serve --tokens` does at its start
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    def client(token: str, project: str) -> storage.Client:
        return storage.Client(project=project, credentials=Credentials(token), client_options={"api_endpoint": url})

    yield client, url
    server.shutdown()
    server.server_close()
    thread.join()


def test_one_team_never_reads_lists_or_overwrites_anothers_bucket(teams):
    client, url = teams
    alice, bob = client(ALICE, "team-a"), client(BOB, "team-b")
    alice.create_bucket("team-a-data")
    alice.bucket("team-a-data").blob("pkg/trainer-0.1.tar.gz").upload_from_string(b"alice's trainer")
    bob.create_bucket("team-b-data")
    theirs = bob.bucket("team-a-data")
    with pytest.raises(Forbidden, match="serviceAccount:bob does not have storage.objects.get access"):
        theirs.blob("pkg/trainer-0.1.tar.gz").download_as_bytes()
    with pytest.raises(Forbidden, match="storage.objects.list access"):
        list(bob.list_blobs("team-a-data"))
    with pytest.raises(Forbidden, match="storage.objects.create access"):
        theirs.blob("pkg/trainer-0.1.tar.gz").upload_from_string(b"bob's code")
    with pytest.raises(Forbidden):
        theirs.blob("pkg/trainer-0.1.tar.gz").delete()
    assert alice.bucket("team-a-data").blob("pkg/trainer-0.1.tar.gz").download_as_bytes() == b"alice's trainer"
    # Each lists its own project's buckets; another project's list is refused.
    assert [b.name for b in alice.list_buckets()] == ["team-a-data"]
    assert [b.name for b in bob.list_buckets()] == ["team-b-data"]
    with pytest.raises(Forbidden, match="storage.buckets.list access to the Google Cloud project team-a"):
        list(bob.list_buckets(project="team-a"))
    # A name taken by another project is not available, as on Cloud Storage.
    code, body = raw(url, "POST", "/storage/v1/b?project=team-b", json.dumps({"name": "team-a-data"}).encode(),
                     headers={"Authorization": f"Bearer {BOB}", "Content-Type": "application/json"})
    assert code == 409 and "not available" in body["error"]["message"]
    with pytest.raises(NotFound):  # what does not exist is 404 to anyone
        bob.bucket("no-such-bucket").blob("x").download_as_bytes()


def test_a_bucket_shared_by_the_tokens_file_is_shared_as_it_says(teams):
    client, _ = teams
    admin_writes = client(ALICE, "team-a")
    for name in ("reference-sets", "scratch"):
        admin_writes.create_bucket(name)
        admin_writes.bucket(name).blob("data.csv").upload_from_string(b"1,2\n")
    bob, carol = client(BOB, "team-b"), client(CAROL, "team-b")
    assert bob.bucket("reference-sets").blob("data.csv").download_as_bytes() == b"1,2\n"
    with pytest.raises(Forbidden):
        bob.bucket("reference-sets").blob("data.csv").upload_from_string(b"changed")
    carol.bucket("scratch").blob("out.csv").upload_from_string(b"3,4\n")
    with pytest.raises(Forbidden):
        carol.bucket("reference-sets").blob("data.csv").download_as_bytes()  # shared with bob's token only
    admin = client(ADMIN, "team-a")  # "*" read-only: reads every project's buckets, writes none
    assert admin.bucket("scratch").blob("out.csv").download_as_bytes() == b"3,4\n"
    with pytest.raises(Forbidden, match="read-only"):
        admin.bucket("scratch").blob("x").upload_from_string(b"no")
    with pytest.raises(Forbidden, match="read-only"):
        admin.bucket("never-made").blob("x").upload_from_string(b"no")  # no bucket made for a read-only caller
    assert not (Settings().gcs_root / "never-made").exists()


def test_a_job_credential_reaches_its_projects_buckets_only(home, tmp_path):
    """The endpoint replicas reach (in this process): a job of team-b carries its project's
    credential, refreshed as google-auth does it, and gets 403 for team-a's bucket."""
    from http.server import ThreadingHTTPServer

    from google.cloud import storage

    from aiptrain.storage.endpoint_server import Handler, Uploads

    gcs = tmp_path / "gcs"
    tree = Tree(str(gcs))
    tree.create_bucket("team-a-data", "team-a")
    tree.create_bucket("team-b-data", "team-b")
    credential = project_credential(tmp_path / "tls", gcs, "team-b", (("shared-set", False),))
    assert tree.read_record(SCOPES, hashlib.sha256(credential.token.encode()).hexdigest())
    assert project_credential(tmp_path / "tls", gcs, "team-b").token == credential.token  # one per project
    assert project_credential(tmp_path / "tls", gcs, "team-a").token != credential.token
    handler = type("H", (Handler,), {"tree": tree, "uploads": Uploads(), "scheme": "http"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        # The credentials file as google-auth reads it in a replica (its token_uri: the endpoint).
        info = json.loads(Path(credential.file).read_text())
        from google.auth.transport.requests import Request
        from google.oauth2.credentials import Credentials as UserCredentials

        assert info["token_uri"] == "https://oauth2.googleapis.com/token"  # which google-auth always takes
        user = UserCredentials(None, refresh_token=info["refresh_token"], client_id=info["client_id"],
                               client_secret=info["client_secret"], token_uri=f"{url}/token")
        user.refresh(Request())
        assert user.token == credential.token
        job = storage.Client(project="team-b", credentials=user, client_options={"api_endpoint": url})
        job.bucket("team-b-data").blob("model/model.bst").upload_from_string(b"model")
        with pytest.raises(Forbidden, match="team-b@aiptrain-jobs does not have storage.objects.get access"):
            job.bucket("team-a-data").blob("x").download_as_bytes()
        job.bucket("team-b-new").blob("x").upload_from_string(b"x")  # made by its first write, for team-b
        assert tree.owner_of("team-b-new") == "team-b"
        for headers in ({}, {"Authorization": "Bearer aiptrain-local"}):  # anonymous, or a token of no job
            code, body = raw(url, "GET", "/storage/v1/b/team-b-data/o", headers=headers)
            assert code == 401
    finally:
        server.shutdown()
        server.server_close()


def test_a_submit_naming_another_projects_bucket_is_refused_in_one_line(run, home):
    gcs = Settings().gcs_root
    Tree(str(gcs)).create_bucket("team-a-data", "team-a")
    with pytest.raises(ValidationError, match=r"bucket \[team-a-data\] of project \[team-a\]; a job of project "):
        check_buckets(gcs, "team-b", ["gs://team-a-data/jobs/1"])
    check_buckets(gcs, "team-a", ["gs://team-a-data/jobs/1", "gs://not-yet-made/x"])
    code, out, err = run("jobs", "submit", "training", "refused_job", "--package-path", str(SAMPLE_TRAINER),
                         "--module-name", "trainer.task", "--job-dir", "gs://team-a-data/jobs/1", "--project",
                         "team-b", "--runtime-version", "minimal", "--region", "us-central1")
    assert (code, out) == (2, ""), err
    assert err.startswith("ERROR: [gs://team-a-data/jobs/1] is in bucket [team-a-data] of project [team-a]")
    assert err.count("\n") == 1
    assert run("jobs", "list")[1:] == ("", "Listed 0 items.\n")  # nothing half-created


def test_a_team_server_says_once_which_buckets_belong_to_no_project(home, tmp_path):
    gcs = Settings().gcs_root
    (gcs / "old-data").mkdir(parents=True)
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(json.dumps(TOKENS))
    log = tmp_path / "serve.log"
    with log.open("w") as output:
        process = subprocess.Popen([sys.executable, "-m", "aiptrain", "serve", "--port", "0", "--tokens", str(tokens)],
                                   env=os.environ, stdout=subprocess.DEVNULL, stderr=output)
    try:
        wait_for(lambda: "Serving" in log.read_text(), what="the server to start")
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert ("WARNING: 1 bucket(s) belong to no project (old-data): no token of this team server may use them until "
            "they are assigned: `aiptrain buckets assign BUCKET... --project PROJECT`.") in log.read_text()
    assert Tree(str(gcs)).team
