#!/usr/bin/env python3
"""mypy over the package against a baseline that only shrinks (docs/development.md).

The whole package type-checks with no error (issue 20), so the baseline is empty: any error
fails. Errors are counted per file; a file with more errors than its baseline fails.
`--update` writes the baseline from the current counts (only ever to lower it).
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "scripts" / "mypy-baseline.json"
# The runtime core type-checks with no error at all (issue 17): no baseline for these.
CORE = ("aiptrain/runner/", "aiptrain/lifecycle.py", "aiptrain/admission.py", "aiptrain/planning.py",
        "aiptrain/store.py", "aiptrain/jobtable.py", "aiptrain/dialects.py", "aiptrain/jobs.py")


def counts() -> dict[str, int]:
    result = subprocess.run([sys.executable, "-m", "mypy", "aiptrain"], cwd=ROOT, capture_output=True, text=True)
    found = collections.Counter(line.split(":", 1)[0] for line in result.stdout.splitlines() if ": error:" in line)
    return dict(sorted(found.items()))


def main() -> int:
    now = counts()
    if "--update" in sys.argv:
        BASELINE.write_text(json.dumps(now, indent=1) + "\n")
        print(f"mypy baseline: {sum(now.values())} errors in {len(now)} files, written to {BASELINE.name}")
        return 0
    baseline = {path: count for path, count in json.loads(BASELINE.read_text()).items()
                if not path.startswith(CORE)}
    grew = {path: (baseline.get(path, 0), count) for path, count in now.items() if count > baseline.get(path, 0)}
    for path, (before, after) in grew.items():
        print(f"{path}: {after} mypy errors, the baseline allows {before} (`.venv/bin/mypy {path}` lists them)")
    total, allowed = sum(now.values()), sum(baseline.values())
    if grew:
        return 1
    hint = " (fewer: run scripts/check-types.py --update to lower the baseline)" if total < allowed else ""
    print(f"mypy: {total} errors, baseline {allowed}{hint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
