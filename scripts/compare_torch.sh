#!/usr/bin/env bash
# Times qdarts beside a reference on this machine, the two programs interleaved (qdarts,
# reference, qdarts, reference, ... for --rounds rounds, the same threads, warm-up excluded),
# and prints per case the median of the per-round ratios with their min..max, after a line
# naming the machine (CPU, cores, L3) and the versions. Three comparisons:
#   (default) one search step (architecture step + weight step) of the same supernet:
#             `qdarts bench search` against `scripts/torch_reference.py bench`;
#   --ops     each candidate op alone, forward+backward on a batch x C x 32 x 32 input, float
#             and tensorrt fake quant: `qdarts bench ops` against `torch_reference.py bench-ops`;
#   --runtime RUN  the integer runtime of a training run's frozen model against onnxruntime on
#             its exported model.onnx, same images, 1 thread and every core: `qdarts bench
#             runtime --rounds` (which alternates itself with `scripts/ort_bench.py`).
#
# usage: scripts/compare_torch.sh [--python PY] [--shape darts|default] [--rounds R]
#                                 [--layers L] [--init-channels C] [--batch B]
#                                 [--reps N] [--warmup N] [--batched-cells]
#                                 [--ops | --runtime RUN] [CASE ...]
#   CASE: ORDER/QUANT with ORDER first|second and QUANT float|tensorrt
#         (default: first/float first/tensorrt second/float second/tensorrt)
#   PY:   a Python with torch, numpy and safetensors (default: python3); for --runtime, one
#         with onnxruntime and numpy
#   --batched-cells: qdarts runs its cells in waves (float cases only; PyTorch edge by edge).
#   The qdarts binary is $QDARTS, else target/release/qdarts (built with cargo if missing).
# Shapes: darts (the default): DARTS' search shape, 8 cells, C=16, batch 64, 4 nodes, 3x32x32;
#   default: experiments/default.toml's, 4 cells, C=4, batch 32, 3 nodes, 1x28x28. Random data.
# Memory: both programs' peak RSS (qdarts' /proc VmHWM, PyTorch's ru_maxrss), and qdarts'
#   peak heap during the timed steps beside.
set -euo pipefail

cd "$(dirname "$0")/.."
python=python3 shape=darts rounds=3 layers="" channels="" batch="" reps=3 warmup=1 ops=0 runtime="" cases=()
batched=()
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
    --batched-cells) batched=(--batched-cells); shift ;;
    --runtime) runtime="$2"; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
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
[ "$ops" = 1 ] && [ -n "$runtime" ] && { echo "compare_torch.sh: --ops or --runtime, not both" >&2; exit 2; }
if [ -n "$runtime" ]; then
  if [ ! -f "$runtime/frozen/model.qdf" ] || [ ! -f "$runtime/frozen/model.onnx" ]; then
    echo "compare_torch.sh: --runtime $runtime: needs frozen/model.qdf and frozen/model.onnx (qdarts freeze, qdarts export)" >&2
    exit 2
  fi
  if ! "$python" -c "import onnxruntime, numpy" 2>/dev/null; then
    echo "compare_torch.sh: $python lacks onnxruntime or numpy (pip install onnxruntime numpy)" >&2
    exit 2
  fi
elif ! "$python" -c "import torch, numpy, safetensors" 2>/dev/null; then
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
machine="$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, L3 $(lscpu 2>/dev/null | sed -n 's/^L3 cache: *//p' | head -1)"

if [ -n "$runtime" ]; then
  echo "${machine}; $("$qdarts" --version), onnxruntime $("$python" -c 'import onnxruntime; print(onnxruntime.__version__)'); $(date -u +%FT%TZ)"
  "$qdarts" bench runtime "$runtime" --rounds "$rounds" --reps "$reps" --python "$python" --csv "$tmp/r.csv" > "$tmp/r.txt"
  sed -n '1p' "$tmp/r.txt"
  echo "${rounds} rounds, qdarts and onnxruntime alternating; per row the median of the per-round ratios and their min..max"
  "$python" - "$tmp/r.csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(f"{'runtime':<37} {'threads':>7} {'images/s':>10} {'qdarts / row (min..max)':>26}")
for r in rows:
    span = f"{float(r['vs_qdarts']):.2f}x ({float(r['vs_qdarts_min']):.2f}..{float(r['vs_qdarts_max']):.2f})"
    print(f"{r['runtime']:<37} {r['threads']:>7} {float(r['images_per_s']):10.1f} {span:>26}")
EOF
  echo "(qdarts / row: qdarts' images/s over the row's, same threads; above 1 means qdarts is faster)"
  exit 0
fi

versions="$("$qdarts" --version), PyTorch $("$python" -c 'import torch; print(torch.__version__)')"
if [ "$ops" = 1 ]; then
  echo "candidate ops alone, forward+backward, ${batch}x${channels}x32x32; each round the median of ${reps} after 1 warm-up; ${threads} threads"
  echo "${machine}; ${versions}; $(date -u +%FT%TZ)"
  echo "${rounds} rounds, qdarts and PyTorch interleaved; per op the median of the per-round ratios and their min..max"
  for r in $(seq "$rounds"); do
    "$qdarts" bench ops --batch "$batch" --channels "$channels" --size 32 --reps "$reps" --csv "$tmp/q$r.csv" > "$tmp/q.txt"
    "$python" scripts/torch_reference.py bench-ops --batch "$batch" --channels "$channels" --size 32 \
      --reps "$reps" --threads "$threads" > "$tmp/t$r.jsonl"
  done
  "$python" - "$tmp" "$rounds" <<'EOF'
import csv, json, statistics as st, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
per = {}
for r in range(1, rounds + 1):
    t = {(x["op"], x["stride"]): x for x in map(json.loads, open(f"{tmp}/t{r}.jsonl"))}
    for q in csv.DictReader(open(f"{tmp}/q{r}.csv")):
        key = (q["op"], int(q["stride"]))
        if key not in t:
            continue
        qf, qq = 1e3 * float(q["float_median_s"]), 1e3 * float(q["quant_median_s"])
        per.setdefault(key, []).append((qf, t[key]["float_ms"], qq, t[key]["quant_ms"]))
def span(v):
    return f"{st.median(v):.2f}x ({min(v):.2f}..{max(v):.2f})"
print(f"{'op':<14} {'stride':>6} {'qdarts ms':>10} {'PyTorch ms':>11} {'ratio (min..max)':>20} "
      f"{'qdarts fq ms':>13} {'PyTorch fq ms':>14} {'ratio (min..max)':>20}")
for key, rs in per.items():
    med = lambda i: st.median(r[i] for r in rs)
    print(f"{key[0]:<14} {key[1]:>6} {med(0):10.2f} {med(1):11.2f} {span([r[0] / r[1] for r in rs]):>20} "
          f"{med(2):13.2f} {med(3):14.2f} {span([r[2] / r[3] for r in rs]):>20}")
EOF
  echo "(ratio: qdarts over PyTorch; below 1 means qdarts is faster; fq: tensorrt fake quant)"
  exit 0
fi
echo "search step, ${layers} cells, C=${channels}, batch ${batch}, ${nodes} nodes, ${c_in}x${size}x${size}; median of ${reps} steps after ${warmup} warm-up; ${threads} threads"
echo "${machine}; ${versions}; $(date -u +%FT%TZ)"
echo "${rounds} rounds, qdarts and PyTorch interleaved; per case the median of the per-round ratios and their min..max"
printf '%-16s %10s %10s %22s %11s %11s %8s %11s\n' case "qdarts s" "PyTorch s" "ratio (min..max)" "qdarts RSS" "torch RSS" ratio "qdarts heap"
for c in "${cases[@]}"; do
  order="${c%/*}" quant="${c#*/}"
  : > "$tmp/rounds.jsonl"
  for r in $(seq "$rounds"); do
    "$qdarts" bench search --shape "$shape" --layers "$layers" --init-channels "$channels" --batch "$batch" \
      --order "$order" --quant "$quant" --reps "$reps" --warmup "$warmup" ${batched[@]+"${batched[@]}"} \
      --csv "$tmp/q.csv" > "$tmp/q.txt"
    "$python" scripts/torch_reference.py bench --layers "$layers" --init-channels "$channels" --batch "$batch" \
      --nodes "$nodes" --c-in "$c_in" --size "$size" --order "$order" --quant "$quant" \
      --reps "$reps" --warmup "$warmup" --threads "$threads" > "$tmp/t.json"
    "$python" - "$tmp/q.csv" "$tmp/t.json" >> "$tmp/rounds.jsonl" <<'EOF'
import csv, json, sys
q = list(csv.DictReader(open(sys.argv[1])))[-1]
t = json.load(open(sys.argv[2]))
mib = lambda v: float(v) / 2**20 if v else None
print(json.dumps({"q": float(q["median_s"]), "t": t["median_s"], "qh": mib(q["peak_bytes"]),
                  "qm": mib(q.get("peak_rss_bytes")), "tm": t["peak_rss_mib"]}))
EOF
  done
  "$python" - "$c" "$tmp/rounds.jsonl" <<'EOF'
import json, statistics as st, sys
case, path = sys.argv[1:]
rs = [json.loads(l) for l in open(path)]
ratios = [r["q"] / r["t"] for r in rs]
mem = [r["qm"] / r["tm"] for r in rs if r["qm"]]
med = lambda k: st.median(r[k] for r in rs) if all(r[k] for r in rs) else float("nan")
span = f"{st.median(ratios):.2f}x ({min(ratios):.2f}..{max(ratios):.2f})"
mr = f"{st.median(mem):.2f}x" if mem else "-"
print(f"{case:<16} {med('q'):10.3f} {med('t'):10.3f} {span:>22} {med('qm'):11.0f} {med('tm'):11.0f} "
      f"{mr:>8} {med('qh'):11.0f}", flush=True)
EOF
done
echo "(ratio: qdarts over PyTorch; below 1 means qdarts is faster or smaller; memory in MiB, RSS: the"
echo " process's peak resident set, heap: qdarts' live heap peak during the timed steps)"
