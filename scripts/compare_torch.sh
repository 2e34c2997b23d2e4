#!/usr/bin/env bash
# Times one search step (architecture step + weight step) of the same supernet in qdarts
# (`qdarts bench search`) and in PyTorch (`scripts/torch_reference.py bench`), one after the
# other on this machine, and prints the ratio table. With --ops, times each candidate op alone
# instead (`qdarts bench ops` against `scripts/torch_reference.py bench-ops`, forward+backward
# on a batch x C x 32 x 32 input, float and tensorrt fake quant).
#
# usage: scripts/compare_torch.sh [--python PY] [--layers L] [--init-channels C] [--batch B]
#                                 [--reps N] [--warmup N] [--ops] [CASE ...]
#   CASE: ORDER/QUANT with ORDER first|second and QUANT float|tensorrt
#         (default: first/float first/tensorrt second/float second/tensorrt)
#   PY:   a Python with torch, numpy and safetensors (default: python3)
#   The qdarts binary is $QDARTS, else target/release/qdarts (built with cargo if missing).
# Shape defaults: DARTS' search shape (8 cells, C=16, batch 64, 4 nodes, 3x32x32 random data).
# Memory: qdarts reports its peak heap, PyTorch its process's peak RSS.
set -euo pipefail

cd "$(dirname "$0")/.."
python=python3 layers=8 channels=16 batch=64 reps=3 warmup=1 ops=0 cases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --init-channels) channels="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --ops) ops=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    */*) cases+=("$1"); shift ;;
    *) echo "compare_torch.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
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
echo "search step, ${layers} cells, C=${channels}, batch ${batch}, 4 nodes, 3x32x32; median of ${reps} after ${warmup} warm-up; ${threads} threads; $(date -u +%FT%TZ)"
printf '%-16s %12s %12s %9s %14s %14s %9s\n' case "qdarts s" "PyTorch s" ratio "qdarts MiB" "PyTorch MiB" ratio
for c in "${cases[@]}"; do
  order="${c%/*}" quant="${c#*/}"
  "$qdarts" bench search --shape darts --layers "$layers" --init-channels "$channels" --batch "$batch" \
    --order "$order" --quant "$quant" --reps "$reps" --warmup "$warmup" --csv "$tmp/q.csv" > "$tmp/q.txt"
  "$python" scripts/torch_reference.py bench --layers "$layers" --init-channels "$channels" --batch "$batch" \
    --order "$order" --quant "$quant" --reps "$reps" --warmup "$warmup" --threads "$threads" > "$tmp/t.json"
  "$python" - "$c" "$tmp/q.csv" "$tmp/t.json" <<'EOF'
import csv, json, sys
case, qcsv, tjson = sys.argv[1:]
q = list(csv.DictReader(open(qcsv)))[-1]
t = json.load(open(tjson))
qs, ts = float(q["median_s"]), t["median_s"]
qm = float(q["peak_bytes"]) / 2**20 if q["peak_bytes"] else float("nan")
tm = t["peak_rss_mib"]
print(f"{case:<16} {qs:12.2f} {ts:12.2f} {qs / ts:8.2f}x {qm:14.0f} {tm:14.0f} {qm / tm:8.2f}x", flush=True)
EOF
done
echo "(ratio: qdarts over PyTorch; below 1 means qdarts is faster or smaller)"
