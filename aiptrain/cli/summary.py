"""`jobs describe --summarize`: gcloud's summary tables of a training job (jobs_util's
_JOB_SUMMARY formats): Job Overview, Training Input Summary, Training Output Summary and, for
hyperparameter tuning jobs, Training Output Trials. Boxed like gcloud's `table[box]`, plain
text (no terminal styling), never wrapped when piped."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import click

from aiptrain.model import trial_order


@dataclass(frozen=True)
class Column:
    """One column of a gcloud table format: a dotted key into the resource; `optional` columns
    are left out when no row has a value, as gcloud's `:optional`."""

    key: str
    label: str = ""
    optional: bool = False

    @property
    def header(self) -> str:
        return self.label or re.sub(r"(?<!^)(?=[A-Z])", "_", self.key.split(".")[-1]).upper()


OVERVIEW = (Column("jobId"), Column("createTime"), Column("startTime"), Column("endTime"), Column("state"))
TRAINING_INPUT = (
    Column("runtimeVersion", optional=True), Column("region"), Column("scaleTier", optional=True),
    Column("pythonModule"), Column("parameterServerType", optional=True),
    Column("parameterServerCount", optional=True), Column("masterType", optional=True),
    Column("workerType", optional=True), Column("workerCount", optional=True), Column("jobDir", optional=True),
)
TRAINING_OUTPUT = (Column("completedTrialCount", "TRIALS", optional=True), Column("consumedMLUnits", "ML_UNITS"))
TRIALS = (
    Column("trialId", "TRIAL"), Column("finalMetric.objectiveValue", "OBJECTIVE_VALUE"),
    Column("finalMetric.trainingStep", "STEP"), Column("hyperparameters"),
)


def cell(resource: dict[str, Any], key: str) -> str:
    """The text of one field, as gcloud's table prints it (maps as `key=value` lines)."""
    value: Any = resource
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, dict):
        return "\n".join(f"{name}={item}" for name, item in value.items())
    return str(value)


def table_rows(columns: Iterable[Column], resources: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and cell texts, without the optional columns that are empty in every row."""
    cells = {column: [cell(resource, column.key) for resource in resources] for column in columns}
    kept = [column for column, values in cells.items() if not column.optional or any(values)]
    return [column.header for column in kept], [[cells[column][row] for column in kept]
                                                for row in range(len(resources))]


def best_first(trials: list[dict[str, Any]], spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Trials sorted by objective, the best first for the study's goal (gcloud sorts by trialId,
    which hides the answer a study exists for); trials without an objective last, by trialId."""
    sign = 1 if str(spec.get("goal", "")).upper() == "MINIMIZE" else -1

    def key(trial: dict[str, Any]):
        objective = (trial.get("finalMetric") or {}).get("objectiveValue")
        ranked = (0, sign * objective) if objective is not None else (1, 0.0)
        return ranked, trial_order(str(trial.get("trialId", "")))

    return sorted(trials, key=key)


def summary_tables(resource: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, headers, rows) of each table, in gcloud's order."""
    training_input = resource.get("trainingInput", {})
    training_output = resource.get("trainingOutput", {})
    tables = [
        ("Job Overview", *table_rows(OVERVIEW, [resource])),
        ("Training Input Summary", *table_rows(TRAINING_INPUT, [training_input])),
        ("Training Output Summary", *table_rows(TRAINING_OUTPUT, [training_output])),
    ]
    trials = best_first(training_output.get("trials") or [], training_input.get("hyperparameters") or {})
    if training_input.get("hyperparameters") and trials:
        tables.append(("Training Output Trials", *table_rows(TRIALS, trials)))
    return tables


def boxed(title: str, headers: list[str], rows: list[list[str]], width: int | None = None) -> list[str]:
    """A table as gcloud's `table[box,title=...]` draws it: the title in the box's first row."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SQUARE, min_width=len(title) + 4)
    for header in headers:
        table.add_column(header, no_wrap=width is None, overflow="fold")
    for row in rows:
        table.add_row(*(Text(value) for value in row))  # Text: no cell is read as markup
    console = Console(width=width or 10_000, color_system=None, highlight=False)
    with console.capture() as captured:
        console.print(table)
    top, *rest = [line.rstrip() for line in captured.get().splitlines()]
    inner = len(top) - 2
    return [f"┌{'─' * inner}┐", f"│{title.center(inner)}│", f"├{top[1:-1]}┤", *rest]


def print_summary(job) -> None:
    """The summary tables, wrapped to the terminal's width on one; never wrapped when piped."""
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    lines = [line for table in summary_tables(job.to_resource()) for line in boxed(*table, width=width)]
    click.echo("\n".join(lines))
