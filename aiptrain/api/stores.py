"""The job store each request thread of `aiptrain serve` keeps open: the standard library's
server gives every kept-alive connection a thread, and opening the store (connect, check the
schema) then closing it again took more of a `jobs.get` than answering it. SQLite's connection
in autocommit mode, like PostgreSQL's, reads what other processes committed at every statement,
so a store kept open sees every change."""

from __future__ import annotations

import threading

from aiptrain.settings import Settings
from aiptrain.store import JobStore


class ThreadStores:
    def __init__(self, settings: Settings):
        self._settings = settings
        self._local = threading.local()

    def get(self) -> JobStore:
        store = getattr(self._local, "store", None)
        if store is None:
            self._settings.ensure_dirs()
            store = self._local.store = JobStore.of(self._settings)
        return store
