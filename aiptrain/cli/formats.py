"""The part of gcloud's `--format` that scripts use on job resources: `json`, `yaml`,
`value(FIELD,...)`, `json(FIELD,...)`/`yaml(FIELD,...)` projections, `table(FIELD,...)`,
`csv[no-heading](FIELD,...)` and `none`. FIELDs are dotted keys of the REST resource
(`trainingInput.region`, `trainingOutput.trials[0].trialId`), optionally with gcloud's
`.basename()` or `.date(FORMAT)` transform and a `:label=NAME` for the header."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import Any

from aiptrain.errors import ValidationError
from aiptrain.filtering import lookup as _lookup

_FORMAT = re.compile(
    r"\s*(?P<kind>json|yaml|value|none|table|csv|tfjob|trainjob|vertex)\s*(?:\[(?P<attrs>[^\]]*)\])?\s*(?:\((?P<fields>.*)\))?\s*",
    re.DOTALL,
)
_COLUMN = re.compile(r"\s*(?P<key>[A-Za-z_][\w\[\]]*(?:\.[A-Za-z_][\w\[\]]*)*?)"
                     r"(?:\.(?P<transform>basename|date)\((?P<args>[^)]*)\))?(?P<attrs>(?::[\w-]+(?:=[^:]*)?)*)\s*")
SUPPORTED = ("json, yaml, none, value(FIELD,...), json(FIELD,...), yaml(FIELD,...), table(FIELD,...) "
             "or csv[no-heading](FIELD,...); a FIELD may end in .basename() or .date(FORMAT) and carry :label=NAME; "
             "trainjob, trainjob[torch], trainjob[tensorflow] (a Kubeflow Trainer v2 TrainJob) or tfjob (a "
             "Kubeflow TFJob, legacy) on `jobs export` and `jobs submit training --dry-run`; vertex (a Vertex AI CustomJob) "
             "on `jobs export`")
# Not views of the resource: the job as Kubeflow manifests (aiptrain.trainjob, aiptrain.tfjob).
TFJOB = "tfjob"
TRAINJOB = "trainjob"
MANIFESTS = (TRAINJOB, TFJOB)
VERTEX = "vertex"  # the job as a Vertex AI CustomJob (aiptrain.vertex.convert): `jobs export JOB --format vertex`
TRAINJOB_RUNTIMES = ("torch", "tensorflow")  # trainjob[RUNTIME]: which Trainer runtime, instead of the job's


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    transform: str | None = None  # basename | date
    date_format: str = "%Y-%m-%dT%H:%M:%S"


@dataclass(frozen=True)
class Format:
    kind: str
    columns: tuple[Column, ...]
    no_heading: bool = False
    runtime: str = ""  # trainjob[RUNTIME]

    @property
    def fields(self) -> list[str]:
        return [column.key for column in self.columns]


def _refuse(spec: str, why: str = "") -> ValidationError:
    return ValidationError(f"--format [{spec}] is not supported here{why}: use {SUPPORTED}.")


def _split_top_level(text: str) -> list[str]:
    """FIELDs separated by commas outside parentheses and quotes (`date("%Y, %m")`)."""
    parts, depth, quote, current = [], 0, "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    return [p for p in (*parts, current) if p.strip()]


def _column(spec: str, text: str) -> Column:
    match = _COLUMN.fullmatch(text)
    if not match:
        raise _refuse(spec, f" (cannot read the field [{text.strip()}])")
    key, transform, args = match.group("key", "transform", "args")
    label = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key.rsplit(".", 1)[-1].split("[")[0]).upper()
    for attribute in filter(None, match.group("attrs").split(":")):
        name, _, value = attribute.partition("=")
        if name == "label":
            label = value.strip().strip("\"'")
    date_format = "%Y-%m-%dT%H:%M:%S"
    if transform == "date":
        first = [a.strip() for a in _split_top_level(args or "") if "=" not in a]
        date_format = first[0].strip("\"'") if first else date_format
    return Column(key, label, transform, date_format)


def parse_format(spec: str) -> Format:
    """A --format value; anything outside the supported subset is a ValidationError (exit 2)."""
    match = _FORMAT.fullmatch(spec)
    if not match:
        raise _refuse(spec)
    kind, attrs = match.group("kind"), match.group("attrs") or ""
    columns = tuple(_column(spec, item) for item in _split_top_level(match.group("fields") or ""))
    if kind in ("value", "table") and not columns:
        raise _refuse(spec, f" ({kind} needs fields)")
    if kind in ("json", "yaml", "none") and any(c.transform for c in columns):
        raise _refuse(spec, " (transforms are for value, table and csv)")
    if kind == TFJOB and (columns or attrs):
        raise _refuse(spec, " (tfjob takes no fields)")
    if kind == VERTEX and (columns or attrs):
        raise _refuse(spec, " (vertex takes no fields)")
    if kind == TRAINJOB and (columns or attrs.strip() not in ("", *TRAINJOB_RUNTIMES)):
        raise _refuse(spec, " (trainjob takes no fields, and [torch] or [tensorflow] at most)")
    return Format(kind, columns, no_heading="no-heading" in attrs, runtime=attrs.strip() if kind == TRAINJOB else "")


def parse(spec: str) -> tuple[str, list[str]]:
    """(kind, fields) of a --format value; anything else is a ValidationError (exit 2)."""
    parsed = parse_format(spec)
    return parsed.kind, parsed.fields


def _project(resource: dict, fields: list[str]) -> dict:
    """The resource cut down to FIELDs, keeping their nesting (yaml(trainingInput.region))."""
    if not fields:
        return resource
    projected: dict = {}
    for path in fields:
        value = _lookup(resource, path)
        if value is None:
            continue
        *parents, leaf = path.split(".")
        target = projected
        for key in parents:
            target = target.setdefault(key, {})
        target[leaf] = value
    return projected


def _value_cell(value: Any) -> str:
    """gcloud's value() rendering: lists joined with `;`, maps as `k=v;...`, None empty."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ";".join(_value_cell(item) for item in value)
    if isinstance(value, dict):
        return ";".join(f"{k}={_value_cell(v)}" for k, v in value.items())
    return str(value)


def _cell(item: dict, column: Column) -> str:
    value = _lookup(item, column.key)
    if value is None:
        return ""
    if column.transform == "basename":
        return str(value).rstrip("/").rsplit("/", 1)[-1]
    if column.transform == "date":
        try:
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return str(value)
        return moment.astimezone(_local_zone(moment)).strftime(column.date_format)
    return _value_cell(value)


def _local_zone(moment: datetime) -> timezone:
    """The zone `moment.astimezone()` would convert to (the local offset at that instant, named
    as the C library names it), without its cost per call: tables convert thousands of times."""
    local = time.localtime(moment.timestamp())
    return _zone(local.tm_gmtoff, local.tm_zone)


@lru_cache(maxsize=64)
def _zone(offset_seconds: int, name: str) -> timezone:
    return timezone(timedelta(seconds=offset_seconds), name)


def _flat_columns(items: list[dict]) -> tuple[Column, ...]:
    """Every leaf key of the items, for csv without fields."""
    keys: dict[str, None] = {}

    def walk(data: dict, prefix: str) -> None:
        for key, value in data.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                keys[f"{prefix}{key}"] = None

    for item in items:
        walk(item, "")
    return tuple(Column(key, key) for key in sorted(keys))


def table_text(headers: list[str] | None, rows: list[list[str]]) -> str:
    """gcloud's table: left-aligned columns two spaces apart, no padding after the last."""
    lines = ([headers] if headers else []) + rows
    if not lines:
        return ""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)).rstrip() + "\n" for line in lines)


def _csv_text(headers: list[str] | None, rows: list[list[str]]) -> str:
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerows(([headers] if headers else []) + rows)
    return buffer.getvalue()


def render(data: dict | list[dict], spec: str) -> str:
    """One resource or a list of them in the given --format; '' for `none` (and for tables of nothing)."""
    parsed = parse_format(spec)
    kind = parsed.kind
    items = data if isinstance(data, list) else [data]
    many = isinstance(data, list)
    if kind == "none":
        return ""
    if kind in MANIFESTS:
        raise ValidationError(
            f"--format {kind} prints a job as Kubeflow manifests: use it with `aiptrain jobs export JOB` or "
            "`aiptrain jobs submit training ... --dry-run`."
        )
    if kind == VERTEX:
        raise ValidationError("--format vertex prints a job as a Vertex AI CustomJob: use it with `aiptrain jobs export "
                              "JOB`, or convert a --config with `aiptrain jobs convert --config FILE`.")
    if kind in ("value", "table", "csv"):
        columns = parsed.columns or _flat_columns(items)
        rows = [[_cell(item, column) for column in columns] for item in items]
        if kind == "value":
            return "".join("\t".join(row) + "\n" for row in rows)
        if not rows:
            return ""
        if kind == "table":
            return table_text(None if parsed.no_heading else [column.label for column in columns], rows)
        # gcloud's csv heads columns with the labels in lower case (`job_id`), keys as-is without fields.
        headers = [column.label.lower() if parsed.columns else column.key for column in columns]
        return _csv_text(None if parsed.no_heading else headers, rows)
    projected = [_project(item, parsed.fields) for item in items]
    if many and not items:
        return "[]\n" if kind == "json" else ""
    if kind == "json":
        return json.dumps(projected if many else projected[0], indent=2, sort_keys=True) + "\n"
    return "---\n".join(dump_yaml(item) for item in projected)


def manifest_format(spec: str | None) -> Format | None:
    """The --format when it asks for Kubeflow manifests (trainjob, tfjob), else None."""
    if not spec:
        return None
    parsed = parse_format(spec)
    return parsed if parsed.kind in MANIFESTS else None


def dump_yaml(data: Any) -> str:
    """YAML as gcloud prints resources, multi-line strings (errorMessage) as `|` block literals
    a person can read."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str):
        style = "|" if "\n" in value.strip("\n") else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump(data, Dumper=Dumper, sort_keys=True, default_flow_style=False, allow_unicode=True)
