#!/usr/bin/env python3
"""Where a CubeCL backend's time goes: CubeCL's kernel-timing log summed per kernel.

CubeCL times every kernel it launches when its profiling logger is on (a `cubecl.toml` in the
working directory or a parent, see `scripts/gpu_check.sh --kernel-profile`):

    [profiling.logger]
    level = "basic"          # or "full": also the launch's cube count
    file = "/tmp/kernels.log"

and writes one line per launch, `| 1.234ms    | name` (at "full": `name: id CubeCount
Static(x, y, z)`), between summary tables it prints at each synchronisation. This script reads
those per-launch lines (the summaries are skipped: they repeat them) and prints, per kernel
name, the launches, total time, share of all kernel time, mean and largest launch, and at
"full" the fewest cubes of its launches (a kernel whose launches spend milliseconds on a few
cubes runs one thread per output). Kernel time is GPU time as CubeCL measures it (with the
logger on, launches are timed one by one); the host time between kernels is not in it.

usage: cubecl_profile.py LOG [--top N] [--csv FILE] [--steps N [--drop-first K] | --last N]
  --steps N: also print each kernel's time per step, the log covering N steps.
  --drop-first K: leave out the first K of those steps (a warm-up, whose first launches of
      each kernel may include its compilation): the first K/N of the launches.
  --last N: only the log's last N launches: the last step's, where the run ends with that step
      and N is its launches (`bench search --reps 1` prints them; setup launches before the
      warm-up make a fraction of the log miss the step).
"""

import argparse
import csv
import re
import sys

UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ns|µs|us|ms|s)$")
LAUNCH = re.compile(r"^\| (\S+)\s*\| (.*)$")
CUBES = re.compile(r"\s*CubeCount (?:Static\s*)?\((\d+), (\d+), (\d+)\)\s*$")


def seconds(text):
    """A Rust `Duration` in its Debug form (`1.5ms`, `850ns`, `2.1s`), in seconds; None if not one."""
    m = DURATION.match(text)
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def entries(lines):
    """Each launch's text (its lines joined) and seconds, in order.

    A launch starts on a line `| <duration> | ...` with no further cell; at "full" its kernel
    id spans the lines after it, up to `} CubeCount (x, y, z)`. A line of a summary table
    (four cells, or a rule) ends the launch before it, and the table's lines are skipped.
    """
    current = None
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("|"):
            if current is not None:
                yield current
                current = None
            m = LAUNCH.match(line)
            if m and " | " not in m.group(2) and not line.rstrip().endswith("|"):
                t = seconds(m.group(1))
                if t is not None:  # else "not measured", or a table's header
                    current = (m.group(2), t)
        elif current is not None:
            current = (current[0] + "\n" + line, current[1])
    if current is not None:
        yield current


def parse(lines):
    """Per-launch (name, seconds, cubes or None) from the log's lines."""
    for text, t in entries(lines):
        cubes = None
        m = CUBES.search(text)
        if m:
            cubes = int(m.group(1)) * int(m.group(2)) * int(m.group(3))
        # At "full" the name is followed by ": " and the kernel's id: keep the name alone.
        name = text.split("\n", 1)[0].split(": ", 1)[0]
        yield name.strip(), t, cubes


def summarise(launches):
    table = {}
    for name, t, cubes in launches:
        row = table.setdefault(name, {"launches": 0, "total": 0.0, "max": 0.0, "cubes": None})
        row["launches"] += 1
        row["total"] += t
        row["max"] = max(row["max"], t)
        if cubes is not None:
            row["cubes"] = cubes if row["cubes"] is None else min(row["cubes"], cubes)
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--csv")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--drop-first", type=int, default=0)
    ap.add_argument("--last", type=int)
    args = ap.parse_args()
    if args.top < 1:
        ap.error("--top must be at least 1")
    if args.steps is not None and args.steps < 1:
        ap.error("--steps must be at least 1")
    if args.drop_first and (args.steps is None or not 0 < args.drop_first < args.steps):
        ap.error("--drop-first K needs --steps N with 0 < K < N")
    if args.last is not None and (args.last < 1 or args.steps is not None):
        ap.error("--last N needs N of at least 1, and no --steps")
    try:
        with open(args.log, encoding="utf-8", errors="replace") as f:
            launches = list(parse(f))
    except OSError as e:
        sys.exit(f"cubecl_profile.py: {args.log}: {e.strerror}")
    if args.last:
        if len(launches) < args.last:
            sys.exit(f"cubecl_profile.py: {args.log}: {len(launches)} launches, fewer than --last {args.last}")
        launches = launches[-args.last:]
    if args.drop_first:
        launches = launches[len(launches) * args.drop_first // args.steps:]
        args.steps -= args.drop_first
    table = summarise(launches)
    if not table:
        sys.exit(
            f"cubecl_profile.py: {args.log}: no kernel timings (is CubeCL's profiling logger on, "
            'level "basic" or higher?)'
        )
    rows = sorted(table.items(), key=lambda kv: -kv[1]["total"])
    total = sum(r["total"] for _, r in rows)
    launches = sum(r["launches"] for _, r in rows)
    print(f"{launches} launches of {len(rows)} kernels, {total * 1e3:.1f} ms of kernel time")
    if args.steps:
        plural = "s" if args.steps > 1 else ""
        print(f"per step (over {args.steps} step{plural}): {total * 1e3 / args.steps:.1f} ms, "
              f"{launches / args.steps:.0f} launches")
    per_step = f" {'ms/step':>9}" if args.steps else ""
    print(f"{'share':>6} {'total ms':>10}{per_step} {'launches':>8} {'mean µs':>9} {'max µs':>9} "
          f"{'cubes':>7}  kernel")
    for name, r in rows[: args.top]:
        step = f" {r['total'] * 1e3 / args.steps:9.2f}" if args.steps else ""
        cubes = "" if r["cubes"] is None else str(r["cubes"])
        print(f"{100 * r['total'] / total:5.1f}% {r['total'] * 1e3:10.2f}{step} {r['launches']:8d} "
              f"{r['total'] / r['launches'] * 1e6:9.1f} {r['max'] * 1e6:9.1f} {cubes:>7}  {name}")
    if len(rows) > args.top:
        rest = sum(r["total"] for _, r in rows[args.top:])
        print(f"{100 * rest / total:5.1f}% {rest * 1e3:10.2f}  ({len(rows) - args.top} more kernels)")
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["kernel", "launches", "total_s", "share", "mean_s", "max_s", "min_cubes"])
            for name, r in rows:
                w.writerow([name, r["launches"], f"{r['total']:.9f}", f"{r['total'] / total:.6f}",
                            f"{r['total'] / r['launches']:.9f}", f"{r['max']:.9f}",
                            "" if r["cubes"] is None else r["cubes"]])


if __name__ == "__main__":
    main()
