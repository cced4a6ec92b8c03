"""Deep fuzzing runs, beyond what CI affords (results recorded in BENCHMARKS.md).

    python scripts/fuzz.py [--schemathesis N] [--properties N]

1. schemathesis against a real `tune serve` (tests/test_fuzz_api.py with N examples per
   operation and generation mode): prints how many requests were sent, by status class;
   any 5xx fails the run.
2. the hypothesis properties of tests/test_properties.py with N examples each: prints
   hypothesis' statistics (cases run, outcomes); any falsified property fails the run.
Each part is skipped with N = 0.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pytest(test: str, env: dict, *flags: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider", *flags], cwd=ROOT,
                          env={**os.environ, **env}, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemathesis", type=int, default=300, metavar="N", help="examples per operation and mode")
    ap.add_argument("--properties", type=int, default=300, metavar="N", help="examples per property")
    args = ap.parse_args()
    failed = False
    if args.schemathesis:
        rc, out = pytest("tests/test_fuzz_api.py", {"CACHETILE_FUZZ_EXAMPLES": str(args.schemathesis)}, "-s")
        summary = re.findall(r"fuzzing: .*", out)
        print(f"schemathesis, {args.schemathesis} examples per operation and mode: "
              f"{summary[-1] if summary else 'no summary'}; pytest exit {rc}")
        failed |= rc != 0
        if rc:
            print(out[-4000:])
    if args.properties:
        rc, out = pytest("tests/test_properties.py", {"CACHETILE_PROPERTY_EXAMPLES": str(args.properties)},
                         "--hypothesis-show-statistics")
        stats = [line for line in out.splitlines() if "::" in line or re.match(r"\s+(- |\* )", line)]
        print(f"hypothesis properties, {args.properties} examples each; pytest exit {rc}")
        print("\n".join(stats))
        failed |= rc != 0
        if rc:
            print(out[-6000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
