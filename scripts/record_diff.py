#!/usr/bin/env python3
"""Compares two run folders file by file: byte for byte, but for the wall-clock columns.

    python3 scripts/record_diff.py RUN_A RUN_B

Every file of either folder is compared (checkpoints included); the CSV columns that time a run
(`seconds`) are left out of the comparison, and so are `lock` and `debug.log`. Exit 0 when the
records agree, 1 with the first differing line of each file that differs.
"""

import csv
import io
import sys
from pathlib import Path

WALL_CLOCK = {"seconds"}
SKIPPED = {"lock", "debug.log"}


def files(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and p.name not in SKIPPED
    }


def without_wall_clock(text: str) -> list[list[str]]:
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return rows
    keep = [i for i, name in enumerate(rows[0]) if name not in WALL_CLOCK]
    return [[row[i] for i in keep if i < len(row)] for row in rows]


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = Path(sys.argv[1]), Path(sys.argv[2])
    for root in (a, b):
        if not root.is_dir():
            print(f"{root}: not a run folder", file=sys.stderr)
            return 2
    fa, fb = files(a), files(b)
    differ = 0
    for name in sorted(fa ^ fb):
        print(f"{name}: only in {a if name in fa else b}")
        differ += 1
    for name in sorted(fa & fb):
        da, db = (a / name).read_bytes(), (b / name).read_bytes()
        if da == db:
            continue
        if name.endswith(".csv"):
            ra = without_wall_clock(da.decode())
            rb = without_wall_clock(db.decode())
            if ra == rb:
                continue
            first = next(
                (i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), min(len(ra), len(rb))
            )
            print(f"{name}: differs from row {first} ({len(ra)} and {len(rb)} rows)")
            if first < min(len(ra), len(rb)):
                print(f"  {','.join(ra[first])}\n  {','.join(rb[first])}")
        else:
            print(f"{name}: differs ({len(da)} and {len(db)} bytes)")
        differ += 1
    same = len(fa & fb) - differ + len(fa ^ fb)
    print(f"{same} files agree, {differ} differ (wall-clock columns left out)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
