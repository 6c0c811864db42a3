"""`aiptrain serve`'s projects.locations.hyperparameterTuningJobs over plain HTTP, without Docker:
refusals as Google's error body with nothing recorded, and a study seeded into the store (its
record and its ended ml v1 job, as a create and the controller leave them) as get, list and
delete answer it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import datetime, timezone

import pytest

from aiptrain.client import Client
from aiptrain.model import HyperparameterOutput, Job, Metric, State, TrainingOutput
from aiptrain.settings import Settings
from aiptrain.vertex.records import TUNING_JOBS, VertexRecords

from test_rest_api import api_home, serve  # noqa: F401 (fixtures)

PROJECT, REGION = "team-a", "us-central1"
COLLECTION = f"/v1/projects/{PROJECT}/locations/{REGION}/hyperparameterTuningJobs"
STUDY = {"metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
         "parameters": [{"parameterId": "opt", "categoricalValueSpec": {"values": ["adam", "sgd"]}},
                        {"parameterId": "units", "integerValueSpec": {"minValue": "1", "maxValue": "4"}}]}
TRIAL_JOB_SPEC = {"workerPoolSpecs": [{"replicaCount": "1", "containerSpec": {"imageUri": "trainer:1"}}]}


@pytest.fixture
def url(serve):  # noqa: F811
    return serve()


def call(url: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize("body, message", [
    ({"studySpec": STUDY, "maxTrialCount": 2, "parallelTrialCount": 1, "trialJobSpec": TRIAL_JOB_SPEC},
     "displayName is required"),
    ({"displayName": "hp", "studySpec": {**STUDY, "metrics": [{"metricId": "a"}, {"metricId": "b"}]},
      "maxTrialCount": 2, "parallelTrialCount": 1, "trialJobSpec": TRIAL_JOB_SPEC},
     "studySpec.metrics holds 2 metrics"),
    ({"displayName": "hp", "studySpec": {**STUDY, "convexAutomatedStoppingSpec": {}}, "maxTrialCount": 2,
      "parallelTrialCount": 1, "trialJobSpec": TRIAL_JOB_SPEC}, "convexAutomatedStoppingSpec is not run here"),
    ({"displayName": "hp", "studySpec": {**STUDY, "parameters": [{"parameterId": "x", "valueSpec": {}}]},
      "maxTrialCount": 2, "parallelTrialCount": 1, "trialJobSpec": TRIAL_JOB_SPEC}, "valueSpec"),
])
def test_a_refused_study_is_a_400_with_one_line_and_nothing_recorded(url, body, message):
    status, answer = call(url, "POST", COLLECTION, body)
    assert status == 400
    assert answer["error"]["status"] == "INVALID_ARGUMENT" and answer["error"]["code"] == 400
    assert message in answer["error"]["message"] and "\n" not in answer["error"]["message"]
    assert call(url, "GET", COLLECTION) == (200, {})


def seed_study(display_name: str) -> str:
    """An ended study as a create and the controller leave it: its record and its ml v1 job."""
    moment = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
    trials = [
        HyperparameterOutput(trial_id="1", hyperparameters={"opt": "adam", "units": "3"}, state=State.SUCCEEDED,
                             start_time=moment, end_time=moment, final_metric=Metric(training_step=5,
                                                                                    objective_value=0.8)),
        HyperparameterOutput(trial_id="2", hyperparameters={"opt": "sgd", "units": "1"}, state=State.FAILED,
                             start_time=moment, end_time=moment),
    ]
    body = {"displayName": display_name, "studySpec": STUDY, "maxTrialCount": 2, "parallelTrialCount": 1,
            "trialJobSpec": TRIAL_JOB_SPEC, "labels": {"team": "a"}}
    with Client(settings=Settings(), project=PROJECT) as client:
        records = VertexRecords(client.store)
        record = records.add(PROJECT, TUNING_JOBS, REGION, body)
        job = Job(job_id=record.job_id, create_time=moment, start_time=moment, end_time=moment)
        client.store.create(job, project=PROJECT)
        client.store.transition(client.key(record.job_id), State.SUCCEEDED, [State.QUEUED])
        client.store.set_training_output(client.key(record.job_id), TrainingOutput(trials=trials))
        records.set_job_key(record, client.key(record.job_id))
    return record.id


def test_a_study_is_shown_with_its_trials_listed_by_filter_and_deleted(url):
    numeric = seed_study("grid")
    seed_study("other")
    status, study = call(url, "GET", f"{COLLECTION}/{numeric}")
    assert status == 200
    assert study["name"] == f"projects/{PROJECT}/locations/{REGION}/hyperparameterTuningJobs/{numeric}"
    assert study["state"] == "JOB_STATE_SUCCEEDED" and study["labels"] == {"team": "a"}
    assert study["trialJobSpec"]["workerPoolSpecs"][0]["diskSpec"] == {"bootDiskType": "pd-ssd", "bootDiskSizeGb": 100}
    assert study["trials"] == [
        {"id": "1", "state": "SUCCEEDED",
         "parameters": [{"parameterId": "opt", "value": "adam"}, {"parameterId": "units", "value": 3}],
         "finalMeasurement": {"stepCount": "5", "metrics": [{"metricId": "accuracy", "value": 0.8}]},
         "startTime": "2026-03-04T05:06:07Z", "endTime": "2026-03-04T05:06:07Z"},
        {"id": "2", "state": "INFEASIBLE",
         "parameters": [{"parameterId": "opt", "value": "sgd"}, {"parameterId": "units", "value": 1}],
         "startTime": "2026-03-04T05:06:07Z", "endTime": "2026-03-04T05:06:07Z"},
    ]
    status, listed = call(url, "GET", f"{COLLECTION}?filter=display_name%3D%22grid%22")
    assert status == 200 and [item["name"] for item in listed[TUNING_JOBS]] == [study["name"]]
    status, refused = call(url, "POST", f"{COLLECTION}/{numeric}:cancel", {})
    assert status == 400 and "Cannot cancel HyperparameterTuningJob" in refused["error"]["message"]
    status, operation = call(url, "DELETE", f"{COLLECTION}/{numeric}")
    assert status == 200 and operation["done"] is True
    status, gone = call(url, "GET", f"{COLLECTION}/{numeric}")
    assert status == 404 and "The HyperparameterTuningJob does not exist" in gone["error"]["message"]
