"""`aiptrain serve`: the ml v1 projects.jobs API and Cloud Logging's entries.list, driven by the
real google-api-python-client with its bundled discovery documents against a server started
here on a free loopback port. Store-seeded jobs (ended, so nothing reconciles them) cover the
rules without Docker; real jobs on the minimal runtime cover create, poll, logs and cancel."""

from __future__ import annotations

import http.client
import json
import logging
import threading
from datetime import datetime, timedelta, timezone
from urllib.parse import urlsplit

import pytest
from google.auth.credentials import AnonymousCredentials
from google.auth.exceptions import RefreshError
from google.oauth2.credentials import Credentials
from googleapiclient import discovery
from googleapiclient.errors import HttpError

from aiptrain.api.access import Access, load_tokens
from aiptrain.api.app import App
from aiptrain.api.server import make_server
from aiptrain.client import Client
from aiptrain.errors import ValidationError
from aiptrain.logs import JobLogWriter
from aiptrain.model import Job, State
from aiptrain.settings import Settings

from conftest import wait_for

PROJECT, OTHER = "team-a", "team-b"
TOKENS = [
    {"name": "writer-a", "token": "a" * 24, "projects": [PROJECT], "readOnly": False},
    {"name": "reader-a", "token": "r" * 24, "projects": [PROJECT], "readOnly": True},
    {"name": "writer-b", "token": "b" * 24, "projects": [OTHER]},
]
WRITER_A, READER_A, WRITER_B = (entry["token"] for entry in TOKENS)


@pytest.fixture
def api_home(home, monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", PROJECT)  # jobs submitted without --project live here
    return home


@pytest.fixture
def serve(api_home):
    """start(access) -> the URL of a server on a free loopback port; stopped after the test."""
    servers = []

    def start(access: Access | None = None) -> str:
        server = make_server(App(Settings(), access), "127.0.0.1", 0)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text(json.dumps(TOKENS))
    return path


def ml_api(url: str, token: str | None = None):
    credentials = Credentials(token) if token else AnonymousCredentials()
    return discovery.build("ml", "v1", static_discovery=True, client_options={"api_endpoint": url},
                           credentials=credentials)


def logging_api(url: str, token: str | None = None):
    credentials = Credentials(token) if token else AnonymousCredentials()
    return discovery.build("logging", "v2", static_discovery=True, client_options={"api_endpoint": url},
                           credentials=credentials)


def refused(call) -> tuple[int, dict]:
    with pytest.raises(HttpError) as caught:
        call.execute()
    return caught.value.resp.status, json.loads(caught.value.content)["error"]


def raw(url: str, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, dict]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def seed(job_id: str, minutes_ago: int = 0, labels: dict | None = None, project: str | None = None,
         state: State = State.SUCCEEDED) -> None:
    """A job that ended, straight into the store (as `jobs submit` would leave it)."""
    with Client(settings=Settings(), project=project) as client:
        created = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(minutes=minutes_ago)
        client.store.create(Job(job_id=job_id, labels=labels, create_time=created), project=client.project)
        client.store.transition(client.key(job_id), state, [State.QUEUED])


# -- who may do what (pure) ---------------------------------------------------------------------

@pytest.mark.parametrize("content, message", [
    ("{}", "must be a non-empty list"),
    ("[]", "must be a non-empty list"),
    ("- token: short\n  name: x\n  projects: [p]", "at least 16 characters"),
    ("- token: aaaaaaaaaaaaaaaaaaaa\n  projects: [p]", "name is required"),
    ("- token: aaaaaaaaaaaaaaaaaaaa\n  name: x\n  projects: []", "projects must be a non-empty list"),
    ("- token: aaaaaaaaaaaaaaaaaaaa\n  name: x\n  projects: [p]\n  readOnly: maybe", "readOnly must be true or false"),
    ("- token: aaaaaaaaaaaaaaaaaaaa\n  name: x\n  projects: [p]\n  role: admin", "unknown key(s) role"),
    ("- {token: aaaaaaaaaaaaaaaaaaaa, name: x, projects: [p]}\n- {token: aaaaaaaaaaaaaaaaaaaa, name: y, projects: [q]}",
     "the same token appears twice"),
    ("- [unclosed", "cannot be read as YAML"),
])
def test_a_tokens_file_is_checked_entry_by_entry(tmp_path, content, message):
    path = tmp_path / "tokens.yaml"
    path.write_text(content)
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_tokens(path)


def test_serve_refuses_a_public_address_without_tokens_and_a_missing_tokens_file(run, tmp_path):
    code, out, err = run("serve", "--host", "0.0.0.0", "--port", "0")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "ERROR: --host [0.0.0.0] is not a loopback address: listening there needs --tokens FILE (who may use which "
        "projects), or use --host 127.0.0.1."]
    code, _, err = run("serve", "--tokens", str(tmp_path / "absent.yaml"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "does not exist" in err


def test_tokens_decide_who_sees_and_changes_which_project(serve, tokens_file, caplog):
    seed("job_a", labels={"k": "v"})
    seed("job_b", project=OTHER)
    url = serve(load_tokens(tokens_file))
    name_a = f"projects/{PROJECT}/jobs/job_a"
    caplog.set_level(logging.WARNING, logger="aiptrain.api")

    # A 401 makes google-auth try to refresh the credentials, which a fixed token cannot: the
    # client raises. The answer itself is Google's.
    code, answer = raw(url, "GET", f"/v1/{name_a}")
    assert (code, answer["error"]["status"]) == (401, "UNAUTHENTICATED")
    assert "Authorization: Bearer" in answer["error"]["message"]
    code, answer = raw(url, "GET", f"/v1/{name_a}", headers={"Authorization": "Bearer not-a-token-at-all"})
    assert (code, answer["error"]["status"]) == (401, "UNAUTHENTICATED")
    with pytest.raises(RefreshError):
        ml_api(url, "not-a-token-at-all").projects().jobs().get(name=name_a).execute()
    code, error = refused(ml_api(url, WRITER_B).projects().jobs().get(name=name_a))
    assert (code, error["status"]) == (403, "PERMISSION_DENIED")
    code, error = refused(ml_api(url, WRITER_B).projects().jobs().list(parent=f"projects/{PROJECT}"))
    assert code == 403
    code, error = refused(ml_api(url, READER_A).projects().jobs().patch(
        name=name_a, updateMask="labels", body={"labels": {"k": "w"}}))
    assert (code, error["status"]) == (403, "PERMISSION_DENIED") and "read-only" in error["message"]
    assert Client().get("job_a").labels == {"k": "v"}  # nothing changed

    writer = ml_api(url, WRITER_A).projects().jobs()
    for field, value in (("packageUris", ["/etc/passwd"]), ("jobDir", "/etc")):
        body = {"jobId": "fresh", "trainingInput": {"pythonModule": "m", "packageUris": ["gs://b/p.tar.gz"],
                                                    field: value}}
        code, error = refused(writer.create(parent=f"projects/{PROJECT}", body=body))
        assert code == 400 and f"{field} [" in error["message"] and "not a gs:// URI" in error["message"]
    assert Client().job_ids() == ["job_a"] and Client(project=OTHER).job_ids() == ["job_b"]  # nothing created

    assert ml_api(url, READER_A).projects().jobs().get(name=name_a).execute()["jobId"] == "job_a"
    listed_b = ml_api(url, WRITER_B).projects().jobs().list(parent=f"projects/{OTHER}").execute()
    assert [job["jobId"] for job in listed_b["jobs"]] == ["job_b"]  # team-a's job is not there
    code, _ = refused(ml_api(url, WRITER_B).projects().jobs().get(name=f"projects/{OTHER}/jobs/job_a"))
    assert code == 404  # a job of another project is as good as absent
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    assert len(refusals) == 6 and all(WRITER_B not in line for line in refusals)
    assert "no valid token" in refusals[0] and "writer-b" in refusals[3]


def test_iam_methods_answer_from_the_tokens_file(serve, tokens_file):
    seed("job_a")
    url = serve(load_tokens(tokens_file))
    name = f"projects/{PROJECT}/jobs/job_a"
    jobs = ml_api(url, READER_A).projects().jobs()
    policy = jobs.getIamPolicy(resource=name).execute()
    assert policy["bindings"] == [{"role": "roles/ml.developer", "members": ["serviceAccount:writer-a"]},
                                  {"role": "roles/ml.viewer", "members": ["serviceAccount:reader-a"]}]
    asked = {"permissions": ["ml.jobs.get", "ml.jobs.cancel", "ml.jobs.update"]}
    assert jobs.testIamPermissions(resource=name, body=asked).execute() == {"permissions": ["ml.jobs.get"]}
    writer = ml_api(url, WRITER_A).projects().jobs()
    assert writer.testIamPermissions(resource=name, body=asked).execute() == asked
    assert writer.setIamPolicy(resource=name, body={"policy": policy}).execute()["bindings"] == policy["bindings"]
    code, error = refused(writer.setIamPolicy(resource=name, body={"policy": {"bindings": []}}))
    assert (code, error["status"]) == (400, "FAILED_PRECONDITION") and "--tokens file" in error["message"]


# -- jobs: get, list, patch on store-seeded jobs (pure) -------------------------------------------

def test_get_is_describe_and_list_pages_with_a_filter(serve, run):
    for index in range(5):
        seed(f"job_{index}", minutes_ago=10 - index, labels={"kind": "even" if index % 2 == 0 else "odd"})
    seed("elsewhere", project=OTHER)
    jobs = ml_api(serve()).projects().jobs()

    got = jobs.get(name=f"projects/{PROJECT}/jobs/job_3").execute()
    code, described, _ = run("jobs", "describe", "job_3", "--format", "json")
    assert code == 0 and {key: value for key, value in got.items() if key != "etag"} == json.loads(described)
    assert got["etag"]

    pages, token = [], None
    while True:
        page = jobs.list(parent=f"projects/{PROJECT}", pageSize=2, pageToken=token).execute()
        pages.append([job["jobId"] for job in page.get("jobs", [])])
        token = page.get("nextPageToken")
        if not token:
            break
    assert pages == [["job_4", "job_3"], ["job_2", "job_1"], ["job_0"]]  # newest first, no other project's
    even = jobs.list(parent=f"projects/{PROJECT}", filter="labels.kind=even AND state=SUCCEEDED").execute()
    assert [job["jobId"] for job in even["jobs"]] == ["job_4", "job_2", "job_0"] and "nextPageToken" not in even
    assert jobs.list(parent="projects/empty-project").execute() == {}

    code, error = refused(jobs.get(name=f"projects/{PROJECT}/jobs/missing"))
    assert (code, error["status"]) == (404, "NOT_FOUND") and "[missing]" in error["message"]
    code, _ = refused(jobs.get(name=f"projects/{PROJECT}/jobs/elsewhere"))
    assert code == 404


def test_patch_sets_labels_with_an_etag_check(serve):
    seed("job_a", labels={"k": "v"})
    jobs = ml_api(serve()).projects().jobs()
    name = f"projects/{PROJECT}/jobs/job_a"
    etag = jobs.get(name=name).execute()["etag"]
    patched = jobs.patch(name=name, updateMask="labels,etag", body={"labels": {"k": "w", "n": "1"}, "etag": etag})
    patched = patched.execute()
    assert patched["labels"] == {"k": "w", "n": "1"} and patched["etag"] != etag
    assert Client().get("job_a").labels == {"k": "w", "n": "1"}  # what the CLI sees

    code, error = refused(jobs.patch(name=name, updateMask="labels,etag", body={"labels": {}, "etag": etag}))
    assert (code, error["status"]) == (409, "ABORTED")
    code, error = refused(jobs.patch(name=name, updateMask="state", body={"state": "FAILED"}))
    assert (code, error["status"]) == (400, "INVALID_ARGUMENT") and "only `labels`" in error["message"]
    code, error = refused(jobs.patch(name=name, updateMask="labels", body={"labels": {"Bad": "x"}}))
    assert code == 400 and "Invalid label key [Bad]" in error["message"]
    assert jobs.patch(name=name, updateMask="labels", body={}).execute().get("labels") is None  # cleared
    code, error = refused(jobs.cancel(name=name, body={}))
    assert (code, error["status"]) == (400, "FAILED_PRECONDITION")


def test_patch_of_a_job_deleted_meanwhile_is_not_found(serve, monkeypatch):
    seed("job_a", labels={"k": "v"})
    key = Client.key

    def found_then_deleted(self, job_id):  # another process deletes it after the check
        found = key(self, job_id)
        self.store.delete(found)
        return found

    monkeypatch.setattr(Client, "key", found_then_deleted)
    jobs = ml_api(serve()).projects().jobs()
    code, error = refused(jobs.patch(name=f"projects/{PROJECT}/jobs/job_a", updateMask="labels", body={}))
    assert (code, error["status"]) == (404, "NOT_FOUND")


def test_two_projects_each_see_only_their_own_job_of_one_id(serve, tokens_file):
    """Job IDs are unique per project, as on the service: team-a (the default project here, whose
    job keeps its ID as key) and team-b both have `census_1`, and every verb finds its own."""
    seed("census_1", labels={"team": "a"})
    seed("census_1", labels={"team": "b"}, project=OTHER, state=State.FAILED)
    seed("only_a")
    for project in (PROJECT, OTHER):
        with Client(project=project) as client:
            write_log(client.key("census_1"), [("2026-01-01T00:00:00Z", "master-replica-0", "INFO", f"{project} says")])
    url = serve(load_tokens(tokens_file))
    team = {PROJECT: ml_api(url, WRITER_A).projects().jobs(), OTHER: ml_api(url, WRITER_B).projects().jobs()}
    for project, state in ((PROJECT, "SUCCEEDED"), (OTHER, "FAILED")):
        jobs, name = team[project], f"projects/{project}/jobs/census_1"
        described = jobs.get(name=name).execute()
        assert (described["labels"], described["state"]) == ({"team": project[-1]}, state)
        listed = jobs.list(parent=f"projects/{project}").execute()["jobs"]
        assert [(job["jobId"], job["labels"]) for job in listed if job["jobId"] == "census_1"] == [
            ("census_1", {"team": project[-1]})]
        code, error = refused(jobs.cancel(name=name, body={}))  # its own job, which has ended
        assert code == 400 and f"has already ended ({state})" in error["message"]
        entries = logging_api(url, WRITER_A if project == PROJECT else WRITER_B).entries().list(body={
            "resourceNames": [f"projects/{project}"],
            "filter": 'resource.type="ml_job" AND resource.labels.job_id="census_1"'}).execute()
        assert [e["jsonPayload"]["message"] for e in entries["entries"]] == [f"{project} says"]
    patched = team[OTHER].patch(name=f"projects/{OTHER}/jobs/census_1", updateMask="labels",
                                body={"labels": {"team": "bee"}}).execute()
    assert patched["labels"] == {"team": "bee"} and Client().get("census_1").labels == {"team": "a"}
    assert [job["jobId"] for job in team[OTHER].list(parent=f"projects/{OTHER}").execute()["jobs"]] == ["census_1"]
    code, _ = refused(team[OTHER].get(name=f"projects/{OTHER}/jobs/only_a"))
    assert code == 404

    # A create of an ID its own project holds is 409; one only another project holds goes on (here
    # to the package, which is nowhere), and says nothing of the other project's job.
    body = {"trainingInput": {"pythonModule": "m", "region": "r", "packageUris": ["gs://no-such-bucket/p.tar.gz"]}}
    code, error = refused(team[OTHER].create(parent=f"projects/{OTHER}", body={"jobId": "census_1", **body}))
    assert (code, error["status"]) == (409, "ALREADY_EXISTS")
    code, error = refused(team[OTHER].create(parent=f"projects/{OTHER}", body={"jobId": "only_a", **body}))
    assert code != 409 and "exists" not in error["message"] and PROJECT not in error["message"]
    assert Client(project=OTHER).job_ids() == ["census_1"] and Client().get("only_a").state is State.SUCCEEDED


# -- malformed requests (pure) --------------------------------------------------------------------

JOBS = f"/v1/projects/{PROJECT}/jobs"
GOOD_BODY = {"jobId": "fresh", "trainingInput": {"pythonModule": "trainer.task", "packageUris": ["/nowhere.tar.gz"]}}


@pytest.mark.parametrize("method, path, body, headers, code, words", [
    ("POST", JOBS, b"{not json", {}, 400, "Invalid JSON payload"),
    ("POST", JOBS, b"[1, 2]", {}, 400, "must be a JSON object"),
    ("POST", JOBS, json.dumps({"jobId": "fresh", "trainingInputs": {}}).encode(), {}, 400, "trainingInputs"),
    ("POST", JOBS, json.dumps({"jobId": "fresh", "trainingInput": {"workerCount": True}}).encode(), {}, 400,
     "workerCount"),
    ("POST", JOBS, json.dumps({"trainingInput": {}}).encode(), {}, 400, "jobId is required"),
    ("POST", JOBS, json.dumps({**GOOD_BODY, "jobId": "9lives"}).encode(), {}, 400, "job"),
    ("POST", JOBS, b"[" * 100_000 + b"]" * 100_000, {}, 400, "nests too deeply"),
    ("POST", JOBS, b" " * ((1 << 20) + 1), {}, 413, "larger than"),
    ("POST", JOBS + "?alt=media", json.dumps(GOOD_BODY).encode(), {}, 400, "alt=json"),
    ("POST", JOBS + "?dryRun=true", json.dumps(GOOD_BODY).encode(), {}, 400, "dryRun"),
    ("GET", f"/v1/projects/{PROJECT}/jobs/..%2F..%2Fetc", b"", {}, 400, "Invalid resource name"),
    ("GET", f"/v1/projects/{PROJECT}/jobs/../../etc/passwd", b"", {}, 400, "Invalid resource name"),
    ("GET", "/v1/projects/../jobs/x", b"", {}, 400, "Invalid resource name"),
    ("GET", f"/v1/projects/{PROJECT}/jobs/a%5Cb", b"", {}, 400, "Invalid resource name"),
    ("GET", f"/v1/projects/{PROJECT}/jobs/a%00b", b"", {}, 400, "Invalid resource name"),
    ("GET", f"/v1/projects/{PROJECT}/jobs/x.y", b"", {}, 400, "Invalid job name"),
    ("GET", f"/v1/projects/{PROJECT}/jobs/%ff", b"", {}, 400, "not UTF-8"),
    ("OPTIONS", JOBS, b"", {}, 501, "Unsupported method"),
    ("GET", "/v1/projects/bad%20project/jobs", b"", {}, 400, "Invalid project"),
    ("GET", JOBS + "?filter=state%3D(", b"", {}, 400, "ends too early"),
    ("GET", JOBS + "?pageSize=many", b"", {}, 400, "pageSize"),
    ("GET", JOBS + "?pageToken=garbage!", b"", {}, 400, "Invalid pageToken"),
    ("GET", JOBS + "?pageSize=1&pageSize=2", b"", {}, 400, "more than once"),
    ("POST", f"{JOBS}/x:explode", b"{}", {}, 404, "not found"),
    ("DELETE", f"{JOBS}/x", b"", {}, 404, "is not served"),
    ("GET", "/v1/projects/p/models", b"", {}, 404, "Models and versions (prediction) are not served by aiptrain"),
    ("POST", JOBS, b"{}", {"Transfer-Encoding": "chunked"}, 400, "Chunked"),
    ("POST", "/v2/entries:list", b"{}", {}, 400, "resourceNames is required"),
    ("POST", "/v2/entries:list", json.dumps({"resourceNames": [f"projects/{PROJECT}"], "filter": "severity>=ERROR"})
     .encode(), {}, 400, "must name one job"),
    ("POST", "/v2/entries:list", json.dumps({"resourceNames": [f"projects/{PROJECT}"],
                                            "filter": 'resource.labels.job_id="j" AND timestamp>"yesterday"'})
     .encode(), {}, 400, "not an RFC 3339 time"),
    ("POST", "/v2/entries:list", json.dumps({"resourceNames": ["organizations/1"], "filter": "x"}).encode(), {}, 400,
     "projects/PROJECT"),
    ("POST", "/v2/entries:list", json.dumps({"resourceNames": [f"projects/{PROJECT}"], "filter": 'a="b"',
                                            "orderBy": "severity"}).encode(), {}, 400, "must name one job"),
    ("POST", "/v2/entries:list", json.dumps({"resourceNames": [f"projects/{PROJECT}"], "limit": 3}).encode(), {},
     400, "Unknown name \"limit\""),
])
def test_malformed_requests_are_refused_and_create_nothing(serve, api_home, method, path, body, headers, code,
                                                           words):
    assert_refused_and_nothing_created(serve, api_home, method, path, body, headers, code, words)


def assert_refused_and_nothing_created(serve, api_home, method, path, body, headers, code, words) -> None:
    url = serve()
    if body and "Transfer-Encoding" not in headers:
        headers = {**headers, "Content-Length": str(len(body))}
    status, answer = raw(url, method, path, body, headers)
    assert status == code, answer
    assert set(answer) == {"error"} and answer["error"]["code"] == code and words in answer["error"]["message"]
    assert answer["error"]["status"] in ("INVALID_ARGUMENT", "NOT_FOUND", "UNIMPLEMENTED")
    with Client() as client:
        assert client.job_ids() == []
    assert not (api_home / "jobs").exists() or not any((api_home / "jobs").iterdir())


# -- Cloud Logging's entries.list (pure: a job log written here) -----------------------------------

def write_log(job_id: str, lines: list[tuple[str, str, str, str]]) -> None:
    """(stamp, task, severity, message) lines into the job's log, in the order given."""
    with JobLogWriter(Settings().job_paths(job_id).log) as writer:
        for stamp, task, severity, message in lines:
            writer.write(task, severity, message, stamp)


def test_entries_list_answers_stream_logs_filters_with_pages(serve, api_home):
    seed("logged")
    stamps = [f"2026-01-01T00:00:0{second}.{second}00000123Z" for second in range(6)]
    write_log("logged", [
        (stamps[0], "service", "INFO", "Job logged is queued."),
        *[(stamps[index], "master-replica-0", "INFO" if index % 2 else "ERROR", f"line {index}")
          for index in (1, 2, 4, 3)],  # a replica's line may reach the log after a later one
        (stamps[5], "worker-replica-0", "WARNING", "worker says"),
    ])
    entries_api = logging_api(serve()).entries()
    base = '(resource.type="ml_job" OR resource.type="cloudml_job") AND resource.labels.job_id="logged"'

    def listed(**body) -> dict:
        return entries_api.list(body={"resourceNames": [f"projects/{PROJECT}"], **body}).execute()

    everything = listed(filter=base, orderBy="timestamp asc")["entries"]
    assert [e["jsonPayload"]["message"] for e in everything] == [
        "Job logged is queued.", "line 1", "line 2", "line 3", "line 4", "worker says"]  # by timestamp
    first = everything[1]
    assert first["resource"] == {"type": "ml_job", "labels": {"project_id": PROJECT, "job_id": "logged",
                                                              "task_name": "master-replica-0"}}
    assert (first["severity"], first["timestamp"]) == ("INFO", stamps[1])

    task = base + ' AND (resource.labels.task_name="master-replica-0" OR labels.task_name="master-replica-0")'
    pages, token = [], None
    while True:
        page = listed(filter=task, pageSize=3, pageToken=token)
        pages.append([e["jsonPayload"]["message"] for e in page.get("entries", [])])
        token = page.get("nextPageToken")
        if not token:
            break
    assert pages == [["line 1", "line 2", "line 3"], ["line 4"]]

    later = listed(filter=f'{base} AND timestamp>"{stamps[2]}"')["entries"]  # to the microsecond
    assert [e["jsonPayload"]["message"] for e in later] == ["line 3", "line 4", "worker says"]
    errors = listed(filter=f"{base} AND severity=ERROR")["entries"]
    assert [e["jsonPayload"]["message"] for e in errors] == ["line 2", "line 4"]
    newest = listed(filter=base, orderBy="timestamp desc", pageSize=2)
    assert [e["jsonPayload"]["message"] for e in newest["entries"]] == ["worker says", "line 4"]
    rest = listed(filter=base, orderBy="timestamp desc", pageSize=10, pageToken=newest["nextPageToken"])
    assert [e["jsonPayload"]["message"] for e in rest["entries"]][0] == "line 3" and len(rest["entries"]) == 4
    assert listed(filter=base.replace('"logged"', '"absent"')) == {}
    other = entries_api.list(body={"resourceNames": [f"projects/{OTHER}"], "filter": base}).execute()
    assert other == {}  # the job lives in team-a


def test_entries_list_filters_on_timestamp_past_a_line_without_a_time(serve):
    seed("timeless")
    write_log("timeless", [("2026-01-01T00:00:01Z", "master-replica-0", "INFO", "stamped")])
    with Settings().job_paths("timeless").log.open("a") as log:
        log.write(json.dumps({"task": "master-replica-0", "message": "no time"}) + "\n")  # damaged, but JSON
    body = {"resourceNames": [f"projects/{PROJECT}"],
            "filter": 'resource.labels.job_id="timeless" AND timestamp>"2026-01-01T00:00:00Z"'}
    found = logging_api(serve()).entries().list(body=body).execute()["entries"]
    assert [e["jsonPayload"]["message"] for e in found] == ["stamped"]  # a line without a time is never after


def test_entries_list_follows_gcloud_s_log_fetcher(serve):
    """The filters gcloud's LogFetcher sends while it streams: a lower bound that moves past the
    last entry seen (with insertId for entries of the same timestamp), an upper bound 5 s ago."""
    seed("streamed")
    same = "2026-01-01T00:00:01.000000000Z"
    write_log("streamed", [("2026-01-01T00:00:00.500000Z", "master-replica-0", "INFO", "first"),
                           (same, "master-replica-0", "INFO", "twin a"), (same, "worker-replica-0", "INFO", "twin b")])
    entries_api = logging_api(serve()).entries()
    base = ['(resource.type="ml_job" OR resource.type="cloudml_job")', 'resource.labels.job_id="streamed"']
    upper = 'timestamp<"2026-01-01T00:00:05.000000+00:00"'

    def fetch(lower: str) -> list[dict]:
        body = {"resourceNames": [f"projects/{PROJECT}"], "orderBy": "timestamp asc", "pageSize": 1000,
                "filter": " AND ".join(base + [lower, upper])}
        return entries_api.list(body=body).execute().get("entries", [])

    seen = fetch('timestamp>="1970-01-01T01:00:00.000000000Z"')
    assert [e["jsonPayload"]["message"] for e in seen] == ["first", "twin a", "twin b"]
    a, b = seen[1], seen[2]
    assert a["timestamp"] == b["timestamp"] and a["insertId"] < b["insertId"]
    after_a = fetch(f'((timestamp="{same}" AND insertId>"{a["insertId"]}") OR timestamp>"{same}")')
    assert [e["jsonPayload"]["message"] for e in after_a] == ["twin b"]
    write_log("streamed", [("2026-01-01T00:00:02Z", "master-replica-0", "INFO", "then"),
                           ("2026-01-01T00:00:09Z", "master-replica-0", "INFO", "too new for this poll")])
    after_b = fetch(f'((timestamp="{same}" AND insertId>"{b["insertId"]}") OR timestamp>"{same}")')
    assert [e["jsonPayload"]["message"] for e in after_b] == ["then"]


# -- real jobs (Docker, the minimal runtime) -------------------------------------------------------


def test_aiptrain_serve_listens_until_stopped(api_home):
    """The command itself, as a process: it says where it listens, answers, and stops on SIGTERM."""
    import subprocess
    import sys

    seed("job_a")
    process = subprocess.Popen([sys.executable, "-m", "aiptrain", "serve", "--port", "0"],
                               stderr=subprocess.PIPE, text=True)
    try:
        first = process.stderr.readline()
        assert first.startswith("Serving the ml v1 API, Cloud Logging entries.list and Cloud Storage on http://127.0.0.1:")
        url = first.split(" on ", 1)[1].split()[0]
        listed = ml_api(url).projects().jobs().list(parent=f"projects/{PROJECT}").execute()
        assert [job["jobId"] for job in listed["jobs"]] == ["job_a"]
    finally:
        process.terminate()
        code = process.wait(timeout=30)
        rest = process.stderr.read()
        process.stderr.close()
    assert code == 130 and rest.split() == ["Aborted."]  # SIGTERM stops it as Ctrl-C does


def test_a_missing_runtime_image_is_built_in_the_background_while_creates_get_503():
    """The create never holds its request for a build: 503 while it runs, once per image."""
    from types import SimpleNamespace

    from aiptrain.api.builds import RuntimeBuilds

    built, release, attempts = set(), threading.Event(), []

    def build(runtime):
        attempts.append(runtime.image)
        release.wait(timeout=30)
        if runtime.image == "broken":
            raise RuntimeError("debootstrap is missing")
        built.add(runtime.image)

    builds = RuntimeBuilds(build, current=lambda runtime: runtime.image in built)
    runtime, broken = SimpleNamespace(image="img:1", mapped_image=None), SimpleNamespace(image="broken",
                                                                                         mapped_image=None)
    assert "is building it now" in builds.ready(runtime)
    assert "is building it now" in builds.ready(runtime)  # the same build, not a second one
    assert "is building it now" in builds.ready(broken)
    release.set()
    wait_for(lambda: builds.ready(runtime) is None, what="the image to be built")
    failure = wait_for(lambda: broken.image not in builds._running and builds.ready(broken), what="the failure")
    assert failure == "Building runtime image [broken] failed: debootstrap is missing; retry to build it again."
    assert "is building it now" in builds.ready(broken)  # said once; the next create tries again
    wait_for(lambda: sorted(attempts) == ["broken", "broken", "img:1"], what="the second try")
