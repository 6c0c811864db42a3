"""`jobs describe --summarize` and `jobs plot` on jobs put straight into an isolated store."""

from __future__ import annotations

import struct
import sys

import pytest

from aiptrain.cli.summary import summary_tables
from aiptrain.errors import EXIT_ENVIRONMENT, EnvironmentNotReady
from aiptrain.model import (
    Goal,
    HyperparameterOutput,
    HyperparameterSpec,
    Job,
    Metric,
    State,
    TrainingInput,
    TrainingOutput,
)
from aiptrain.plot import TrialPoint, best_so_far, plot_study

SPEC = HyperparameterSpec.model_validate({
    "goal": "MAXIMIZE",
    "hyperparameterMetricTag": "accuracy",
    "maxTrials": 12,
    "params": [
        {"parameterName": "lr", "type": "DOUBLE", "minValue": 1e-4, "maxValue": 0.1, "scaleType": "UNIT_LOG_SCALE"},
        {"parameterName": "units", "type": "INTEGER", "minValue": 8, "maxValue": 64},
        {"parameterName": "cell", "type": "CATEGORICAL", "categoricalValues": ["lstm", "gru"]},
    ],
})


def trial(trial_id: str, lr: str, units: str, cell: str, value: float | None, state: State = State.SUCCEEDED,
          stopped: bool = False) -> HyperparameterOutput:
    return HyperparameterOutput(
        trial_id=trial_id, hyperparameters={"lr": lr, "units": units, "cell": cell}, state=state,
        final_metric=Metric(training_step=100, objective_value=value) if value is not None else None,
        is_trial_stopped_early=stopped,
    )


TRIALS = [
    trial("10", "0.01", "32", "gru", 0.91),
    trial("2", "0.001", "8", "lstm", 0.72),
    trial("1", "0.05", "64", "gru", 0.80),
    trial("3", "0.0002", "16", "lstm", None, State.FAILED),
    trial("4", "0.09", "40", "gru", 0.40, State.CANCELLED, stopped=True),
]


def hp_job(job_id: str = "tune_1", trials=TRIALS) -> Job:
    return Job(
        job_id=job_id,
        training_input=TrainingInput(region="us-central1", python_module="trainer.task", runtime_version="minimal",
                                     job_dir="/tmp/tune_1", scale_tier="BASIC", hyperparameters=SPEC),
        training_output=TrainingOutput(
            completed_trial_count=sum(t.state is State.SUCCEEDED for t in trials), trials=list(trials),
            is_hyperparameter_tuning_job=True, hyperparameter_metric_tag="accuracy", consumed_ml_units=0.5),
    )


def plain_job(job_id: str = "plain_1") -> Job:
    return Job(job_id=job_id, training_input=TrainingInput(region="us-central1", python_module="trainer.task"))


@pytest.fixture
def store_job(home):
    """Put a finished job into the isolated installation's store."""
    from aiptrain.settings import Settings
    from aiptrain.store import JobStore

    settings = Settings()
    settings.ensure_dirs()
    store = JobStore(settings.store_path)

    def put(job: Job) -> Job:
        created = store.create(job)
        store.update_resource(created.job_id, created)
        store.transition(job.job_id, State.RUNNING, [State.QUEUED])
        return store.transition(job.job_id, State.SUCCEEDED, [State.RUNNING])

    yield put
    store.close()


def test_summary_tables_follow_gclouds_format():
    tables = {title: (headers, rows) for title, headers, rows in summary_tables(hp_job().to_resource())}
    assert list(tables) == ["Job Overview", "Training Input Summary", "Training Output Summary",
                            "Training Output Trials"]
    assert tables["Job Overview"][0] == ["JOB_ID", "CREATE_TIME", "START_TIME", "END_TIME", "STATE"]
    assert tables["Training Input Summary"] == (
        ["RUNTIME_VERSION", "REGION", "SCALE_TIER", "PYTHON_MODULE", "JOB_DIR"],  # empty optional columns left out
        [["minimal", "us-central1", "BASIC", "trainer.task", "/tmp/tune_1"]],
    )
    assert tables["Training Output Summary"] == (["TRIALS", "ML_UNITS"], [["3", "0.5"]])
    headers, rows = tables["Training Output Trials"]
    assert headers == ["TRIAL", "OBJECTIVE_VALUE", "STEP", "HYPERPARAMETERS"]
    assert [row[0] for row in rows] == ["10", "1", "2", "4", "3"]  # best objective first, none last
    assert rows[1] == ["1", "0.8", "100", "lr=0.05\nunits=64\ncell=gru"]
    assert rows[4][1:3] == ["", ""]  # a failed trial has no metric


def test_summary_of_a_plain_job_has_no_trials():
    tables = summary_tables(plain_job().to_resource())
    assert [title for title, _, _ in tables] == ["Job Overview", "Training Input Summary", "Training Output Summary"]
    assert tables[2][1:] == (["ML_UNITS"], [[""]])


def test_describe_summarize_prints_boxed_tables(cli, store_job):
    store_job(hp_job())
    result = cli("jobs", "describe", "tune_1", "--summarize", check_code=0)
    out = result.stdout
    for title in ("Job Overview", "Training Input Summary", "Training Output Summary", "Training Output Trials"):
        assert title in out
    assert "┌" in out and "│ JOB_ID" in out and "SUCCEEDED" in out
    assert "\x1b[" not in out  # piped: no terminal styling
    assert out.index("lr=0.01") < out.index("lr=0.05") < out.index("lr=0.001")  # trials 10, 1, 2
    assert "units=64" in out and "cell=gru" in out
    assert "stream-logs tune_1" in result.stderr


def test_describe_without_summarize_is_unchanged(cli, store_job):
    store_job(hp_job())
    out = cli("jobs", "describe", "tune_1", check_code=0).stdout
    assert "trialId: '10'" in out and "objectiveValue: 0.91" in out and "Job Overview" not in out


def test_plot_of_only_stopped_trials_draws_without_a_best_line(tmp_path):
    job = hp_job(trials=[trial("1", "0.01", "8", "gru", 0.3, State.CANCELLED, stopped=True),
                         trial("2", "0.01", "8", "other", None, State.FAILED)])
    plot_study(job, tmp_path / "x.svg")
    assert (tmp_path / "x.svg").read_text().lstrip().startswith("<?xml")


def test_plot_writes_a_png(cli, store_job, tmp_path):
    store_job(hp_job())
    target = tmp_path / "tune_1.png"
    result = cli("jobs", "plot", "tune_1", "-o", str(target), check_code=0)
    data = target.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 800 and height > 300  # objective panel + 3 parameter panels
    assert str(target) in result.stderr


@pytest.mark.parametrize("job, says", [
    (plain_job("plain_1"), "is not a hyperparameter tuning job"),
    (hp_job("tune_2", trials=[trial("1", "0.01", "8", "gru", None, State.FAILED)]), "no trial with an objective"),
    (hp_job("tune_3", trials=[]), "no trial with an objective"),
])
def test_plot_of_nothing_to_plot_is_one_line_exit_2(cli, store_job, tmp_path, job, says):
    store_job(job)
    result = cli("jobs", "plot", job.job_id, "-o", str(tmp_path / "x.png"))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and says in result.stderr
    assert not (tmp_path / "x.png").exists()


def test_plot_of_an_unknown_format_or_missing_job_is_exit_2(cli, store_job, tmp_path):
    store_job(hp_job())
    bad = cli("jobs", "plot", "tune_1", "-o", str(tmp_path / "x.bmpx"))
    assert bad.returncode == 2 and "name a file ending in one of" in bad.stderr and ".png" in bad.stderr
    missing = cli("jobs", "plot", "nope", "-o", str(tmp_path / "x.png"))
    assert missing.returncode == 2 and "Job [nope] not found" in missing.stderr


def test_plot_without_matplotlib_names_the_extra(monkeypatch, tmp_path, home, store_job, capsys):
    store_job(hp_job())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    with pytest.raises(EnvironmentNotReady, match=r"pip install 'aiptrain\[plot\]'"):
        plot_study(hp_job(), tmp_path / "x.png")

    from aiptrain.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["jobs", "plot", "tune_1", "-o", str(tmp_path / "x.png")])
    assert exited.value.code == EXIT_ENVIRONMENT
    assert capsys.readouterr().err == "ERROR: jobs plot needs matplotlib: pip install 'aiptrain[plot]'\n"


def _points(*objectives, stopped=()):
    return [TrialPoint(number=n, trial_id=str(n), objective=value, stopped_early=n in stopped, values={})
            for n, value in enumerate(objectives, start=1)]


@pytest.mark.parametrize("goal, expected", [
    (Goal.MAXIMIZE, [(1, 0.5), (2, 0.5), (4, 0.9)]),
    (Goal.MINIMIZE, [(1, 0.5), (2, 0.3), (4, 0.3)]),
])
def test_best_so_far_skips_failed_and_stopped_trials(goal, expected):
    points = _points(0.5, 0.3, None, 0.9, 0.01, stopped={5})
    assert best_so_far(points, goal) == expected


def test_trials_sort_best_first_for_the_goal():
    from aiptrain.cli.summary import best_first

    trials = [t.to_resource() for t in TRIALS]
    assert [t["trialId"] for t in best_first(trials, {"goal": "MINIMIZE"})] == ["4", "2", "1", "10", "3"]
    assert [t["trialId"] for t in best_first(trials, {})] == ["10", "1", "2", "4", "3"]
