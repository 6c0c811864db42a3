"""Both job façades, this installation's `Client` and client mode's `ApiClient`, offer every verb
of `JobService` (aiptrain.service) with its parameters: the same names, kinds and defaults, in
the same order; one may add parameters of its own only after them, with defaults. (mypy checks
their types where `open_client` returns either.)"""

import inspect

import pytest

from aiptrain.client import Client
from aiptrain.remote import ApiClient
from aiptrain.service import JobService

VERBS = sorted(name for name, member in vars(JobService).items()
               if (callable(member) or isinstance(member, property))
               and (not name.startswith("_") or name in ("__enter__", "__exit__")))


def _parameters(function) -> list[inspect.Parameter]:
    return list(inspect.signature(function).parameters.values())


def test_the_protocol_names_the_verbs_the_cli_uses():
    assert {"submit", "get", "list", "cancel", "wait", "log_blocks", "update_labels"} <= set(VERBS)
    assert len(VERBS) >= 20


@pytest.mark.parametrize("facade", [Client, ApiClient], ids=["Client", "ApiClient"])
@pytest.mark.parametrize("verb", VERBS)
def test_each_facade_takes_each_verbs_parameters(facade, verb):
    wanted, offered = getattr(JobService, verb), getattr(facade, verb, None)
    assert offered is not None, f"{facade.__name__} lacks {verb}"
    if isinstance(wanted, property):
        assert isinstance(offered, property), f"{facade.__name__}.{verb} is not a property"
        return
    expected, actual = _parameters(wanted), _parameters(offered)
    shared = [(p.name, p.kind, p.default) for p in actual[: len(expected)]]
    assert shared == [(p.name, p.kind, p.default) for p in expected], f"{facade.__name__}.{verb}"
    extra = actual[len(expected):]
    assert all(p.default is not inspect.Parameter.empty for p in extra), f"{facade.__name__}.{verb}: {extra}"
