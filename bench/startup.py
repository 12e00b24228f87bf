"""P10 start-up: the CPU that `manage.py check` spends importing, and the share agenttasks and
the surfaces' dependencies take (what every command, worker start and MCP stdio start pays).

.venv/bin/python bench/startup.py [--runs 5]

Each run is `python -X importtime manage.py check` in a fresh process; a module's share is the
cumulative time of the top-level imports it started (so Django's own, imported first, is not
counted to agenttasks). The baseline beside it is the same command's total import time.
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)")
OURS = ("agenttasks", "mcp_types", "a2a", "drf_spectacular")


def imports(runs: int) -> dict[str, float]:
    """Return the median ms of imports under manage.py check: agenttasks' and its optional
    surfaces' (OURS), and every import's."""
    ours, every = [], []
    for _ in range(runs):
        err = subprocess.run(
            [sys.executable, "-X", "importtime", "manage.py", "check"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        tops = [(m[3], int(m[1])) for m in LINE.finditer(err) if not m[2]]
        ours.append(sum(us for name, us in tops if name.split(".")[0] in OURS) / 1000)
        every.append(sum(us for _, us in tops) / 1000)
    return {"ours_ms": statistics.median(ours), "every_ms": statistics.median(every)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = imports(args.runs)
    print(json.dumps(figures) if args.json else figures)
