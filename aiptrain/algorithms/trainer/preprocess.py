"""The built-in algorithms' data rules, as the service documented them. Pure: rows of strings in,
a schema and rows out; the standard library only.

Input: CSV, no header row, the target in the first column, categorical or numerical columns,
a blank value is missing. Columns are classified from the training data:
- a column whose values are all integers is an instance key when every value is unique (not a
  feature), categorical when it has only a few distinct values (at most CATEGORICAL_INTEGERS),
  else numerical (the service's rule; `101.0` makes an integer column numerical, `code_101`
  categorical);
- any other column of numbers is numerical, and the rest categorical.
With --preprocess: rows with more than 10% of their values missing (or no target) are dropped,
the validation and test fractions are held out of the training data (a fixed shuffle: the same
data splits the same way), and numerical blanks are filled with the training data's mean.
"""

from __future__ import annotations

import csv
import io
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field

TARGET, NUMERICAL, CATEGORICAL, KEY, WEIGHT = "target", "numerical", "categorical", "key", "weight"
CATEGORICAL_INTEGERS = 20  # an integer column with at most this many distinct values is categorical
MOST_MISSING = 0.10  # a row with a larger fraction of blank values is dropped by --preprocess
SPLIT_SEED = 42
_INTEGER = re.compile(r"[+-]?\d+")


class DataError(ValueError):
    """Data the algorithm cannot take: the job fails with this line."""


def is_number(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return not math.isnan(value) and not math.isinf(value)


def read_rows(text: str, source: str, skip_header: bool = False) -> list[list[str]]:
    """The CSV's rows, values stripped; every row as wide as the first."""
    rows = [[value.strip() for value in row] for row in csv.reader(io.StringIO(text)) if any(v.strip() for v in row)]
    if skip_header and rows:
        rows = rows[1:]
    if not rows:
        raise DataError(f"{source} holds no rows.")
    width = len(rows[0])
    if width < 2:
        raise DataError(f"{source} has one column: the target comes first, then at least one feature column.")
    for number, row in enumerate(rows, start=1):
        if len(row) != width:
            raise DataError(f"Row {number} of {source} has {len(row)} columns where the first has {width}: "
                            "every row needs the same columns (a blank value is written as nothing between commas).")
    return rows


@dataclass
class Column:
    index: int  # in the CSV: 0 is the target
    kind: str
    mean: float = 0.0  # numerical: over the training data (also the fill value)
    std: float = 1.0
    vocabulary: list[str] = field(default_factory=list)  # categorical: training values, most frequent first

    @property
    def name(self) -> str:
        return f"column_{self.index}"

    def to_dict(self) -> dict:
        data: dict = {"index": self.index, "name": self.name, "type": self.kind}
        if self.kind == NUMERICAL:
            data.update(mean=self.mean, std=self.std)
        if self.kind == CATEGORICAL:
            data["vocabulary"] = self.vocabulary
        return data


@dataclass
class Schema:
    """What preprocessing learned from the training data: the model's inputs and its target."""

    model_type: str  # classification or regression
    columns: list[Column]  # one per CSV column, the target first
    classes: list[str] = field(default_factory=list)  # classification: the target's values, in output order
    target_mean: float = 0.0  # regression
    target_std: float = 1.0

    @property
    def features(self) -> list[Column]:
        return [c for c in self.columns if c.kind in (NUMERICAL, CATEGORICAL)]

    def to_dict(self) -> dict:
        target: dict = {"index": 0, "type": self.model_type}
        if self.model_type == "classification":
            target["classes"] = self.classes
        else:
            target.update(mean=self.target_mean, std=self.target_std)
        return {"target": target, "columns": [c.to_dict() for c in self.columns[1:]]}


@dataclass
class Prepared:
    schema: Schema
    training: list[list[str]]
    validation: list[list[str]]
    test: list[list[str]]
    dropped: int = 0  # rows --preprocess dropped


def column_kind(values: list[str]) -> str:
    """numerical, categorical or key, from a column's non-blank training values."""
    if values and all(_INTEGER.fullmatch(v) for v in values):
        distinct = len(set(values))
        if distinct == len(values) and len(values) > 1:
            return KEY
        return CATEGORICAL if distinct <= CATEGORICAL_INTEGERS else NUMERICAL
    if values and all(is_number(v) for v in values):
        return NUMERICAL
    return CATEGORICAL


def too_sparse(row: list[str]) -> bool:
    """More than 10% of the row's values are missing, or its target is."""
    return not row[0] or sum(1 for v in row if not v) > MOST_MISSING * len(row)


def split(rows: list[list[str]], validation: float, test: float) -> tuple[list, list, list]:
    """(training, validation, test) rows: the fractions held out of a fixed shuffle."""
    order = list(range(len(rows)))
    random.Random(SPLIT_SEED).shuffle(order)
    n_validation, n_test = round(len(rows) * validation), round(len(rows) * test)
    held = [rows[i] for i in order[:n_validation]], [rows[i] for i in order[n_validation:n_validation + n_test]]
    return [rows[i] for i in order[n_validation + n_test:]], held[0], held[1]


def prepare(training: list[list[str]], validation: list[list[str]] | None, test: list[list[str]] | None,
            model_type: str, preprocess: bool, fractions: tuple[float, float] = (0.0, 0.0),
            weight_column: bool = False) -> Prepared:
    """The schema and the three sets, preprocessed as the flags say. `validation`/`test`: rows read
    from their own paths (None: held out of the training data with --preprocess, else none)."""
    width = len(training[0])
    for name, rows in (("validation", validation), ("test", test)):
        if rows and len(rows[0]) != width:
            raise DataError(f"The {name} data has {len(rows[0])} columns, the training data {width}: "
                            "they need the same columns.")
    dropped = 0
    if preprocess:
        sets = [training, validation or [], test or []]
        kept = [[row for row in rows if not too_sparse(row)] for rows in sets]
        dropped = sum(len(rows) for rows in sets) - sum(len(rows) for rows in kept)
        training, validation, test = kept[0], kept[1] if validation else None, kept[2] if test else None
        if not training:
            raise DataError("No training row is left once rows with more than 10% of their values missing are "
                            "dropped: fill the blanks.")
        kinds = _kinds(training, weight_column)  # from all the training data, before it is split
        training, held_validation, held_test = split(training, *fractions)
        validation = validation if validation is not None else held_validation
        test = test if test is not None else held_test
    else:
        kinds = _kinds(training, weight_column)
        validation, test = validation or [], test or []
        _check_complete(training, kinds, "training")
        _check_complete(validation, kinds, "validation")
        _check_complete(test, kinds, "test")
    if not training:
        raise DataError("No training row is left once the validation and test data are held out: give more rows.")
    schema = learn(training, kinds, model_type, training + (validation or []) + (test or []))

    def filled(rows: list[list[str]]) -> list[list[str]]:
        return [fill_row(schema, row) for row in rows]

    return Prepared(schema, filled(training), filled(validation or []), filled(test or []), dropped)


def _kinds(rows: list[list[str]], weight_column: bool) -> list[str]:
    kinds = [TARGET]
    for index in range(1, len(rows[0])):
        if weight_column and index == 1:
            kinds.append(WEIGHT)
            continue
        kinds.append(column_kind([row[index] for row in rows if row[index]]))
    return kinds


def _check_complete(rows: list[list[str]], kinds: list[str], name: str) -> None:
    """Without --preprocess, a blank target or numerical value has nothing to fill it."""
    for number, row in enumerate(rows, start=1):
        for index, value in enumerate(row):
            if not value and kinds[index] in (TARGET, NUMERICAL, WEIGHT):
                what = "the target" if index == 0 else f"column {index}"
                raise DataError(f"Row {number} of the {name} data has no value for {what}: fill it, or pass "
                                "--preprocess to drop such rows and fill numerical blanks with the mean.")


def learn(training: list[list[str]], kinds: list[str], model_type: str, every_row: list[list[str]]) -> Schema:
    """The schema: each column's statistics or vocabulary from the training rows, the classes from
    every row (a class only the validation data has still gets an output)."""
    columns = [Column(0, TARGET)]
    for index in range(1, len(kinds)):
        values = [row[index] for row in training if row[index]]
        column = Column(index, kinds[index])
        if column.kind in (NUMERICAL, WEIGHT):
            numbers = [_number(v, index, "column") for v in values]
            column.mean, column.std = _mean_std(numbers)
        elif column.kind == CATEGORICAL:
            counts = Counter(row[index] for row in training)
            column.vocabulary = sorted(counts, key=lambda v: (-counts[v], v))
        columns.append(column)
    schema = Schema(model_type, columns)
    if not schema.features:
        raise DataError("No feature column: every column after the target is an instance key (all its integers "
                        "differ); write a numerical one as floats (101.0) or a categorical one with a prefix (code_101).")
    if model_type == "classification":
        labels = {row[0] for row in every_row}
        schema.classes = sorted(labels, key=_class_order(labels))
        if len(schema.classes) < 2:
            raise DataError(f"The target column has one value ([{schema.classes[0]}]): classification needs at "
                            "least two classes.")
    else:
        schema.target_mean, schema.target_std = _mean_std([_number(row[0], 0, "target") for row in training])
    return schema


def _class_order(labels: set[str]):
    """Numbers in numerical order (0, 1, 2, ..., 10), names alphabetically."""
    if all(is_number(label) for label in labels):
        return float
    return str


def _number(text: str, index: int, what: str) -> float:
    if not is_number(text):
        where = "the target" if index == 0 else f"column {index}"
        fix = " (--model_type=classification takes categories)" if index == 0 else ""
        raise DataError(f"Value [{text}] of {where} is not a number{fix}.")
    return float(text)


def _mean_std(numbers: list[float]) -> tuple[float, float]:
    if not numbers:
        return 0.0, 1.0
    mean = sum(numbers) / len(numbers)
    std = math.sqrt(sum((n - mean) ** 2 for n in numbers) / len(numbers))
    return mean, std if std > 0 else 1.0


def fill_row(schema: Schema, row: list[str]) -> list[str]:
    """A row with its numerical blanks filled with the training mean (categorical blanks are a
    value of their own)."""
    return [repr(column.mean) if not value and column.kind in (NUMERICAL, WEIGHT) else value
            for column, value in zip(schema.columns, row)]  # noqa: B905 - zip(strict=) is Python 3.10's


def targets(schema: Schema, rows: list[list[str]]) -> list[float]:
    """The target of each row: the class's index, or the number."""
    if schema.model_type == "classification":
        index = {label: position for position, label in enumerate(schema.classes)}
        return [float(index[row[0]]) for row in rows]
    return [float(row[0]) for row in rows]


def feature_columns(schema: Schema, rows: list[list[str]]) -> dict[str, list]:
    """Each feature column's values (numbers, or category strings), by column name."""
    return {column.name: [float(row[column.index]) if column.kind == NUMERICAL else row[column.index]
                          for row in rows] for column in schema.features}


def weights(schema: Schema, rows: list[list[str]]) -> list[float] | None:
    weight = [c for c in schema.columns if c.kind == WEIGHT]
    return [float(row[weight[0].index]) for row in rows] if weight else None


def one_hot_names(schema: Schema) -> list[str]:
    """The numeric matrix's column names: numerical columns as they are, a categorical column's
    values one-hot (`column_3=red`), in the schema's order."""
    names = []
    for column in schema.features:
        if column.kind == NUMERICAL:
            names.append(column.name)
        else:
            names += [f"{column.name}={value}" for value in column.vocabulary]
    return names


def one_hot_rows(schema: Schema, rows: list[list[str]]) -> list[list[float]]:
    """The rows as numbers (one_hot_names' columns): a category the training data lacked is all zeros."""
    positions = {column.index: {value: i for i, value in enumerate(column.vocabulary)} for column in schema.features}
    matrix = []
    for row in rows:
        numbers: list[float] = []
        for column in schema.features:
            if column.kind == NUMERICAL:
                numbers.append(float(row[column.index]))
                continue
            hot = [0.0] * len(column.vocabulary)
            if row[column.index] in positions[column.index]:
                hot[positions[column.index][row[column.index]]] = 1.0
            numbers += hot
        matrix.append(numbers)
    return matrix


def to_csv(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()
