#!/usr/bin/env python3
"""The long chaos run: producers and consumers SIGKILLed at random.

    .venv/bin/python scripts/chaos.py                       # 40,000 messages, 4+4 processes
    .venv/bin/python scripts/chaos.py --messages 100000 --kill-every 0.1

Prints the counts (published, deleted, lost, duplicates and why, kills) and
exits 1 if a message whose publish returned was lost, deleted twice, or
delivered twice without a killed consumer or a lost lease to explain it.
The test suite runs a short form (tests/system/stress/test_chaos.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.system.stress.harness import run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--kill-every", type=float, default=0.2, help="seconds between kills")
    parser.add_argument("--pause", type=float, default=0.0005, help="seconds between a producer's publishes")
    parser.add_argument("--dir", default=None, help="where the spool goes (default: a temporary directory)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        logs = os.path.join(scratch, "logs")
        os.mkdir(logs)
        report = run(
            os.path.join(scratch, "q"),
            logs,
            messages=args.messages,
            producers=args.producers,
            consumers=args.consumers,
            kill_every=args.kill_every,
            pause=args.pause,
            seed=args.seed,
            deadline=3600,
        )
    print(report)
    print("OK" if report.ok() else "FAILED")
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
