"""gcloud's `--filter` and `--sort-by` for `jobs list`, evaluated on Job resources (camelCase
dicts). Pure: parsing, evaluation and the part of a query the store can answer itself.

The subset of `gcloud topic filters` supported:
- `key:pattern`  has: case-insensitive, true if the value or one of its words matches; `*` is a
  wildcard (`jobId:census*`); `key:*` is true when the key has a value; on a map (labels),
  true when a key matches.
- `key=pattern`, `key!=pattern`  the whole value, case-sensitive, `*` as wildcard.
- `key<v`, `key<=v`, `key>v`, `key>=v`  numbers as numbers, times (`createTime>2026-01-01`,
  local time when no zone is given) as instants, other values as text.
- `key~regex`, `key!~regex`  a regular expression search.
- `key:(a b)`, `key=(a OR b)`  any of the values.
- `AND` (or just a space), `OR`, `NOT`/`-` and parentheses; a bare word matches any value.
Keys are dotted paths (`labels.team`, `trainingInput.region`, `trainingOutput.trials[0].trialId`).
"""

from __future__ import annotations

import fnmatch
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, TypeVar

from aiptrain.errors import ValidationError
from aiptrain.logs import printable
from aiptrain.states import STATE_NAMES

T = TypeVar("T")
OPERATORS = ("!=", "<=", ">=", "!~", ":", "=", "<", ">", "~")
# Keys the store keeps in columns of its own, so it can filter and sort on them in SQL.
COLUMNS = {"jobId": "name", "state": "state", "createTime": "create_time"}
_LABEL_KEY = re.compile(r"labels\.[\w-]+")  # and `labels.KEY`, from the labels column


@dataclass(frozen=True)
class Term:
    key: str | None  # None: a bare word, matched against every value
    op: str
    values: tuple[str, ...]  # more than one: any of them


@dataclass(frozen=True)
class Not:
    operand: Expr


@dataclass(frozen=True)
class BoolOp:
    op: str  # AND | OR
    operands: tuple[Expr, ...]


Expr = Term | Not | BoolOp


@dataclass(frozen=True)
class SortKey:
    key: str
    descending: bool = False


# -- parsing ----------------------------------------------------------------------------------

_TOKEN = re.compile(r"""\s*(?:(?P<paren>[()])|(?P<word>(?:"(?:[^"\\]|\\.)*"|'[^']*'|[^\s()"'])+))""")
_TERM = re.compile(r"(?P<key>[A-Za-z_][\w.\[\]-]*?)(?P<op>!=|<=|>=|!~|:|=|<|>|~)(?P<rest>.*)", re.DOTALL)


_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}

MAX_NESTING = 100  # parentheses and NOTs inside each other: far beyond any real filter, far below Python's stack
_SHOWN_CHARACTERS = 80  # of an expression echoed in an error


class FilterSyntaxError(ValidationError):
    def __init__(self, expression: str, problem: str):
        shown = expression if len(expression) <= _SHOWN_CHARACTERS else expression[:_SHOWN_CHARACTERS] + "..."
        super().__init__(f"--filter [{printable(shown, one_line=True)}]: {problem}; see `gcloud topic filters` "
                         "for the syntax.")


def _tokens(text: str) -> list[str]:
    """Words, quoted strings and parentheses; `key:(`, `key=value` stay one word."""
    tokens, position = [], 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if not match or match.end() == position:
            break
        tokens.append(match.group("paren") or match.group("word"))
        position = match.end()
    return tokens


def _unquote(token: str) -> str:
    if len(token) >= 2 and token[0] == token[-1] and token[0] in "\"'":
        return re.sub(r"\\(.)", r"\1", token[1:-1]) if token[0] == '"' else token[1:-1]
    return token


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokens(text)
        self.index = 0
        self.depth = 0  # of parentheses and NOTs open around the current token

    def nested(self) -> None:
        """Enter one more level of nesting; refused past MAX_NESTING (the parser recurses on each)."""
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(f"parentheses and NOTs are nested more than {MAX_NESTING} deep: write a flatter expression")

    def error(self, problem: str) -> FilterSyntaxError:
        return FilterSyntaxError(self.text, problem)

    def peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise self.error("the expression ends too early")
        self.index += 1
        return token

    def parse(self) -> Expr:
        expr = self.disjunction()
        if self.peek() is not None:
            raise self.error(f"unexpected [{self.peek()}]")
        return expr

    def disjunction(self) -> Expr:
        operands = [self.conjunction()]
        while self.peek() == "OR":
            self.take()
            operands.append(self.conjunction())
        return operands[0] if len(operands) == 1 else BoolOp("OR", tuple(operands))

    def conjunction(self) -> Expr:
        operands = [self.negation()]
        while self.peek() not in (None, ")", "OR"):
            if self.peek() == "AND":
                self.take()
            operands.append(self.negation())
        return operands[0] if len(operands) == 1 else BoolOp("AND", tuple(operands))

    def negation(self) -> Expr:
        token = self.peek()
        if token == "NOT":
            self.take()
            return self.negated()
        if token and token.startswith("-") and len(token) > 1 and not token[1].isdigit():
            self.tokens[self.index] = token[1:]
            return self.negated()
        return self.primary()

    def negated(self) -> Expr:
        self.nested()
        operand = self.negation()
        self.depth -= 1
        return Not(operand)

    def primary(self) -> Expr:
        token = self.take()
        if token == "(":
            self.nested()
            expr = self.disjunction()
            if self.peek() != ")":
                raise self.error("a `(` is not closed")
            self.take()
            self.depth -= 1
            return expr
        if token in (")", "AND", "OR"):
            raise self.error(f"unexpected [{token}]")
        match = _TERM.fullmatch(token) if token[0] not in "\"'" else None
        if not match:
            return Term(None, ":", (_unquote(token),))
        key, op, rest = match.group("key", "op", "rest")
        if rest:
            return Term(key, op, (_unquote(rest),))
        return Term(key, op, self.values())

    def values(self) -> tuple[str, ...]:
        """The value after `key OP`: the next token, or a parenthesised list of them."""
        token = self.take()
        if token != "(":
            if token in (")", "AND", "OR", "NOT"):
                raise self.error(f"a value is missing before [{token}]")
            return (_unquote(token),)
        values = []
        while (token := self.take()) != ")":
            if token not in ("OR", "("):
                values.append(_unquote(token))
        if not values:
            raise self.error("an empty list of values `()`")
        return tuple(values)


def parse(text: str) -> Expr:
    """The expression of a --filter value; FilterSyntaxError (exit 2) when it is malformed."""
    if not text.strip():
        raise FilterSyntaxError(text, "the expression is empty")
    return _Parser(text).parse()


def parse_sort_keys(sort_by: str | Iterable[str] | None) -> tuple[SortKey, ...]:
    """`--sort-by ~createTime,jobId` (or a list of such) -> sort keys, `~` meaning descending."""
    if not sort_by:
        return ()
    items = sort_by.split(",") if isinstance(sort_by, str) else [p for s in sort_by for p in s.split(",")]
    keys = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        descending = item.startswith("~")
        name = item.lstrip("~")
        if not re.fullmatch(r"[A-Za-z_][\w.\[\]]*", name):
            raise ValidationError(f"--sort-by [{item}] is not a field name: use e.g. `~createTime` or `jobId`.")
        keys.append(SortKey(name, descending))
    return tuple(keys)


# -- evaluation -------------------------------------------------------------------------------

def lookup(resource: Any, key: str) -> Any:
    """The value at a dotted key (`a.b[0].c`); through a list without an index, the list of
    its items' values. None when absent."""
    value = resource
    for part in _key_parts(key):
        if isinstance(part, int):
            index = part
            value = value[index] if isinstance(value, (list, tuple)) and index < len(value) else None
        elif isinstance(value, (list, tuple)):
            value = [lookup(item, part) for item in value]
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            value = None
        if value is None:
            return None
    return value


@lru_cache(maxsize=256)
def _key_parts(key: str) -> tuple[str | int, ...]:
    """`a.b[0].c` -> ("a", "b", 0, "c"), parsed once per key: tables look up thousands of rows."""
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", key)
    return tuple(int(part[1:-1]) if part.startswith("[") else part for part in parts)


def _scalars(value: Any) -> list:
    if isinstance(value, list):
        return [s for item in value for s in _scalars(item)]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _scalars(item)]
    return [] if value is None else [value]


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _glob(pattern: str, text: str) -> bool:
    return fnmatch.fnmatchcase(text, pattern) if "*" in pattern else text == pattern


def _has(value: Any, pattern: str) -> bool:
    if value is None:
        return False
    if pattern == "*":
        return value not in ("", [], {})
    if isinstance(value, dict):
        return any(_has(k, pattern) for k in value)
    if isinstance(value, list):
        return any(_has(item, pattern) for item in value)
    # The pattern (a word, a phrase, `*` wildcards) must start and end at word boundaries.
    body = ".*".join(re.escape(part) for part in pattern.lower().split("*"))
    return re.search(rf"(?<![a-z0-9]){body}(?![a-z0-9])", _text(value).lower()) is not None


def _instant(text: str) -> str | None:
    """RFC 3339 UTC for a date or date-time (local time when no zone is given), else None."""
    if not re.fullmatch(r"\d{4}-\d\d-\d\d([T ][\d:.]+(Z|[+-]\d\d:?\d\d)?)?", text.strip()):
        return None
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _compare(value: Any, op: str, wanted: str) -> bool:
    """Both sides as numbers if both are, else as instants if both are, else as text."""
    if value is None or isinstance(value, (dict, list)):
        return False
    order = _ORDER[op]
    text = _text(value)
    left, right = _number(text), _number(wanted)
    if left is not None and right is not None:
        return order(left, right)
    left_instant, right_instant = _instant(text), _instant(wanted)
    if left_instant is not None and right_instant is not None:
        return order(left_instant, right_instant)
    return order(text, wanted)


def _matches_one(value: Any, op: str, wanted: str) -> bool:
    if op == ":":
        return _has(value, wanted)
    if isinstance(value, list):
        return any(_matches_one(item, op, wanted) for item in value)
    if op == "=":
        return value is not None and _glob(wanted, _text(value))
    if op == "~":
        return value is not None and re.search(wanted, _text(value)) is not None
    return _compare(value, op, wanted)


def _term_matches(term: Term, resource: dict) -> bool:
    if term.key is None:
        return any(_has(s, v) for s in _scalars(resource) for v in term.values)
    value = lookup(resource, term.key)
    if term.op in ("!=", "!~"):
        positive = "=" if term.op == "!=" else "~"
        return not any(_matches_one(value, positive, v) for v in term.values)
    return any(_matches_one(value, term.op, v) for v in term.values)


def evaluate(expr: Expr | None, resource: dict) -> bool:
    if expr is None:
        return True
    if isinstance(expr, Term):
        try:
            return _term_matches(expr, resource)
        except re.error as exc:
            raise ValidationError(f"--filter: [{expr.values[0]}] is not a regular expression: {exc}.") from None
    if isinstance(expr, Not):
        return not evaluate(expr.operand, resource)
    results = (evaluate(operand, resource) for operand in expr.operands)
    return all(results) if expr.op == "AND" else any(results)


def _sort_value(resource: dict, key: str) -> tuple:
    value = lookup(resource, key)
    if value is None:
        return (0, 0, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (1, value, "")
    return (2, 0, _text(value))


def sort(items: list[T], keys: Sequence[SortKey], resource_of: Callable[[T], dict]) -> list[T]:
    """Stable multi-key sort: missing values first, numbers before text."""
    for key in reversed(keys):
        items = sorted(items, key=lambda item: _sort_value(resource_of(item), key.key), reverse=key.descending)
    return items


def select(items: list[T], expr: Expr | None, keys: Sequence[SortKey], limit: int | None,
           resource_of: Callable[[T], dict]) -> list[T]:
    """gcloud's order: --sort-by, --filter, --limit (sorting the matches only is the same list)."""
    matched = [item for item in items if evaluate(expr, resource_of(item))]
    matched = sort(matched, keys, resource_of) if keys else matched
    return matched[:limit] if limit else matched


# -- what the store answers in SQL ------------------------------------------------------------


def is_label_key(key: str) -> bool:
    """`labels.KEY`: one label, which the store reads from its labels column."""
    return _LABEL_KEY.fullmatch(key) is not None


def in_columns(key: str) -> bool:
    """Whether the store can filter and sort on `key` in SQL."""
    return key in COLUMNS or is_label_key(key)


def listed_only(fields: Iterable[str]) -> bool:
    """Whether these fields are all read from the store's columns (jobId, state, createTime,
    labels), so the stored resources need not be read."""
    return all(field in COLUMNS or field == "labels" or is_label_key(field) for field in fields)


@dataclass(frozen=True)
class Condition:
    """`key OP value` over a key the store keeps in a column (`in_columns`). op: IN or NOT_IN
    (value a tuple), PREFIX, CONTAINS_NOCASE (a superset prefilter), a comparison <, <=, >, >=,
    or PAGE_AFTER (value (createTime, jobId): the jobs after that one in the default order, newest
    first, the REST list's page token)."""

    key: str
    op: str
    value: Any


@dataclass(frozen=True)
class Query:
    conditions: tuple[Condition, ...] = ()
    order: tuple[SortKey, ...] = ()  # column keys; empty: newest first
    limit: int | None = None
    complete: bool = True  # the store's answer needs no filtering or sorting after it


def _conjuncts(expr: Expr | None) -> list[Expr]:
    if expr is None:
        return []
    if isinstance(expr, BoolOp) and expr.op == "AND":
        return [c for operand in expr.operands for c in _conjuncts(operand)]
    return [expr]


def _text_condition(key: str, op: str, values: tuple[str, ...]) -> tuple[Condition | None, bool]:
    """`=`, `!=` and `:` on a text column (jobId, a label): the condition and whether it is exact."""
    stars = [v for v in values if "*" in v]
    if op in ("=", "!=") and not stars:
        return Condition(key, "IN" if op == "=" else "NOT_IN", values), True
    if len(values) != 1 or op not in ("=", ":"):
        return None, False
    stem = values[0][:-1] if values[0].endswith("*") else values[0]
    if "*" in stem or not stem or not stem.isascii():  # SQLite's lower() knows only ASCII
        return None, False
    if op == "=":
        return Condition(key, "PREFIX", stem), True  # `=abc*`
    return Condition(key, "CONTAINS_NOCASE", stem), False  # `:` matches words, in any case


def _condition(term: Expr) -> tuple[Condition | None, bool]:
    """The store condition for a term, and whether it is exact (else a superset prefilter)."""
    if not isinstance(term, Term) or term.key is None or not in_columns(term.key):
        return None, False
    key, values = term.key, term.values
    if key == "state" and term.op in (":", "=", "!=") and not any("*" in v for v in values):
        states = tuple(v.upper() if term.op == ":" else v for v in values)
        exact = term.op != ":" or all(s in STATE_NAMES for s in states)
        return (Condition(key, "NOT_IN" if term.op == "!=" else "IN", states), True) if exact else (None, False)
    if key == "createTime":
        if term.op in ("<", "<=", ">", ">=") and len(values) == 1:
            instant = _instant(values[0])
            return (Condition(key, term.op, instant), True) if instant else (None, False)
        return None, False
    if key == "state":
        return None, False
    return _text_condition(key, term.op, values)


def plan_query(expr: Expr | None, keys: Sequence[SortKey], limit: int | None,
               after: tuple[str, str] | None = None) -> Query:
    """The conditions, order and limit the store can apply; `complete` when nothing is left
    for `select` to do. `after`: only the jobs after (createTime, jobId) in the default order."""
    conditions, complete = [], True
    if after is not None:
        conditions.append(Condition("createTime", "PAGE_AFTER", after))
    for term in _conjuncts(expr):
        condition, exact = _condition(term)
        if condition is not None:
            conditions.append(condition)
        complete = complete and exact
    sortable = all(in_columns(k.key) for k in keys)
    complete = complete and sortable
    return Query(
        conditions=tuple(conditions),
        order=tuple(keys) if sortable else (),
        limit=limit if complete else None,
        complete=complete,
    )
