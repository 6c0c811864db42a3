"""The built-in algorithms' pure rules (issue 38): their flags as the service documented them, the
data rules of --preprocess (column classification, missing values, splits), the files they write,
the catalog of image names and the labels an algorithm's image declares, and what submit and the
driver record of such a job (trainingOutput), on the fake backend. Their images run in
tests/engine/test_builtin_algorithms_docker.py."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from aiptrain.admission import request
from aiptrain.algorithms import images
from aiptrain.algorithms.catalog import ALGORITHM_LABEL, ALGORITHMS, FRAMEWORK_LABEL, algorithm_of, lookup, output_of
from aiptrain.algorithms.trainer import outputs
from aiptrain.algorithms.trainer.flags import SPECS, FlagError, parse, split_fractions
from aiptrain.algorithms.trainer.preprocess import (
    CATEGORICAL,
    KEY,
    NUMERICAL,
    DataError,
    column_kind,
    one_hot_names,
    one_hot_rows,
    prepare,
    read_rows,
    split,
    targets,
    too_sparse,
    weights,
)
from aiptrain.api.builds import RuntimeBuilds
from aiptrain.api.calls import ApiError
from aiptrain.api.jobs import JobMethods
from aiptrain.backends import ImageInfo
from aiptrain.client import Client
from aiptrain.config import SubmitFlags
from aiptrain.errors import EnvironmentNotReady, ValidationError
from aiptrain.model import BuiltInAlgorithmOutput, Job, State, TrainingInput, TrainingOutput
from aiptrain.planning import PlanInputs, save_plan_inputs
from aiptrain.runner.driver import JobDriver
from aiptrain.settings import Settings
from aiptrain.store import JobStore
from aiptrain.submission import prepare as prepare_submission

from fakes import FakeBackend
from test_driver import drive

REQUIRED = ["--training_data_path=gs://b/census.csv", "--job-dir", "gs://b/out"]


# -- flags -------------------------------------------------------------------------------------------


def test_flags_take_the_services_defaults_and_the_job_dir_in_either_spelling():
    flags = parse("linear_learner", ["--preprocess", "--model_type=classification", *REQUIRED])
    assert flags.preprocess is True and flags.model_type == "classification" and flags.job_dir == "gs://b/out"
    assert (flags.batch_size, flags.learning_rate, flags.optimizer_type, flags.eval_frequency_secs) == (
        100, 0.001, "ftrl", 600)
    assert flags.max_steps is None and flags.validation_split == 0.2 and flags.test_split == 0.2
    assert flags.given == {"preprocess", "model_type", "training_data_path", "job_dir"}
    assert parse("linear_learner", ["--model_type", "regression", "--training_data_path", "x.csv",
                                    "--job_dir=out"]).job_dir == "out"


def test_a_trials_value_after_the_users_wins_and_booleans_take_words():
    """A tuning trial's --name=value comes after the user's args, as the service appended it."""
    flags = parse("wide_deep_learner", ["--model_type=classification", "--learning_rate=0.1", *REQUIRED,
                                        "--learning_rate=0.02", "--use_wide=False", "--embed_categories",
                                        "--hidden_units=64, 32"])
    assert flags.learning_rate == 0.02 and flags.use_wide is False and flags.embed_categories is True
    assert flags.hidden_units == [64, 32] and flags.dnn_optimizer_type == "adam"


@pytest.mark.parametrize("args, message", [
    (["--model_type=classification", "--max_steps=0"], "--max_steps=0 is out of range: it takes an integer of at least 1."),
    (["--model_type=classification", "--learning_rate=0"], "it takes a number greater than 0"),
    (["--model_type=clasification"], "it takes one of classification, regression"),
    (["--model_type=classification", "--batch_size=ten"], "--batch_size=ten is not valid: it takes an integer"),
    (["--model_type=classification", "--optimizer_type=rmsprop"], "one of ftrl, sgd, adam"),
    (["--model_type=classification", "--hidden_units=30"], "Unknown argument [--hidden_units]"),
    (["--model_type=classification", "--foo=1"], "Unknown argument [--foo]: the built-in linear learner does not "
                                                 "take it"),
    (["--model_type=classification", "stray"], "Unexpected argument [stray]"),
    (["--model_type=classification", "--batch_size"], "--batch_size needs a value"),
    ([], "--model_type is required by the built-in linear learner."),
    (["--model_type=classification", "--preprocess", "--validation_split=0.3", "--test_split=0.2"],
     "is above 0.40"),
    (["--model_type=classification", "--preprocess=maybe"], "--preprocess=maybe is not valid: it takes true or false"),
])
def test_a_bad_flag_is_one_line_naming_it(args, message):
    with pytest.raises(FlagError) as raised:
        parse("linear_learner", [*args, *REQUIRED])
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_split_without_effect_is_taken_with_a_note_for_the_log():
    """The service documented the splits as preprocessing's: a line that passed one anyway still runs."""
    alone = parse("linear_learner", ["--model_type=classification", "--test_split=0.1", *REQUIRED])
    assert alone.notes == ["--test_split is ignored: it takes effect with --preprocess only."]
    beside = parse("linear_learner", ["--model_type=classification", "--preprocess", "--validation_split=0.1",
                                      "--validation_data_path=gs://b/v.csv", *REQUIRED])
    assert beside.notes == ["--validation_split is ignored: --validation_data_path gives the validation data."]
    assert split_fractions(beside) == (0.0, 0.2)


def test_the_job_dir_and_the_training_data_are_required():
    with pytest.raises(FlagError, match=r"--job_dir is required by the built-in XGBoost \(the job's --job-dir\)"):
        parse("boosted_trees", ["--training_data_path=x.csv"])
    with pytest.raises(FlagError, match="--training_data_path is required"):
        parse("tab_net", ["--model_type=regression", "--job-dir=out"])


def test_each_algorithm_has_its_own_flags():
    xgboost = parse("boosted_trees", [*REQUIRED, "--objective=multi:softmax", "--num_class=3", "--eta=0.1",
                                      "--lambda=2", "--max_depth=3"])
    assert xgboost.given >= {"objective", "num_class", "eta", "lambda", "max_depth"}
    with pytest.raises(FlagError, match=r"--eta=1.5 is out of range: it takes a number of at least 0 and at most 1"):
        parse("boosted_trees", [*REQUIRED, "--eta=1.5"])
    tabnet = parse("tab_net", ["--model_type=classification", *REQUIRED, "--num_decision_steps=3"])
    assert (tabnet.batch_size, tabnet.learning_rate, tabnet.feature_dim, tabnet.num_decision_steps) == (1024, 0.01, 64, 3)
    names = {name for spec in SPECS.values() for name in spec.by_name}
    assert {"use_wide", "embed_categories", "hidden_units", "dnn_learning_rate", "dnn_optimizer_type",
            "l1_regularization_strength", "eval_steps", "num_boost_round", "relaxation_factor"} <= names


def test_split_fractions_leave_out_a_set_given_by_its_path():
    flags = parse("linear_learner", ["--model_type=regression", "--preprocess", *REQUIRED,
                                     "--test_data_path=gs://b/test.csv"])
    assert split_fractions(flags) == (0.2, 0.0)


# -- data rules --------------------------------------------------------------------------------------


@pytest.mark.parametrize("values, kind", [
    (["1", "2", "3", "4"], KEY),  # every integer differs: an instance key
    (["1", "2", "1", "2", "3"], CATEGORICAL),  # a few distinct integers
    ([str(i % 30) for i in range(100)], NUMERICAL),  # many distinct integers, repeated
    (["1.0", "2.0", "3.0"], NUMERICAL),  # floats: numerical however few
    (["0.5", "-1e3", "7"], NUMERICAL),
    (["code_101", "code_102", "code_101"], CATEGORICAL),
    (["Private", "Gov"], CATEGORICAL),
    (["3", "x"], CATEGORICAL),
    (["5"], CATEGORICAL),  # one value is no key
])
def test_columns_are_classified_as_the_service_did(values, kind):
    assert column_kind(values) == kind


def test_rows_with_more_than_a_tenth_missing_or_no_target_are_too_sparse():
    assert not too_sparse(["a"] + ["1"] * 9 + [""])  # 1 of 11: under 10%
    assert too_sparse(["a", "1", "", "2", "3"])  # 1 of 5
    assert too_sparse(["", "1", "2"])


def test_the_split_is_a_fixed_shuffle_of_the_fractions():
    rows = [[str(i), "x"] for i in range(100)]
    training, validation, test = split(rows, 0.2, 0.1)
    assert (len(training), len(validation), len(test)) == (70, 20, 10)
    assert sorted(map(tuple, training + validation + test)) == sorted(map(tuple, rows))
    assert split(rows, 0.2, 0.1) == (training, validation, test)


CENSUS = [
    [">50K", "39.0", "Private", "13", "40.5", "1"],
    ["<=50K", "50.5", "Self-emp", "13", "", "2"],  # 1 blank in 6 columns: dropped by --preprocess
    ["<=50K", "38.0", "", "9", "40.0", "3"],  # a categorical blank: a value of its own... and 1 in 6: dropped
    [">50K", "53.0", "Private", "7", "40.0", "4"],
    ["<=50K", "28.0", "Gov", "13", "40.0", "5"],
    [">50K", "37.0", "Private", "14", "45.0", "6"],
]


def test_preprocess_drops_sparse_rows_splits_and_fills_with_the_training_mean():
    rows = CENSUS + [[">50K", "", "Gov", "9", "30.0", "7"] + [""] * 0] + [
        ["<=50K", f"{20 + i}.5", "Gov", "9", "30.0", str(8 + i)] for i in range(20)]
    prepared = prepare(rows, None, None, "classification", preprocess=True, fractions=(0.2, 0.1))
    assert prepared.dropped == 3
    assert (len(prepared.training), len(prepared.validation), len(prepared.test)) == (17, 5, 2)
    schema = prepared.schema
    assert [c.kind for c in schema.columns] == ["target", NUMERICAL, CATEGORICAL, CATEGORICAL, NUMERICAL, KEY]
    assert schema.classes == ["<=50K", ">50K"]
    assert schema.columns[2].vocabulary[0] == "Gov"  # most frequent first
    age = schema.columns[1]
    training_ages = [float(r[1]) for r in prepared.training]
    assert age.mean == pytest.approx(sum(training_ages) / len(training_ages))
    assert all(row[1] for row in prepared.training + prepared.validation + prepared.test)  # nothing left blank


def test_without_preprocess_a_numerical_blank_is_an_error_naming_the_fix():
    with pytest.raises(DataError, match="Row 2 of the training data has no value for column 4: fill it, or pass "
                                        "--preprocess"):
        prepare(CENSUS, None, None, "classification", preprocess=False)


@pytest.mark.parametrize("rows, model_type, message", [
    ([["a", "1.0"], ["a", "2.0"]], "classification", "The target column has one value ([a])"),
    ([["x", "1.0"], ["2", "2.0"]], "regression", "Value [x] of the target is not a number (--model_type="
                                                 "classification takes categories)."),
    ([["1", "10"], ["0", "11"], ["1", "12"]], "classification", "No feature column: every column after the target "
                                                                  "is an instance key"),
])
def test_data_the_algorithm_cannot_take_is_one_line(rows, model_type, message):
    with pytest.raises(DataError) as raised:
        prepare(rows, None, None, model_type, preprocess=False)
    assert message in str(raised.value)


def test_classes_in_numerical_order_and_from_every_set():
    training = [[str(c), f"{c}.5"] for c in (10, 2, 1, 2)]
    prepared = prepare(training, [["3", "1.0"]], None, "classification", preprocess=False)
    assert prepared.schema.classes == ["1", "2", "3", "10"]
    assert targets(prepared.schema, prepared.training) == [3.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("text, message", [
    ("a,1\nb\n", "Row 2 of data.csv has 1 columns where the first has 2"),
    ("only\nrows\n", "data.csv has one column"),
    ("\n\n", "data.csv holds no rows."),
])
def test_csv_rules(text, message):
    with pytest.raises(DataError) as raised:
        read_rows(text, "data.csv")
    assert message in str(raised.value)


def test_values_are_stripped_and_a_header_can_be_skipped():
    assert read_rows("y, x\n1 , Private\n", "f", skip_header=True) == [["1", "Private"]]


def test_one_hot_rows_for_xgboost_and_a_weight_column():
    rows = [["1", "2.0", "red", "0.5"], ["0", "4.0", "blue", "0.5"], ["1", "3.0", "red", "0.5"]]
    prepared = prepare([[r[0], r[3], r[1], r[2]] for r in rows], None, None, "classification", preprocess=False,
                       weight_column=True)
    schema = prepared.schema
    assert one_hot_names(schema) == ["column_2", "column_3=red", "column_3=blue"]
    assert one_hot_rows(schema, [["1", "0.5", "5.0", "green"]]) == [[5.0, 0.0, 0.0]]  # unseen: all zeros
    assert weights(schema, prepared.training) == [0.5, 0.5, 0.5]


# -- what the algorithms write ---------------------------------------------------------------------


def test_deployment_config_is_a_model_versions_fields_with_the_metrics_as_labels():
    labels = outputs.metric_labels("classification", {"accuracy": 0.8731, "loss": 0.3}, 1000)
    text = outputs.deployment_config("gs://b/out/model", "TENSORFLOW", "2.11", "3.9", labels)
    assert yaml.safe_load(text) == {"deploymentUri": "gs://b/out/model", "framework": "TENSORFLOW",
                                    "labels": {"accuracy": "87.31", "global_step": "1000"},
                                    "pythonVersion": "3.9", "runtimeVersion": "2.11"}
    assert outputs.metric_labels("regression", {"rmse": 0.25, "loss": 0.06}, 7) == {"rmse": "0.25", "global_step": "7"}


def test_processed_data_holds_the_sets_that_have_rows():
    prepared = prepare([["1", "2.0"], ["0", "3.0"]], None, None, "classification", preprocess=False)
    assert outputs.processed_files(prepared) == {"training_data.csv": "1,2.0\n0,3.0\n"}


# -- the catalog and the image's labels ------------------------------------------------------------


@pytest.mark.parametrize("image, name", [
    ("gcr.io/cloud-ml-algos/linear_learner_cpu:latest", "linear_learner"),
    ("gcr.io/cloud-ml-algos/linear_learner_cpu", "linear_learner"),
    ("gcr.io/cloud-ml-algos/wide_deep_learner_gpu:latest", "wide_deep_learner"),
    ("gcr.io/cloud-ml-algos/boosted_trees", "boosted_trees"),
    ("gcr.io/cloud-ml-algos/tab_net:latest", "tab_net"),
    ("gcr.io/cloud-ml-algos/boosted_trees:0.81", None),  # a tag this machine builds no image for
    ("gcr.io/cloud-ml-algos/image_classification:latest", None),
    ("example.com/trainer:1", None),
    (None, None),
])
def test_the_services_image_names_name_their_algorithm(image, name):
    found = algorithm_of(image)
    assert (found.name if found else None) == name


def test_build_names_algorithms_or_their_images_all_checked_first():
    assert [a.name for a in lookup(["boosted_trees", "gcr.io/cloud-ml-algos/tab_net:latest", "linear_learner_cpu"])] \
        == ["boosted_trees", "tab_net", "linear_learner"]
    assert lookup([]) == list(ALGORITHMS.values())
    with pytest.raises(ValidationError, match=r"Unknown built-in algorithm \[kmeans\]: choose one of linear_learner"):
        lookup(["boosted_trees", "kmeans"])


def test_the_job_output_comes_from_the_images_labels():
    labels = {ALGORITHM_LABEL: "boosted_trees", FRAMEWORK_LABEL: "XGBOOST", "aiptrain.runtime-version": "2.11",
              "aiptrain.python": "3.9"}
    assert output_of(labels) == BuiltInAlgorithmOutput(framework="XGBOOST", runtime_version="2.11", python_version="3.9")
    assert output_of({"aiptrain.runtime-version": "2.11"}) is None and output_of(None) is None
    succeeded = output_of(labels).succeeded_in("gs://b/out/")
    output = TrainingOutput(is_built_in_algorithm_job=True, built_in_algorithm_output=succeeded)
    assert output.to_resource() == {"isBuiltInAlgorithmJob": True, "builtInAlgorithmOutput": {
        "framework": "XGBOOST", "runtimeVersion": "2.11", "pythonVersion": "3.9", "modelPath": "gs://b/out/model/"}}


def test_an_images_recipe_follows_the_trainers_sources(monkeypatch):
    algorithm = ALGORITHMS["tab_net"]
    current = images.recipe(algorithm)
    assert images.is_current(algorithm, {images.RECIPE_LABEL: current})
    assert not images.is_current(algorithm, {}) and not images.is_current(algorithm, None)
    assert images.recipe(ALGORITHMS["linear_learner"]) != current
    sources = images._trainer_sources()
    assert {"flags.py", "task.py", "keras_loop.py", "boosted_trees.py", "__main__.py"} <= set(sources)
    monkeypatch.setattr(images, "_trainer_sources", lambda: {**sources, "task.py": sources["task.py"] + "\n"})
    assert images.recipe(algorithm) != current


# -- submit and the driver ---------------------------------------------------------------------------


@pytest.fixture
def settings(tmp_path) -> Settings:
    settings = Settings(home=tmp_path / "home", poll_seconds=0.01)
    settings.ensure_dirs()
    return settings


def flags(image: str = "gcr.io/cloud-ml-algos/boosted_trees:latest", **more) -> SubmitFlags:
    return SubmitFlags(job_id="job", region="us-central1", master_image_uri=image, job_dir="gs://algos-b/out",
                       user_args=["--training_data_path=gs://algos-b/data.csv"], **more)


def test_submit_names_the_algorithm_and_refuses_what_it_cannot_run(settings):
    assert prepare_submission(flags(), settings).algorithm is ALGORITHMS["boosted_trees"]
    assert prepare_submission(flags("example.com/trainer:1"), settings).algorithm is None
    with pytest.raises(ValidationError, match=r"The built-in XGBoost trains on one replica, and this job also asks for "
                                              r"ps and worker replicas: use --scale-tier BASIC"):
        prepare_submission(flags(scale_tier="STANDARD_1"), settings)
    with pytest.raises(ValidationError, match="The built-in XGBoost runs its own code: drop --package-path"):
        prepare_submission(flags(packages=["gs://algos-b/extra-0.1.tar.gz"], module_name="trainer.task"), settings)


def test_a_submit_marks_the_job_built_in_from_its_images_labels(settings, controller_in_process):
    algorithm = ALGORITHMS["boosted_trees"]
    labels = {ALGORITHM_LABEL: algorithm.name, FRAMEWORK_LABEL: "XGBOOST", "aiptrain.runtime-version": "2.11",
              "aiptrain.python": "3.9", images.RECIPE_LABEL: images.recipe(algorithm)}
    backend = FakeBackend(images={algorithm.image: ImageInfo("sha256:" + "2" * 64, labels)})
    controller_in_process(settings, backend)
    with Client(settings=replace(settings, gcs_mode="local"), backend=backend) as client:
        job = client.submit(client.prepare(flags()))
    assert job.training_output.to_resource() == {"isBuiltInAlgorithmJob": True, "builtInAlgorithmOutput": {
        "framework": "XGBOOST", "runtimeVersion": "2.11", "pythonVersion": "3.9"}}
    assert backend.calls_to("inspect_image") == [("inspect_image", algorithm.image)]  # asked once
    assert backend.calls_to("check_ready") == [("check_ready", "job", (algorithm.image,))]


def test_a_missing_algorithm_image_without_builds_is_refused_naming_the_build(settings, controller_in_process):
    backend = FakeBackend(images={ALGORITHMS["tab_net"].image: None})
    controller_in_process(settings, backend)
    settings = replace(settings, auto_build=False, gcs_mode="local")
    with Client(settings=settings, backend=backend) as client, pytest.raises(EnvironmentNotReady) as refused:
        client.submit(client.prepare(flags("gcr.io/cloud-ml-algos/tab_net:latest")))
    assert "`aiptrain algorithms build tab_net`" in str(refused.value)
    assert client.store.get("job") is None  # nothing half-created


@pytest.mark.parametrize("ending, model_path", [(0, "gs://algos-b/out/model/"), (1, None)])
def test_the_model_path_is_set_when_the_job_succeeds(settings, ending, model_path):
    with JobStore(settings.store_path) as store:
        output = TrainingOutput(is_built_in_algorithm_job=True,
                                built_in_algorithm_output=BuiltInAlgorithmOutput(framework="TENSORFLOW"))
        job = store.create(Job(job_id="job", training_input=TrainingInput(
            region="us-central1", job_dir="gs://algos-b/out", master_config={"imageUri": ALGORITHMS["tab_net"].image}),
            training_output=output))
        save_plan_inputs(settings.job_paths("job").plan_inputs, PlanInputs(runtime_image=None))
        request(store, "job", job, None)
        backend = FakeBackend(script={"master-replica-0": [ending]})
        state = drive(JobDriver("job", settings, store, backend), backend)
        assert state is (State.SUCCEEDED if ending == 0 else State.FAILED)
        resource = store.get("job").training_output.to_resource()
    assert resource["isBuiltInAlgorithmJob"] is True
    assert resource["builtInAlgorithmOutput"].get("modelPath") == model_path


# -- the guide ----------------------------------------------------------------------------------------

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "built-in-algorithms.md"


def guide_default(flag) -> str:
    if flag.required:
        return "required"
    if flag.name == "max_steps":
        return "10 epochs"
    if flag.default is None:
        return "unset"
    if flag.kind == "bool":
        return "true" if flag.default else "unset (false)"
    if flag.kind == "int_list":
        return "`" + ",".join(map(str, flag.default)) + "`"
    return f"`{flag.default}`"


def test_the_guide_gives_every_flag_what_it_takes_and_its_default():
    text = GUIDE.read_text()
    missing = []
    for spec in SPECS.values():
        for flag in spec.flags:
            name = "--job-dir" if flag.name == "job_dir" else f"--{flag.name}"
            row = f"| `{name}` | {flag.takes()} | {guide_default(flag)} | {flag.help} |"
            if row not in text:
                missing.append(row)
    assert missing == []
    for name in (*outputs.PROCESSED_FILES.values(), outputs.DEPLOYMENT_CONFIG, outputs.METADATA, "model.bst"):
        assert name in text


def test_a_rest_create_naming_a_missing_algorithm_image_is_answered_503_while_it_builds(home):
    """A REST client gives up after 60 s: the image is built in the background, the create
    answered 503 (nothing created) until it is there."""
    methods = JobMethods(Settings())
    built = threading.Event()
    methods._algorithm_builds = RuntimeBuilds(lambda algorithm: built.set(), lambda algorithm: False,
                                              "built-in algorithm image")
    with Client() as client:
        submission = client.prepare(SubmitFlags(job_id="j", master_image_uri=ALGORITHMS["linear_learner"].image,
                                                region="us-central1"))
    with pytest.raises(ApiError) as refused:
        methods.check_runtime_image(submission)
    assert refused.value.code == 503
    assert refused.value.message.startswith(
        f"Built-in algorithm image [{ALGORITHMS['linear_learner'].image}] is not built yet: aiptrain is building it now")
    assert built.wait(10)
