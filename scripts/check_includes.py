#!/usr/bin/env python3
"""The include graph's rule: a file includes only from its own folder, from a folder
below it in its area's stack, or from an area its own area builds on. docs/ARCHITECTURE.md
draws the same picture.

    scripts/check_includes.py [ROOT]     exit 1 and one line per offending include

Areas (what each may include besides itself):
    core     -                 what every layer shares
    proto    core              the wire contract and its conversions
    kernels  core              engines; the server never sees past kernels/engine.h
    client   core proto        the C++ client and the CLI
    server   core proto kernels/engine.h kernels/engine_factory.h kernels/optimizer.h
    bench, tests, anything not listed: everything

Inside an area, folders are ranked; a file may include a folder of the same or a lower
rank. A folder not listed takes its parent's rank (kernels/cuda/ops/sm90 is ops's)."""
from __future__ import annotations

import pathlib
import re
import sys

AREAS = {
    "core": ["core"],
    "proto": ["core", "proto"],
    "kernels": ["core", "kernels"],
    "client": ["core", "proto", "client"],
    "server": ["core", "proto", "server", "kernels/engine.h", "kernels/engine_factory.h",
               "kernels/optimizer.h"],
}

# Lowest first. The engine API (kernels/*.h) is below every engine.
RANKS = {
    "kernels": 0,
    "kernels/cpu": 1,
    "kernels/cuda/base": 1,
    "kernels/cuda/ops": 2,
    "kernels/cuda/plans": 3,
    "kernels/cuda/engine": 4,
    "kernels/cuda/sharded": 5,
    "kernels/cuda": 6,  # plugin.cc: the entry point over both engines
    "server/base": 0,
    "server/validate": 1,
    "server/observe": 1,
    "server/storage": 1,
    "server/state": 2,
    "server/handlers": 3,
    "server/rpc": 4,
    "server": 5,  # the process: flce_server, main
    "client/cpp": 0,
    "client/cli": 1,
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = ("*.h", "*.cc", "*.cu", "*.cuh")


def rank(folder: str) -> int | None:
    while folder:
        if folder in RANKS:
            return RANKS[folder]
        folder = folder.rpartition("/")[0]
    return None


def area(path: str) -> str:
    return path.split("/", 1)[0]


def allowed(src: str, target: str) -> str | None:
    """None when src may include target, else why not."""
    src_area, target_area = area(src), area(target)
    if src_area not in AREAS:
        return None
    grants = AREAS[src_area]
    if not any(target == g or target.startswith(g + "/") for g in grants):
        return f"{src_area}/ may include only {', '.join(grants)}"
    if src_area != target_area:
        return None
    src_folder = str(pathlib.PurePosixPath(src).parent)
    target_folder = str(pathlib.PurePosixPath(target).parent)
    if src_folder == target_folder:
        return None
    src_rank, target_rank = rank(src_folder), rank(target_folder)
    if src_rank is None or target_rank is None:
        return None
    if target_rank > src_rank:
        return f"{target_folder}/ is above {src_folder}/"
    return None


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else __file__).resolve()
    if root.is_file():
        root = root.parent.parent
    files = sorted(p for pattern in SOURCES for p in root.rglob(pattern)
                   if not any(part.startswith(("build", ".")) for part in p.relative_to(root).parts))
    known = {p.relative_to(root).as_posix() for p in files}
    bad = 0
    for path in files:
        src = path.relative_to(root).as_posix()
        for target in INCLUDE.findall(path.read_text(errors="replace")):
            if target not in known:  # generated (flce/v1/flce.pb.h), system, or third-party
                continue
            why = allowed(src, target)
            if why:
                print(f"{src}: includes {target}: {why}")
                bad += 1
    print(f"check_includes: {len(files)} files, {bad} include(s) across the layers", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
