"""The search of an HP study (aiptrain.search over optuna): pure, no Docker."""

from __future__ import annotations

import math

import pytest

from aiptrain.model import HyperparameterOutput, HyperparameterSpec, Metric, State
from aiptrain.planning import SearchCondition, StudyRules
from aiptrain.search import Search

GRID_PARAMS = [
    {"parameterName": "layers", "type": "INTEGER", "minValue": 1, "maxValue": 3},
    {"parameterName": "dropout", "type": "DISCRETE", "discreteValues": [0.25, 2, 4]},
    {"parameterName": "cell", "type": "CATEGORICAL", "categoricalValues": ["lstm", "gru"]},
]
GRID_SIZE = 3 * 3 * 2


def spec(**fields) -> HyperparameterSpec:
    return HyperparameterSpec.model_validate(fields)


def grid_spec(max_trials: int = 100) -> HyperparameterSpec:
    return spec(algorithm="GRID_SEARCH", maxTrials=max_trials, params=GRID_PARAMS)


def run(search: Search, count: int, objective=lambda values: 0.0, first: int = 1) -> list[dict[str, str]]:
    """Suggest and complete up to `count` trials in turn; the values each got."""
    seen = []
    for number in range(first, first + count):
        values = search.suggest(str(number))
        if values is None:
            break
        seen.append(values)
        search.complete(str(number), objective(values), State.SUCCEEDED)
    return seen


def as_point(values: dict[str, str]) -> tuple:
    return tuple(sorted(values.items()))


def stored(number: int, values: dict[str, str], state: State, value: float | None = None) -> HyperparameterOutput:
    metric = Metric(objective_value=value, training_step=10) if value is not None else None
    return HyperparameterOutput(trial_id=str(number), hyperparameters=values, state=state, final_metric=metric)


def test_grid_visits_every_point_once_then_none():
    seen = run(Search(grid_spec()), GRID_SIZE + 3)
    assert len(seen) == GRID_SIZE
    assert len({as_point(values) for values in seen}) == GRID_SIZE
    assert {values["dropout"] for values in seen} == {"0.25", "2", "4"}  # integral DISCRETE as '2'
    assert {values["layers"] for values in seen} == {"1", "2", "3"}
    assert {values["cell"] for values in seen} == {"lstm", "gru"}


@pytest.mark.parametrize("max_trials, budget", [(5, 5), (GRID_SIZE, GRID_SIZE), (1000, GRID_SIZE)])
def test_trial_budget_is_capped_at_the_grid(max_trials, budget):
    assert Search(grid_spec(max_trials)).trial_budget == budget


def test_budget_without_grid_is_max_trials():
    assert Search(spec(params=[GRID_PARAMS[0]])).trial_budget == 1
    assert Search(spec(maxTrials=7, params=[GRID_PARAMS[0]])).trial_budget == 7


@pytest.mark.parametrize("algorithm", ["RANDOM_SEARCH", "ALGORITHM_UNSPECIFIED"])
def test_samples_stay_in_bounds_and_types(algorithm):
    search = Search(spec(algorithm=algorithm, maxTrials=40, params=[
        {"parameterName": "lr", "type": "DOUBLE", "minValue": 1e-4, "maxValue": 0.1, "scaleType": "UNIT_LOG_SCALE"},
        {"parameterName": "units", "type": "INTEGER", "minValue": 8, "maxValue": 512},
        {"parameterName": "batch", "type": "DISCRETE", "discreteValues": [16, 32, 64]},
        {"parameterName": "act", "type": "CATEGORICAL", "categoricalValues": ["relu", "tanh"]},
    ]))
    seen = run(search, 40, objective=lambda v: -abs(math.log10(float(v["lr"])) + 2))
    assert len(seen) == 40
    for values in seen:
        assert 1e-4 <= float(values["lr"]) <= 0.1
        assert 8 <= int(values["units"]) <= 512 and values["units"] == str(int(values["units"]))
        assert values["batch"] in {"16", "32", "64"}
        assert values["act"] in {"relu", "tanh"}
    # log scale: about as many samples per decade, so most are far below the middle of the range
    assert sum(float(v["lr"]) < 0.01 for v in seen) > len(seen) / 2


def test_reverse_log_scale_is_dense_near_max():
    search = Search(spec(algorithm="RANDOM_SEARCH", maxTrials=200, params=[
        {"parameterName": "momentum", "type": "DOUBLE", "minValue": 0.001, "maxValue": 1,
         "scaleType": "UNIT_REVERSE_LOG_SCALE"},
    ]))
    values = [float(v["momentum"]) for v in run(search, 200)]
    assert all(0.001 <= value <= 1 for value in values)
    assert sum(value > 0.9 for value in values) > sum(value < 0.1 for value in values) * 3


@pytest.mark.parametrize("algorithm", ["GRID_SEARCH", "RANDOM_SEARCH", "ALGORITHM_UNSPECIFIED"])
def test_a_discrete_list_on_a_reverse_log_scale_is_sampled_as_listed(algorithm):
    # The scale validates (every value > 0) but cannot apply to a list sampled as a choice.
    hp = spec(algorithm=algorithm, maxTrials=10, params=[
        {"parameterName": "batch", "type": "DISCRETE", "discreteValues": [16, 32, 64],
         "scaleType": "UNIT_REVERSE_LOG_SCALE"},
    ])
    seen = run(Search(hp), 10)
    assert seen and {values["batch"] for values in seen} <= {"16", "32", "64"}
    Search(hp).restore([stored(1, seen[0], State.SUCCEEDED, 0.5)])


@pytest.mark.parametrize("algorithm", ["GRID_SEARCH", "RANDOM_SEARCH", "ALGORITHM_UNSPECIFIED"])
def test_same_seed_same_suggestions(algorithm):
    def suggestions(seed):
        search = Search(spec(algorithm=algorithm, maxTrials=15, params=GRID_PARAMS), seed=seed)
        return run(search, 15, objective=lambda v: float(v["layers"]))

    assert suggestions(3) == suggestions(3)
    assert suggestions(3) != suggestions(4)


@pytest.mark.parametrize("goal, best", [("MAXIMIZE", "3"), ("MINIMIZE", "1"), (None, "3")])
def test_best_trial_follows_the_goal(goal, best):
    search = Search(spec(goal=goal, maxTrials=3, params=GRID_PARAMS))
    assert search.best_trial_id() is None
    for number, value in [("1", 0.1), ("2", 0.5), ("3", 0.9)]:
        search.suggest(number)
        search.complete(number, value, State.SUCCEEDED)
    search.suggest("4")
    search.complete("4", None, State.FAILED)  # failures never win
    assert search.best_trial_id() == best


def _study_with_reports(early_stopping: bool) -> Search:
    search = Search(spec(enableTrialEarlyStopping=early_stopping, maxTrials=5, params=GRID_PARAMS))
    for number in ("1", "2", "3"):
        search.suggest(number)
        for step in range(1, 6):
            assert not search.report(number, step, 0.8 + step / 100)
        search.complete(number, 0.85, State.SUCCEEDED)
    search.suggest("4")
    return search


def test_report_stops_a_clearly_bad_trial():
    search = _study_with_reports(early_stopping=True)
    assert search.report("4", 1, 0.01)
    search.complete("4", 0.01, State.CANCELLED, stopped_early=True)
    assert search.best_trial_id() in {"1", "2", "3"}


def test_report_never_stops_without_early_stopping():
    search = _study_with_reports(early_stopping=False)
    assert not any(search.report("4", step, 0.01) for step in range(1, 6))


def test_report_of_the_same_step_twice_is_ignored():
    search = _study_with_reports(early_stopping=True)
    assert search.report("4", 1, 0.01)
    assert not search.report("4", 1, 0.01)


def test_restore_after_a_crash_continues_the_grid():
    first = Search(grid_spec())
    taken = [first.suggest(str(number)) for number in range(1, 6)]
    trials = [stored(1, taken[0], State.SUCCEEDED, 0.3), stored(2, taken[1], State.FAILED),
              stored(3, taken[2], State.SUCCEEDED, 0.9), stored(4, taken[3], State.RUNNING),
              stored(5, taken[4], State.RUNNING)]

    search = Search(grid_spec())
    search.restore(trials)
    rest = run(search, GRID_SIZE, first=6)
    assert len(rest) == GRID_SIZE - 5
    assert {as_point(v) for v in rest}.isdisjoint({as_point(v) for v in taken})
    search.complete("4", 0.95, State.SUCCEEDED)  # a restored running trial ends normally
    search.complete("5", None, State.FAILED)
    assert search.best_trial_id() == "4"
    assert search.suggest("100") is None


def test_restore_keeps_reverse_log_values_and_stopped_trials():
    hp = spec(maxTrials=10, enableTrialEarlyStopping=True, params=[
        {"parameterName": "m", "type": "DOUBLE", "minValue": 0.01, "maxValue": 0.99,
         "scaleType": "UNIT_REVERSE_LOG_SCALE"},
        {"parameterName": "n", "type": "INTEGER", "minValue": 1, "maxValue": 100,
         "scaleType": "UNIT_REVERSE_LOG_SCALE"},
    ])
    first = Search(hp)
    taken = [first.suggest(str(number)) for number in range(1, 4)]
    search = Search(hp)
    search.restore([
        stored(1, taken[0], State.SUCCEEDED, 0.5),
        HyperparameterOutput(trial_id="2", hyperparameters=taken[1], state=State.CANCELLED,
                             is_trial_stopped_early=True, final_metric=Metric(objective_value=0.1)),
        stored(3, taken[2], State.RUNNING),
    ])
    assert search.report("3", 1, 0.7) is False  # too few finished trials to judge
    search.complete("3", 0.7, State.SUCCEEDED)
    assert search.best_trial_id() == "3"


def test_restore_rejects_values_outside_the_spec():
    search = Search(grid_spec())
    with pytest.raises(ValueError, match="outside the search space"):
        search.restore([stored(1, {"layers": "9", "dropout": "2", "cell": "gru"}, State.RUNNING)])


def test_history_informs_the_grid_but_is_not_this_jobs():
    previous = Search(grid_spec())
    old = run(previous, 6, objective=lambda v: 1.0)
    history = [stored(n + 1, values, State.SUCCEEDED, 1.0) for n, values in enumerate(old)]
    history.append(stored(99, {"layers": "7", "dropout": "2", "cell": "gru"}, State.SUCCEEDED, 5.0))  # other spec
    history.append(stored(98, old[0], State.RUNNING))  # unfinished: left out

    search = Search(grid_spec())
    search.add_history(history)
    new = run(search, GRID_SIZE, objective=lambda v: 0.5)
    assert len(new) == GRID_SIZE - 6
    assert {as_point(v) for v in new}.isdisjoint({as_point(v) for v in old})
    assert search.best_trial_id() in {str(n) for n in range(1, GRID_SIZE)}  # this job's own trial ids


def test_history_informs_tpe():
    hp = spec(maxTrials=30, params=[{"parameterName": "x", "type": "DOUBLE", "minValue": 0, "maxValue": 10}])
    history = [stored(n, {"x": repr(n / 3)}, State.SUCCEEDED, -abs(n / 3 - 8)) for n in range(1, 30)]
    search = Search(hp)
    search.add_history(history)
    near = [float(v["x"]) for v in run(search, 10, objective=lambda v: -abs(float(v["x"]) - 8))]
    assert sum(abs(x - 8) < 2 for x in near) >= 6  # it exploits what the previous job found


def test_suggest_rejects_a_trial_id_twice():
    search = Search(grid_spec())
    search.suggest("1")
    with pytest.raises(ValueError):
        search.suggest("1")


@pytest.mark.parametrize("algorithm", ["RANDOM_SEARCH", "ALGORITHM_UNSPECIFIED"])
def test_every_takeover_suggests_new_points(algorithm):
    """Issue 21, item 6: a study taken over after every trial (the search rebuilt from the
    recorded trials, seeded as the study loop seeds it) never measures a point twice."""
    from aiptrain.tuning import sampler_seed

    hp = spec(algorithm=algorithm, maxTrials=6, params=[
        {"parameterName": "x", "type": "DOUBLE", "minValue": 0, "maxValue": 1},
        {"parameterName": "c", "type": "CATEGORICAL", "categoricalValues": ["a", "b", "c"]}])
    recorded: list[HyperparameterOutput] = []
    for number in range(1, 7):
        search = Search(hp, seed=sampler_seed(len(recorded)))
        search.restore(recorded)
        values = search.suggest(str(number))
        recorded.append(stored(number, values, State.SUCCEEDED, float(values["x"])))
    assert len({as_point(t.hyperparameters) for t in recorded}) == 6


@pytest.mark.parametrize("algorithm", ["GRID_SEARCH", "RANDOM_SEARCH", "ALGORITHM_UNSPECIFIED"])
def test_discrete_values_in_any_order_are_the_same_search_as_sorted(algorithm):
    # gcloud sends discreteValues as written and the service took them in any order: the search
    # sees them sorted, so [64, 16, 32] explores exactly what [16, 32, 64] does, trial for trial.
    def suggestions(values):
        hp = spec(algorithm=algorithm, maxTrials=12, params=[
            {"parameterName": "batch", "type": "DISCRETE", "discreteValues": values}, GRID_PARAMS[2]])
        return run(Search(hp), 12, objective=lambda v: float(v["batch"]))

    assert suggestions([64, 16, 32]) == suggestions([16, 32, 64]) == suggestions([32, 64, 16])
    seen = suggestions([64, 16, 32])
    assert {values["batch"] for values in seen} == {"16", "32", "64"}
    hp = spec(algorithm=algorithm, params=[{"parameterName": "batch", "type": "DISCRETE", "discreteValues": [64, 16]}])
    Search(hp).restore([stored(1, {"batch": "16"}, State.SUCCEEDED, 0.5)])  # a stored trial's value is found


# A conditional search space: momentum only with sgd, depth only with a discrete width of 2 or 4.
CONDITIONAL_PARAMS = [
    {"parameterName": "opt", "type": "CATEGORICAL", "categoricalValues": ["adam", "sgd"]},
    {"parameterName": "momentum", "type": "DISCRETE", "discreteValues": [0.5, 0.9]},
    {"parameterName": "width", "type": "DISCRETE", "discreteValues": [1, 2, 4]},
    {"parameterName": "depth", "type": "INTEGER", "minValue": 1, "maxValue": 3},
]
CONDITIONS = StudyRules(conditions={"momentum": SearchCondition("opt", ("sgd",)),
                                    "depth": SearchCondition("width", ("2", "4.0"))})


def conditional_search(algorithm: str, max_trials: int = 40, seed: int = 0) -> Search:
    return Search(spec(algorithm=algorithm, maxTrials=max_trials, params=CONDITIONAL_PARAMS), seed, CONDITIONS)


def holds_its_conditions(values: dict[str, str]) -> bool:
    return ("momentum" in values) == (values["opt"] == "sgd") and ("depth" in values) == (values["width"] in ("2", "4"))


@pytest.mark.parametrize("algorithm", ["RANDOM_SEARCH", "ALGORITHM_UNSPECIFIED"])
def test_a_conditional_parameter_is_drawn_only_where_its_condition_holds(algorithm):
    seen = run(conditional_search(algorithm), 40, objective=lambda v: float(v.get("momentum", 0)))
    assert len(seen) == 40 and all(holds_its_conditions(values) for values in seen)
    assert {"momentum" in values for values in seen} == {True, False}  # both branches explored
    assert {"depth" in values for values in seen} == {True, False}


def test_a_conditional_grid_visits_every_point_of_the_tree_once():
    search = conditional_search("GRID_SEARCH")
    points = (1 + 2) * (1 + 2 * 3)  # opt: adam, or sgd with 2 momentums; width 1, or 2 and 4 with 3 depths each
    assert search.trial_budget == points
    seen = run(search, 40)
    assert len(seen) == points == len({as_point(values) for values in seen})
    assert all(holds_its_conditions(values) for values in seen)


@pytest.mark.parametrize("algorithm", ["GRID_SEARCH", "RANDOM_SEARCH", "ALGORITHM_UNSPECIFIED"])
def test_a_conditional_study_is_restored_from_its_trials(algorithm):
    first = conditional_search(algorithm, 6)
    taken = [first.suggest(str(number)) for number in range(1, 4)]
    search = conditional_search(algorithm, 6, seed=3)
    search.restore([stored(1, taken[0], State.SUCCEEDED, 0.5), stored(2, taken[1], State.FAILED),
                    stored(3, {**taken[2], "momentum": "0.5", "depth": "2"}, State.RUNNING)])  # extra values: ignored
    rest = run(search, 6, first=4)
    assert all(holds_its_conditions(values) for values in rest)
    if algorithm == "GRID_SEARCH":
        assert {as_point(v) for v in rest}.isdisjoint({as_point(v) for v in taken})
    with pytest.raises(ValueError, match="lacks a value for momentum"):  # sgd's momentum is missing
        conditional_search(algorithm).restore([stored(1, {"opt": "sgd", "width": "1"}, State.SUCCEEDED, 0.5)])
