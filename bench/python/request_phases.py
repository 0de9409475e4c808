#!/usr/bin/python3
"""Medians of the server's request-log phases per log file and call kind, so that where a
Compute's time went (docs/OPERATIONS.md: header_ms, setup_ms, input_ms with the CUDA
engine's input_wait_ms, finish_ms, land_ms, duration_ms) reads at a glance next to a
bench's wall times. A call kind is its head, tokens, strategy and transport (the log does not
tell a forward-only call from a full one: a bench that runs both on one head mixes them).

    python3 bench/python/request_phases.py server-*.log [--skip 1]
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import defaultdict

PHASES = ("header_ms", "setup_ms", "input_ms", "input_wait_ms", "finish_ms", "land_ms",
          "duration_ms")
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def calls(lines):
    """The Compute request lines' fields, in log order."""
    for line in lines:
        if "rpc=Compute " not in line or " request " not in line:
            continue
        yield dict(FIELD.findall(line.split(" request ", 1)[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("logs", nargs="+")
    p.add_argument("--skip", type=int, default=1,
                   help="calls of each kind left out at the start of each log (warm-up)")
    args = p.parse_args()
    for path in args.logs:
        with open(path, errors="replace") as f:
            kinds = defaultdict(list)
            for fields in calls(f):
                if fields.get("code") != "OK":
                    continue
                kind = tuple(fields.get(k, "-") for k in ("head", "tokens", "strategy",
                                                           "transport"))
                kinds[kind].append(fields)
        for kind, rows in kinds.items():
            rows = rows[args.skip:]
            if not rows:
                continue
            medians = []
            for phase in PHASES:
                values = [float(r[phase]) for r in rows if phase in r]
                if values:
                    medians.append(f"{phase[:-3]} {statistics.median(values):.1f}")
            print(f"{path}: {' '.join(kind)} ({len(rows)} calls): " + ", ".join(medians))
    return 0


if __name__ == "__main__":
    sys.exit(main())
