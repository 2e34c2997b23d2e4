#!/usr/bin/env bash
# Times one search step (architecture step + weight step) of the same supernet in qdarts
# (`qdarts bench search`) and in PyTorch (`scripts/torch_reference.py bench`), interleaved on
# this machine (qdarts, PyTorch, qdarts, PyTorch, ... for --rounds rounds, the same threads,
# warm-up steps excluded), and prints per case the median of the per-round ratios with their
# min..max, after a line naming the machine (CPU, cores, L3) and both versions. With --ops,
# times each candidate op alone instead (`qdarts bench ops` against `scripts/torch_reference.py
# bench-ops`, forward+backward on a batch x C x 32 x 32 input, float and tensorrt fake quant;
# one run each, not interleaved).
#
# usage: scripts/compare_torch.sh [--python PY] [--shape darts|default] [--rounds R]
#                                 [--layers L] [--init-channels C] [--batch B]
#                                 [--reps N] [--warmup N] [--ops] [CASE ...]
#   CASE: ORDER/QUANT with ORDER first|second and QUANT float|tensorrt
#         (default: first/float first/tensorrt second/float second/tensorrt)
#   PY:   a Python with torch, numpy and safetensors (default: python3)
#   The qdarts binary is $QDARTS, else target/release/qdarts (built with cargo if missing).
# Shapes: darts (the default): DARTS' search shape, 8 cells, C=16, batch 64, 4 nodes, 3x32x32;
#   default: experiments/default.toml's, 4 cells, C=4, batch 32, 3 nodes, 1x28x28. Random data.
# Memory: qdarts reports its peak heap, PyTorch its process's peak RSS.
set -euo pipefail

cd "$(dirname "$0")/.."
python=python3 shape=darts rounds=3 layers="" channels="" batch="" reps=3 warmup=1 ops=0 cases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --shape) shape="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --init-channels) channels="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --ops) ops=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    */*) cases+=("$1"); shift ;;
    *) echo "compare_torch.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$shape" in
  darts) nodes=4 c_in=3 size=32; : "${layers:=8}" "${channels:=16}" "${batch:=64}" ;;
  default) nodes=3 c_in=1 size=28; : "${layers:=4}" "${channels:=4}" "${batch:=32}" ;;
  *) echo "compare_torch.sh: --shape is darts or default, not '$shape'" >&2; exit 2 ;;
esac
case "$rounds" in
  ''|*[!0-9]*|0) echo "compare_torch.sh: --rounds needs a positive integer" >&2; exit 2 ;;
esac
[ ${#cases[@]} -gt 0 ] || cases=(first/float first/tensorrt second/float second/tensorrt)
for c in "${cases[@]}"; do
  case "$c" in
    first/float|first/tensorrt|second/float|second/tensorrt) ;;
    *) echo "compare_torch.sh: case '$c' is not ORDER/QUANT (first|second / float|tensorrt)" >&2; exit 2 ;;
  esac
done
if ! "$python" -c "import torch, numpy, safetensors" 2>/dev/null; then
  echo "compare_torch.sh: $python lacks torch, numpy or safetensors (pip install torch numpy safetensors)" >&2
  exit 2
fi
qdarts="${QDARTS:-target/release/qdarts}"
if [ ! -x "$qdarts" ]; then
  cargo build --release --quiet
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
threads="$(nproc)"
if [ "$ops" = 1 ]; then
  echo "candidate ops alone, forward+backward, ${batch}x${channels}x32x32; median of ${reps} after 1 warm-up; ${threads} threads; $(date -u +%FT%TZ)"
  "$qdarts" bench ops --batch "$batch" --channels "$channels" --size 32 --reps "$reps" --csv "$tmp/q.csv" > "$tmp/q.txt"
  "$python" scripts/torch_reference.py bench-ops --batch "$batch" --channels "$channels" --size 32 \
    --reps "$reps" --threads "$threads" > "$tmp/t.jsonl"
  "$python" - "$tmp/q.csv" "$tmp/t.jsonl" <<'EOF'
import csv, json, sys
q = {(r["op"], int(r["stride"])): r for r in csv.DictReader(open(sys.argv[1]))}
t = {(r["op"], r["stride"]): r for r in map(json.loads, open(sys.argv[2]))}
print(f"{'op':<14} {'stride':>6} {'qdarts ms':>10} {'PyTorch ms':>11} {'ratio':>7} {'qdarts fq ms':>13} {'PyTorch fq ms':>14} {'ratio':>7}")
for key, r in q.items():
    if key not in t:
        continue
    qf, qq = 1e3 * float(r["float_median_s"]), 1e3 * float(r["quant_median_s"])
    tf, tq = t[key]["float_ms"], t[key]["quant_ms"]
    print(f"{key[0]:<14} {key[1]:>6} {qf:10.2f} {tf:11.2f} {qf / tf:6.2f}x {qq:13.2f} {tq:14.2f} {qq / tq:6.2f}x")
EOF
  echo "(ratio: qdarts over PyTorch; below 1 means qdarts is faster; fq: tensorrt fake quant)"
  exit 0
fi
machine="$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, L3 $(lscpu 2>/dev/null | sed -n 's/^L3 cache: *//p' | head -1)"
versions="$("$qdarts" --version), PyTorch $("$python" -c 'import torch; print(torch.__version__)')"
echo "search step, ${layers} cells, C=${channels}, batch ${batch}, ${nodes} nodes, ${c_in}x${size}x${size}; median of ${reps} steps after ${warmup} warm-up; ${threads} threads"
echo "${machine}; ${versions}; $(date -u +%FT%TZ)"
echo "${rounds} rounds, qdarts and PyTorch interleaved; per case the median of the per-round ratios and their min..max"
printf '%-16s %10s %10s %22s %11s %11s %8s\n' case "qdarts s" "PyTorch s" "ratio (min..max)" "qdarts MiB" "torch MiB" ratio
for c in "${cases[@]}"; do
  order="${c%/*}" quant="${c#*/}"
  : > "$tmp/rounds.jsonl"
  for r in $(seq "$rounds"); do
    "$qdarts" bench search --shape "$shape" --layers "$layers" --init-channels "$channels" --batch "$batch" \
      --order "$order" --quant "$quant" --reps "$reps" --warmup "$warmup" --csv "$tmp/q.csv" > "$tmp/q.txt"
    "$python" scripts/torch_reference.py bench --layers "$layers" --init-channels "$channels" --batch "$batch" \
      --nodes "$nodes" --c-in "$c_in" --size "$size" --order "$order" --quant "$quant" \
      --reps "$reps" --warmup "$warmup" --threads "$threads" > "$tmp/t.json"
    "$python" - "$tmp/q.csv" "$tmp/t.json" >> "$tmp/rounds.jsonl" <<'EOF'
import csv, json, sys
q = list(csv.DictReader(open(sys.argv[1])))[-1]
t = json.load(open(sys.argv[2]))
qm = float(q["peak_bytes"]) / 2**20 if q["peak_bytes"] else None
print(json.dumps({"q": float(q["median_s"]), "t": t["median_s"], "qm": qm, "tm": t["peak_rss_mib"]}))
EOF
  done
  "$python" - "$c" "$tmp/rounds.jsonl" <<'EOF'
import json, statistics as st, sys
case, path = sys.argv[1:]
rs = [json.loads(l) for l in open(path)]
ratios = [r["q"] / r["t"] for r in rs]
mem = [r["qm"] / r["tm"] for r in rs if r["qm"]]
qm = st.median([r["qm"] for r in rs if r["qm"]]) if mem else float("nan")
span = f"{st.median(ratios):.2f}x ({min(ratios):.2f}..{max(ratios):.2f})"
mr = f"{st.median(mem):.2f}x" if mem else "-"
print(f"{case:<16} {st.median(r['q'] for r in rs):10.3f} {st.median(r['t'] for r in rs):10.3f} "
      f"{span:>22} {qm:11.0f} {st.median(r['tm'] for r in rs):11.0f} {mr:>8}", flush=True)
EOF
done
echo "(ratio: qdarts over PyTorch; below 1 means qdarts is faster or smaller)"
