#!/usr/bin/env python3
"""The heavy versions of the reliability tests: ``python scripts/stress.py [--kills N]
[--fuzz-cases N] [--seed S]``.

* SIGKILL loops through the store API and through the converters (``--kills`` each), and
  during compaction (``--kills / 5``);
* readers verifying every byte beside two appenders (``--race-seconds``);
* the mutation fuzzer (``scripts/fuzz_store.py``) for ``--fuzz-cases`` cases.

Prints what ran and the counts docs/RELIABILITY.md reports; exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import reliability as rel  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--fuzz-cases", type=int, default=100_000)
    parser.add_argument("--race-seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for converter in (False, True):
            t = time.perf_counter()
            stats = rel.kill_loop(f"{tmp}/{'conv' if converter else 'store'}", args.kills,
                                  args.seed + converter, converter)
            what = "converters" if converter else "store API"
            print(f"SIGKILL through the {what}: {stats} in {time.perf_counter() - t:.0f} s")
        t = time.perf_counter()
        stats = rel.compact_kill_loop(f"{tmp}/compact", max(1, args.kills // 5), args.seed)
        print(f"SIGKILL during compaction: {stats} in {time.perf_counter() - t:.0f} s")
        counts = rel.race(f"{tmp}/race", args.race_seconds, readers=6, appenders=2)
        print(f"race for {args.race_seconds:.0f} s, 6 readers + 2 appenders: "
              f"{ {k: v for k, v in counts.items() if k != 'problems'} }, "
              f"mismatches {len(counts['problems'])}")
        if counts["problems"]:
            print(counts["problems"][:10], file=sys.stderr)
            sys.exit(1)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "fuzz_store.py"), "--cases",
                        str(args.fuzz_cases), "--seed", str(args.seed)],
                       capture_output=True, text=True)
    print(f"fuzz: {r.stdout.strip()} in {time.perf_counter() - t:.0f} s")
    if r.returncode:
        print(r.stderr[-4000:], file=sys.stderr)
        sys.exit(1)
    json.loads(r.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
