"""The built-in algorithms' flags, as the service documented them: each algorithm's table of
flags (type, default, range), and one parser that turns the job's args into checked values or
one line naming the problem. Pure: the standard library only.

The service passed everything after `--` to the algorithm and appended `--job-dir`; a tuning
trial's values came after the user's args, so a flag given twice takes its last value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GUIDE = "docs/guide/built-in-algorithms.md"
TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")


class FlagError(ValueError):
    """A flag the algorithm does not take, or a value out of its range: the job fails with this line."""


@dataclass(frozen=True)
class Flag:
    name: str
    kind: str  # bool, int, float, str, choice, int_list
    default: Any = None
    help: str = ""
    low: float | None = None  # the smallest value allowed
    high: float | None = None  # the largest value allowed
    above: float | None = None  # values must be greater than this
    below: float | None = None  # values must be less than this
    choices: tuple[str, ...] = ()
    required: bool = False

    def parse(self, text: str) -> Any:
        """The value of `--name=text`, checked; FlagError naming the flag and what it takes."""
        value = self._typed(text.strip())
        numbers = value if isinstance(value, list) else [value]
        for number in numbers if self.kind in ("int", "float", "int_list") else ():
            if not self._in_range(number):
                raise FlagError(f"--{self.name}={text} is out of range: it takes {self.takes()}.")
        return value

    def _typed(self, text: str) -> Any:
        try:
            if self.kind == "bool":
                if text.lower() in TRUE_WORDS:
                    return True
                if text.lower() in FALSE_WORDS:
                    return False
                raise ValueError(text)
            if self.kind == "int":
                return int(text)
            if self.kind == "float":
                value = float(text)
                if value != value or value in (float("inf"), float("-inf")):
                    raise ValueError(text)
                return value
            if self.kind == "int_list":
                values = [int(part) for part in text.replace(" ", "").split(",")]
                if not values:
                    raise ValueError(text)
                return values
        except ValueError:
            raise FlagError(f"--{self.name}={text} is not valid: it takes {self.takes()}.") from None
        if self.kind == "choice" and text not in self.choices:
            raise FlagError(f"--{self.name}={text} is not valid: it takes {self.takes()}.")
        if not text:
            raise FlagError(f"--{self.name} is empty: it takes {self.takes()}.")
        return text

    def _in_range(self, number: float) -> bool:
        return not ((self.low is not None and number < self.low) or (self.high is not None and number > self.high)
                    or (self.above is not None and number <= self.above)
                    or (self.below is not None and number >= self.below))

    def takes(self) -> str:
        """What the flag takes, in words: 'an integer of at least 1', 'one of ftrl, sgd, adam'."""
        if self.kind == "bool":
            return "true or false (or no value: true)"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "str":
            return "a string"
        noun = {"int": "an integer", "float": "a number", "int_list": "comma-separated integers"}[self.kind]
        bounds = [f"at least {_number(self.low)}" if self.low is not None else "",
                  f"at most {_number(self.high)}" if self.high is not None else "",
                  f"greater than {_number(self.above)}" if self.above is not None else "",
                  f"less than {_number(self.below)}" if self.below is not None else ""]
        shown = " and ".join(bound for bound in bounds if bound)
        if not shown:
            return noun
        return f"{noun}, each {shown}" if self.kind == "int_list" else f"{noun} of {shown}".replace("of greater", "greater").replace("of less", "less")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# -- the tables ------------------------------------------------------------------------------------

def _data_flags() -> list[Flag]:
    """What every algorithm takes to find and split its data (the service's 'data format arguments')."""
    return [
        Flag("preprocess", "bool", False, "Split the data, fill numerical blanks with the column's mean, drop rows "
             "with more than 10% of values missing, classify integer columns."),
        Flag("training_data_path", "str", None, "CSV file, gs:// (or a path the replica sees): no header row, "
             "target first, blank = missing.", required=True),
        Flag("validation_data_path", "str", None, "CSV file of the same format as the training data."),
        Flag("test_data_path", "str", None, "CSV file of the same format as the training data."),
        Flag("job_dir", "str", None, "Where model/, processed_data/, artifacts/ and experiment/ are written "
             "(the job's --job-dir).", required=True),
        Flag("validation_split", "float", 0.2, "With --preprocess: the fraction of the training data kept for "
             "validation (not with --validation_data_path); validation_split + test_split <= 0.40.", low=0, high=0.4),
        Flag("test_split", "float", 0.2, "With --preprocess: the fraction of the training data kept for testing "
             "(not with --test_data_path).", low=0, high=0.4),
    ]


def _tensorflow_training_flags(learning_rate: float, batch_size: int) -> list[Flag]:
    """The training loop's flags, shared by the TensorFlow algorithms."""
    return [
        Flag("model_type", "choice", None, "The learning task.", choices=("classification", "regression"),
             required=True),
        Flag("max_steps", "int", None, "Training steps (batches); default: 10 epochs of the training data.", low=1),
        Flag("batch_size", "int", batch_size, "Rows per training step.", low=1),
        Flag("learning_rate", "float", learning_rate, "The optimizer's learning rate.", above=0),
        Flag("eval_steps", "int", None, "Batches each evaluation reads; default: the whole validation data.", low=1),
        Flag("eval_frequency_secs", "int", 600, "Seconds between evaluations (and checkpoints) while training; "
             "training also ends with one.", low=1),
    ]


def _optimizer_flags(prefix: str = "", default: str = "ftrl",
                     choices: tuple[str, ...] = ("ftrl", "sgd", "adam")) -> list[Flag]:
    part = "the deep part's " if prefix else ""
    return [
        Flag(f"{prefix}optimizer_type", "choice", default, f"{part.capitalize() or 'The '}optimizer.",
             choices=choices),
        Flag(f"{prefix}l1_regularization_strength", "float", 0.0, f"L1 regularization of {part or 'the '}weights.",
             low=0),
        Flag(f"{prefix}l2_regularization_strength", "float", 0.0, f"L2 regularization of {part or 'the '}weights.",
             low=0),
    ]


def _linear_flags() -> list[Flag]:
    return [
        *_optimizer_flags(),
        Flag("l2_shrinkage_regularization_strength", "float", 0.0, "ftrl only: L2 shrinkage (a magnitude penalty).",
             low=0),
        Flag("beta_1", "float", 0.9, "adam only: the decay of the first-moment estimates.", low=0, below=1),
        Flag("beta_2", "float", 0.999, "adam only: the decay of the second-moment estimates.", low=0, below=1),
    ]


def _wide_deep_flags() -> list[Flag]:
    return [
        Flag("use_wide", "bool", False, "Feed the categorical columns to the wide (linear) part."),
        Flag("embed_categories", "bool", False, "Feed the categorical columns to the deep part as embeddings "
             "(else as one-hot vectors, unless --use_wide takes them)."),
        Flag("hidden_units", "int_list", [30, 30, 30], "The deep part's hidden layer sizes, e.g. 64,32.", low=1),
        Flag("dnn_learning_rate", "float", 0.001, "The deep part's learning rate.", above=0),
        *_optimizer_flags("dnn_", "adam", ("adam", "adagrad", "ftrl", "sgd")),
        Flag("dnn_dropout", "float", 0.0, "Dropout between the deep part's layers.", low=0, below=1),
    ]


def _tabnet_flags() -> list[Flag]:
    return [
        Flag("optimizer_type", "choice", "adam", "The optimizer.", choices=("adam", "sgd")),
        Flag("feature_dim", "int", 64, "Width of each feature transformer layer (N_a + N_d).", low=2),
        Flag("feature_dim_ratio", "float", 0.5, "The share of feature_dim that goes to the decision output (N_d).",
             above=0, below=1),
        Flag("num_decision_steps", "int", 6, "Sequential attention steps.", low=2),
        Flag("relaxation_factor", "float", 1.5, "How freely a feature is used again at later steps.", low=1),
        Flag("sparsity_loss_weight", "float", 0.00001, "Weight of the attention masks' entropy in the loss.", low=0),
        Flag("batch_momentum", "float", 0.95, "Batch normalization's momentum.", above=0, below=1),
        Flag("decay_every", "int", 10000, "Steps between learning-rate decays.", low=1),
        Flag("decay_rate", "float", 0.95, "Learning-rate decay factor.", above=0, high=1),
        Flag("num_transformer_layers", "int", 4, "Layers of each feature transformer.", low=1),
        Flag("num_transformer_layers_ratio", "float", 0.5, "The share of those layers shared by every step.",
             low=0, high=1),
        Flag("data_has_header", "bool", False, "The CSV files start with a header row, skipped."),
    ]


XGBOOST_OBJECTIVES = (
    "reg:squarederror", "reg:linear", "reg:squaredlogerror", "reg:logistic", "reg:pseudohubererror",
    "reg:gamma", "reg:tweedie", "count:poisson", "binary:logistic", "binary:logitraw", "binary:hinge",
    "multi:softmax", "multi:softprob",
)


def _xgboost_flags() -> list[Flag]:
    """XGBoost's own parameters, passed through to xgboost.train as given (its defaults apply
    to those not given); num_boost_round and the CSV weight column are the algorithm's."""
    return [
        Flag("objective", "choice", "reg:squarederror", "The learning objective (reg:linear is "
             "reg:squarederror's old name).", choices=XGBOOST_OBJECTIVES),
        Flag("num_class", "int", None, "Classes of a multi: objective (default: as many as the target has).", low=2),
        Flag("num_boost_round", "int", 10, "Boosting rounds.", low=1),
        Flag("eval_metric", "str", None, "XGBoost's evaluation metric, e.g. error, logloss, rmse, auc."),
        Flag("booster", "choice", "gbtree", "The booster.", choices=("gbtree", "gblinear", "dart")),
        Flag("eta", "float", 0.3, "Step size shrinkage.", low=0, high=1),
        Flag("gamma", "float", 0.0, "Minimum loss reduction to split a leaf.", low=0),
        Flag("max_depth", "int", 6, "Maximum tree depth (0: no limit, with grow_policy lossguide).", low=0),
        Flag("min_child_weight", "float", 1.0, "Minimum sum of instance weight in a child.", low=0),
        Flag("max_delta_step", "float", 0.0, "Maximum delta step of each leaf's output.", low=0),
        Flag("subsample", "float", 1.0, "Fraction of rows sampled per tree.", above=0, high=1),
        Flag("colsample_bytree", "float", 1.0, "Fraction of columns sampled per tree.", above=0, high=1),
        Flag("colsample_bylevel", "float", 1.0, "Fraction of columns sampled per level.", above=0, high=1),
        Flag("colsample_bynode", "float", 1.0, "Fraction of columns sampled per split.", above=0, high=1),
        Flag("lambda", "float", 1.0, "L2 regularization of the weights.", low=0),
        Flag("alpha", "float", 0.0, "L1 regularization of the weights.", low=0),
        Flag("tree_method", "choice", "auto", "Tree construction.", choices=("auto", "exact", "approx", "hist")),
        Flag("sketch_eps", "float", 0.03, "approx only: the sketch's accuracy.", above=0, below=1),
        Flag("scale_pos_weight", "float", 1.0, "Balance of positive and negative weights.", above=0),
        Flag("updater", "str", None, "Comma-separated tree updaters, e.g. grow_colmaker,prune."),
        Flag("refresh_leaf", "int", 1, "refresh updater: also refresh leaf values (1) or only statistics (0).",
             low=0, high=1),
        Flag("process_type", "choice", "default", "Boosting process.", choices=("default", "update")),
        Flag("grow_policy", "choice", "depthwise", "How new nodes are added.", choices=("depthwise", "lossguide")),
        Flag("max_leaves", "int", 0, "Maximum leaves (lossguide).", low=0),
        Flag("max_bin", "int", 256, "hist only: maximum bins per feature.", low=2),
        Flag("num_parallel_tree", "int", 1, "Trees grown per round.", low=1),
        Flag("base_score", "float", 0.5, "Initial prediction score."),
        Flag("seed", "int", 0, "Random seed."),
        Flag("tweedie_variance_power", "float", 1.5, "reg:tweedie only.", low=1, below=2),
        Flag("sample_type", "choice", "uniform", "dart only.", choices=("uniform", "weighted")),
        Flag("normalize_type", "choice", "tree", "dart only.", choices=("tree", "forest")),
        Flag("rate_drop", "float", 0.0, "dart only: dropout rate.", low=0, high=1),
        Flag("one_drop", "int", 0, "dart only: always drop a tree (1).", low=0, high=1),
        Flag("skip_drop", "float", 0.0, "dart only: probability of skipping dropout.", low=0, high=1),
        Flag("feature_selector", "choice", "cyclic", "gblinear only.",
             choices=("cyclic", "shuffle", "random", "greedy", "thrifty")),
        Flag("top_k", "int", 0, "gblinear greedy/thrifty only: features considered.", low=0),
        Flag("csv_weight", "int", 0, "1: the CSV's second column is each row's weight (the target stays first).",
             low=0, high=1),
    ]


@dataclass(frozen=True)
class Spec:
    """One algorithm's flags."""

    title: str
    flags: tuple[Flag, ...]

    @property
    def by_name(self) -> dict[str, Flag]:
        return {flag.name: flag for flag in self.flags}


SPECS: dict[str, Spec] = {
    "linear_learner": Spec("linear learner", tuple(
        _data_flags() + _tensorflow_training_flags(0.001, 100) + _linear_flags())),
    "wide_deep_learner": Spec("wide and deep", tuple(
        _data_flags() + _tensorflow_training_flags(0.001, 100) + _linear_flags() + _wide_deep_flags())),
    "boosted_trees": Spec("XGBoost", tuple(_data_flags() + _xgboost_flags())),
    "tab_net": Spec("TabNet", tuple(_data_flags() + _tensorflow_training_flags(0.01, 1024) + _tabnet_flags())),
}


# -- parsing -----------------------------------------------------------------------------------------

@dataclass
class Flags:
    """The checked values of every flag (defaults where not given), and which were given."""

    values: dict[str, Any]
    given: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)  # lines for the job's log: flags taken but without effect

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def parse(algorithm: str, args: list[str]) -> Flags:
    """The job's args as the algorithm's checked flags; FlagError (one line) for anything else."""
    spec = SPECS[algorithm]
    table = spec.by_name
    values = {flag.name: flag.default for flag in spec.flags}
    given: set[str] = set()
    position = 0
    while position < len(args):
        arg = args[position]
        position += 1
        if not arg.startswith("--") or arg == "--":
            raise FlagError(f"Unexpected argument [{arg}]: the {spec.title} takes only --name=value flags "
                            f"(see {GUIDE}).")
        name, has_value, text = arg[2:].partition("=")
        name = name.replace("-", "_")  # --job-dir, as the service appends it, and --job_dir alike
        flag = table.get(name)
        if flag is None:
            raise FlagError(f"Unknown argument [--{name}]: the built-in {spec.title} does not take it "
                            f"(its flags: {GUIDE}).")
        if not has_value:
            if flag.kind == "bool":
                text = "true"
            elif position < len(args) and not args[position].startswith("--"):
                text = args[position]
                position += 1
            else:
                raise FlagError(f"--{name} needs a value: it takes {flag.takes()}.")
        values[name] = flag.parse(text)
        given.add(name)
    for flag in spec.flags:
        if flag.required and values[flag.name] is None:
            where = " (the job's --job-dir)" if flag.name == "job_dir" else ""
            raise FlagError(f"--{flag.name} is required by the built-in {spec.title}{where}.")
    flags = Flags(values, given)
    check_together(flags)
    return flags


def check_together(flags: Flags) -> None:
    """The rules that tie flags together, as the service's reference states them. What it
    documented as having no effect (a split without --preprocess, or beside its own path) is
    taken and ignored, with a note for the job's log: command lines that passed it still run."""
    given = flags.given
    if flags.validation_split + flags.test_split > 0.4 + 1e-9:
        raise FlagError(f"--validation_split ({flags.validation_split}) + --test_split ({flags.test_split}) is "
                        "above 0.40: lower one of them.")
    for split, path in (("validation_split", "validation_data_path"), ("test_split", "test_data_path")):
        if split not in given:
            continue
        if not flags.preprocess:
            flags.notes.append(f"--{split} is ignored: it takes effect with --preprocess only.")
        elif flags.values[path]:
            flags.notes.append(f"--{split} is ignored: --{path} gives the {split.split('_')[0]} data.")


def split_fractions(flags: Flags) -> tuple[float, float]:
    """(validation, test) fractions of the training data that preprocessing holds out: none for a
    set given by its own path."""
    validation = 0.0 if flags.validation_data_path else flags.validation_split
    test = 0.0 if flags.test_data_path else flags.test_split
    return validation, test
