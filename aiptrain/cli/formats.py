"""The part of gcloud's `--format` that scripts use on job resources: `json`, `yaml`,
`value(FIELD,...)`, `json(FIELD,...)`/`yaml(FIELD,...)` projections and `none`.
FIELDs are dotted keys of the REST resource (`trainingInput.region`)."""

from __future__ import annotations

import json
import re
from typing import Any

from aiptrain.errors import ValidationError

_FORMAT = re.compile(r"\s*(json|yaml|value|none)\s*(?:\((.*)\))?\s*", re.DOTALL)


def parse(spec: str) -> tuple[str, list[str]]:
    """(kind, fields) of a --format value; anything else is a ValidationError (exit 2)."""
    match = _FORMAT.fullmatch(spec)
    fields = [f.strip() for f in (match.group(2) or "").split(",") if f.strip()] if match else []
    if not match or (match.group(1) == "value" and not fields):
        raise ValidationError(
            f"--format [{spec}] is not supported here: use json, yaml, value(FIELD,...), "
            "json(FIELD,...), yaml(FIELD,...) or none."
        )
    return match.group(1), fields


def _lookup(data: Any, path: str) -> Any:
    """The value at a dotted path; through a list, the list of its items' values."""
    key, _, rest = path.partition(".")
    if isinstance(data, (list, tuple)):
        return [_lookup(item, path) for item in data]
    if not isinstance(data, dict):
        return None
    return _lookup(data.get(key), rest) if rest else data.get(key)


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


def render(data: dict | list[dict], spec: str) -> str:
    """One resource or a list of them in the given --format; '' for `none`."""
    import yaml

    kind, fields = parse(spec)
    many = isinstance(data, list)
    items = data if many else [data]
    if kind == "none":
        return ""
    if kind == "value":
        return "".join("\t".join(_value_cell(_lookup(item, f)) for f in fields) + "\n" for item in items)
    projected = [_project(item, fields) for item in items]
    if many and not items:
        return "[]\n" if kind == "json" else ""
    if kind == "json":
        return json.dumps(projected if many else projected[0], indent=2, sort_keys=True) + "\n"
    documents = [yaml.safe_dump(item, sort_keys=True, default_flow_style=False, allow_unicode=True)
                 for item in projected]
    return "---\n".join(documents)
