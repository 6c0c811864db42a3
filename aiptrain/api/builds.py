"""Images that a create needs, built in the background: runtime images, and the built-in
algorithms' (built on runtime 2.11's). `jobs submit` builds a missing image before it submits
(minutes, once); a REST create must not hold its request that long (googleapiclient gives up
after 60 s and retries into a 409). The create is answered 503 UNAVAILABLE, with nothing
created, while the image builds here; the client retries."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from aiptrain.runtimes import image_is_current

log = logging.getLogger("aiptrain.api")


class RuntimeBuilds:
    """One background build per image at a time. `current(runtime)` (the image is there and
    from this aiptrain's recipe) and `build(runtime)` are aiptrain.runtimes' by default; `what`
    names the kind of image in messages."""

    def __init__(self, build: Callable, current: Callable | None = None, what: str = "runtime image"):
        if current is None:
            current = image_is_current
        self._build, self._current, self._what = build, current, what
        self._lock = threading.Lock()
        self._running: dict[str, threading.Thread] = {}
        self._failed: dict[str, str] = {}

    def ready(self, runtime) -> str | None:
        """None when the runtime's image is there; else why not (a build is under way, started
        now if none was, or the last one failed: said once, and the next call tries again)."""
        image = runtime.image
        if getattr(runtime, "mapped_image", None) or self._current(runtime):
            return None
        with self._lock:
            if image in self._failed:
                return f"Building {self._what} [{image}] failed: {self._failed.pop(image)}; retry to build it again."
            if image not in self._running:
                thread = threading.Thread(target=self._run, args=(runtime,), daemon=True, name=f"build {image}")
                self._running[image] = thread
                thread.start()
        return (f"{self._what.capitalize()} [{image}] is not built yet: aiptrain is building it now (minutes, once); retry the "
                "create when it is done.")

    def _run(self, runtime) -> None:
        image = runtime.image
        try:
            self._build(runtime)
            log.warning("built %s %s for a create", self._what, image)
        except Exception as exc:  # kept for the next create to tell; the log has the detail
            log.exception("building %s %s failed", self._what, image)
            with self._lock:
                self._failed[image] = str(exc) or type(exc).__name__
        finally:
            with self._lock:
                self._running.pop(image, None)
