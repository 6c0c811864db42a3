"""The controller's chores as periodic events, as SkyPilot's skylet runs its `EVENTS`.

Each event has an interval and runs when due; an event whose interval is 0 runs at every wake of
the controller's loop. A chore that fails is logged and tries again at its next due time: one
chore's failure (a store briefly locked, an engine away) never stops the loop or the other chores.
The time comes from the controller's clock (`time.monotonic`; a fake one in tests), passed in as
`now`, so an event reads no clock of its own.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

log = logging.getLogger("aiptrain.controller")


class PeriodicEvent:
    """`action(now)` every `interval` seconds, first at the first look; at once, too, whenever
    `asked()` says so (a command's wake for adoption). `retire()` runs it never again."""

    def __init__(self, name: str, interval: float, action: Callable[[float], None],
                 asked: Callable[[], bool] = lambda: False):
        self.name = name
        self.interval = interval
        self.action = action
        self.asked = asked
        self.next_due = -math.inf
        self.last_failure = ""  # the last failure's message: a failure that repeats is one line

    def due(self, now: float) -> bool:
        return now >= self.next_due or (self.next_due < math.inf and self.asked())

    def run(self, now: float) -> None:
        if not self.due(now):
            return
        self.next_due = now + self.interval
        try:
            self.action(now)
        except Exception as exc:  # noqa: BLE001 - the chore's failure is the chore's: it tries again when due
            message = f"{type(exc).__name__}: {exc}"
            if message == self.last_failure:
                log.warning("The controller's %s failed again: %s", self.name, message)
            else:
                log.exception("The controller's %s failed (it tries again when due)", self.name)
            self.last_failure = message
        else:
            self.last_failure = ""

    def retire(self) -> None:
        self.next_due = math.inf

    def seconds_to_next(self, now: float) -> float:
        """How long the loop may sleep for this event: forever for one that runs at every wake
        (some other wake comes first) or that is retired."""
        if self.interval <= 0 or self.next_due == math.inf:
            return math.inf
        return max(0.0, self.next_due - now)


def run_all(events: list[PeriodicEvent], now: float) -> None:
    for event in events:
        event.run(now)


def seconds_to_next(events: list[PeriodicEvent], now: float) -> float:
    return min((event.seconds_to_next(now) for event in events), default=math.inf)
