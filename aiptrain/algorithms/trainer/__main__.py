"""`python3 -m aiptrain_algorithms FLAGS...`: the entrypoint of every built-in algorithm's image
(which one, its image says in AIPTRAIN_ALGORITHM)."""

from __future__ import annotations

import sys

from .task import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
