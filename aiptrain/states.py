"""A job's states, as the service names them, and the sets the runtime, the store's table and
`--filter` go by: one small module without pydantic, so the store and the filter parser need
not load the model to know them."""

from __future__ import annotations

import enum


class State(str, enum.Enum):
    STATE_UNSPECIFIED = "STATE_UNSPECIFIED"
    QUEUED = "QUEUED"
    PREPARING = "PREPARING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})
ACTIVE_STATES = frozenset({State.QUEUED, State.PREPARING, State.RUNNING, State.CANCELLING})  # a driver's
# Every state a job may be in, by name (what `--filter state=...` accepts).
STATE_NAMES = frozenset(state.value for state in State)
# The states that are not terminal, by name: what the store's index of unfinished jobs holds.
NOT_TERMINAL_NAMES = tuple(state.value for state in State if state not in TERMINAL_STATES)
