#!/usr/bin/env python3
"""Compares two run folders file by file: byte for byte, but for the wall-clock columns.

    python3 scripts/record_diff.py RUN_A RUN_B

Every file of either folder is compared (checkpoints included); the CSV columns that time a run
(`seconds`) are left out of the comparison, and so are `lock` and `debug.log`. A checkpoint file
(`.bpk`, Burn's record: a CBOR header naming each tensor, then the tensors' bytes) is compared
tensor by tensor, by name, shape, type and bytes, and scalar by scalar: Burn draws a parameter's
id afresh in every process, and the file carries it (and the optimizer's state is named by it),
so two runs of one computation differ there and nowhere else. `checksums.json` (the files'
SHA-256, over those ids) is compared by the files it lists. Exit 0 when the records agree, 1
with the first differing line of each file that differs.
"""

import csv
import io
import json
import struct
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


def cbor(b: bytes, i: int):
    """The CBOR item at `i` (the subset Burn's header uses) and the index after it."""
    head, i = b[i], i + 1
    major, info = head >> 5, head & 31
    if info < 24:
        val = info
    else:
        width = {24: 1, 25: 2, 26: 4, 27: 8}[info]
        val = int.from_bytes(b[i : i + width], "big")
        i += width
    if major == 0 or major == 7:
        return val, i
    if major == 1:
        return -1 - val, i
    if major in (2, 3):
        raw = b[i : i + val]
        return (raw if major == 2 else raw.decode()), i + val
    if major == 4:
        items = []
        for _ in range(val):
            x, i = cbor(b, i)
            items.append(x)
        return items, i
    if major == 5:
        out = {}
        for _ in range(val):
            k, i = cbor(b, i)
            out[k], i = cbor(b, i)
        return out, i
    raise ValueError(f"CBOR major type {major}")


def bpk_content(data: bytes):
    """A `.bpk` record's tensors and scalars by name, each name's leading parameter id
    replaced by the field the header's metadata names for it, parameter ids left out."""
    if data[:4] != b"NRUB":
        raise ValueError("not a Burn record")
    length = struct.unpack("<I", data[6:10])[0]
    header, _ = cbor(data, 10)
    body = data[(10 + length + 255) // 256 * 256 :]  # on a 256-byte boundary
    names = header.get("metadata", {})

    def name(key: str) -> str:
        first, _, rest = key.partition(".")
        return f"{names.get(first, first)}.{rest}" if rest else names.get(first, first)

    tensors = {
        name(k): (t["dtype"], t["shape"], body[t["data_offsets"][0] : t["data_offsets"][1]])
        for k, t in header["tensors"].items()
    }
    scalars = {name(k): v for k, v in header.get("scalars", {}).items()}
    return tensors, scalars


def same_checkpoint(name: str, da: bytes, db: bytes) -> bool:
    """Whether two checkpoint files hold the same values (see the module's doc)."""
    if name.endswith(".bpk"):
        try:
            return bpk_content(da) == bpk_content(db)
        except (ValueError, KeyError, IndexError, struct.error):
            return False
    if Path(name).name == "checksums.json":
        return json.loads(da).keys() == json.loads(db).keys()
    return False


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
        if da == db or same_checkpoint(name, da, db):
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
    print(f"{same} files agree, {differ} differ (wall-clock columns and parameter ids left out)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
