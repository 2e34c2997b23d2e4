#!/usr/bin/env bash
# The GPU check: qdarts on every GPU backend of one machine, against eager PyTorch on the same
# GPU, in one table. Build the artefacts where cargo is (scripts/gpu_build.sh), carry them to
# the machine with the NVIDIA GPU, and run this there from the repository root:
#
#   scripts/gpu_check.sh [--artefacts DIR] [--backends LIST] [--python PY] [--out DIR]
#                        [--reps N] [--epochs N] [--limit N] [--batch B] [--layers L]
#                        [--init-channels C] [--dry-run]
#   DIR (--artefacts): what gpu_build.sh wrote (default .gpu): qdarts (flex, wgpu and cuda in
#        one binary), optionally qdarts-tch (LibTorch) and the test executables golden-*/fused-*.
#   LIST: comma-separated, of cuda, wgpu, tch (default: all three).
#   PY:  a Python with torch (CUDA build on a GPU), numpy and safetensors (default: python3).
#   --out DIR: logs, CSVs and the table (default: a new folder under results/).
#   --reps N: timed steps per row (default 3, after one warm-up).
#   --epochs N: epochs of the short default search per backend (default 1).
#   --limit N: training images of that search (default: the default experiment's 1280).
#   --batch/--layers/--init-channels: the search-step shape (default DARTS': 64, 8, 16; 4 nodes,
#        3x32x32), the same on both sides.
#   --dry-run: print the commands, run none.
#
# Per backend it runs: the golden-vector and fused-kernel tests (the carried test executables,
# all devices of their build), `qdarts parity` (one search step against the PyTorch reference's
# fixtures), a short default search (wall time, genotype), `qdarts bench quant` (fused
# fake-quant against a copy) and `qdarts bench search` (s/step, first and second order, float
# and tensorrt, peak GPU memory); then `scripts/torch_reference.py bench --device cuda` on the
# same cases. Without an NVIDIA GPU it falls back to the CPU so that every part can be tried:
# cuda must then fail cleanly (exit 1, the missing driver named), wgpu runs on whatever adapter
# Vulkan offers (Mesa's software driver), tch on LibTorch's CPU device, PyTorch on the CPU.
# Exit status: 0 when every check passed, 1 when one failed, 2 on bad arguments.
set -uo pipefail

cd "$(dirname "$0")/.."
artefacts=.gpu backends=cuda,wgpu,tch python=python3 out="" reps=3 epochs=1 limit=""
batch=64 layers=8 channels=16 dry=0

die() { echo "gpu_check.sh: $*" >&2; exit 2; }
need() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }
posint() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --artefacts) need "$@"; artefacts="$2"; shift 2 ;;
    --backends) need "$@"; backends="$2"; shift 2 ;;
    --python) need "$@"; python="$2"; shift 2 ;;
    --out) need "$@"; out="$2"; shift 2 ;;
    --reps) need "$@"; posint "$1" "$2"; reps="$2"; shift 2 ;;
    --epochs) need "$@"; posint "$1" "$2"; epochs="$2"; shift 2 ;;
    --limit) need "$@"; posint "$1" "$2"; limit="$2"; shift 2 ;;
    --batch) need "$@"; posint "$1" "$2"; batch="$2"; shift 2 ;;
    --layers) need "$@"; posint "$1" "$2"; layers="$2"; shift 2 ;;
    --init-channels) need "$@"; posint "$1" "$2"; channels="$2"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ "$layers" -ge 3 ] || die "--layers must be at least 3 (two reduction cells)"
[ $((channels % 2)) = 0 ] || die "--init-channels must be even"
IFS=, read -r -a list <<< "$backends"
[ ${#list[@]} -gt 0 ] || die "--backends is empty"
for b in "${list[@]}"; do
  case "$b" in cuda|wgpu|tch) ;; *) die "--backends: '$b' is none of cuda, wgpu, tch" ;; esac
done
[ -d "$artefacts" ] || die "$artefacts: no such folder (make it with scripts/gpu_build.sh)"
# gpu_build.sh carries the executables xz-compressed: unpack them beside the results (with
# Python's lzma, which every Python has, where xz itself may be missing).
if compgen -G "$artefacts/*.xz" >/dev/null; then
  [ -n "$out" ] || out="results/gpu-check-$(date -u +%Y%m%d-%H%M%S)"
  unpacked="$out/bin"
  if [ "$dry" = 0 ]; then
    mkdir -p "$unpacked" || die "cannot make $unpacked"
    for f in "$artefacts"/*.xz; do
      name="$(basename "$f" .xz)"
      python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as a, open(sys.argv[2], "wb") as b:
    shutil.copyfileobj(a, b)' "$f" "$unpacked/$name" || die "cannot unpack $f"
      chmod +x "$unpacked/$name"
    done
    [ -d "$artefacts/debs" ] && ln -sfn "$(cd "$artefacts/debs" && pwd)" "$unpacked/debs"
  fi
  artefacts="$unpacked"
fi
bin="$artefacts/qdarts"
tchbin="$artefacts/qdarts-tch"
if [ "$dry" = 0 ] && [[ " ${list[*]} " =~ " cuda " || " ${list[*]} " =~ " wgpu " ]]; then
  [ -x "$bin" ] || die "$bin: missing or not executable (scripts/gpu_build.sh writes it)"
fi
[ -n "$out" ] || out="results/gpu-check-$(date -u +%Y%m%d-%H%M%S)"
if [ "$dry" = 0 ] && ! "$python" -c "import torch, numpy, safetensors" 2>/dev/null; then
  die "$python lacks torch, numpy or safetensors (--python PY names another)"
fi

# The GPU, or the CPU fallback.
gpu=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
fi
torch_device=cuda
[ -n "$gpu" ] || torch_device=cpu

run() {  # run NAME CMD...: logs to $out/NAME.log, records the exit code and the wall time
  local name="$1"; shift
  if [ "$dry" = 1 ]; then
    printf '%q ' "$@"; printf '\n'
    return 0
  fi
  local t0 t1 rc
  t0=$(date +%s.%N)
  "$@" > "$out/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(awk "BEGIN { print $t1 - $t0 }")" >> "$out/steps.tsv"
  if [ "$rc" = 0 ]; then echo "  ok    $name" >&2; else echo "  FAIL  $name (exit $rc, $out/$name.log)" >&2; fi
  return "$rc"
}

if [ "$dry" = 0 ]; then
  mkdir -p "$out" || die "cannot make $out"
  : > "$out/steps.tsv"
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "gpu: ${gpu:-none (CPU fallback)}"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
    echo "qdarts: $("$bin" --version 2>/dev/null || echo '?')"
    echo "torch: $("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo 'not importable')"
    echo "shape: batch $batch, $layers cells, C=$channels, 4 nodes, 3x32x32; $reps timed steps after 1 warm-up"
  } > "$out/machine.txt"
  cat "$out/machine.txt" >&2
fi

# Vulkan's loader, where the machine lacks it and the artefacts carry it (gpu_build.sh --debs).
if [ "$dry" = 0 ] && ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1'; then
  if compgen -G "$artefacts/debs/*.deb" >/dev/null && [ "$(id -u)" = 0 ]; then
    for f in "$artefacts"/debs/*.deb; do dpkg -x "$f" /; done
    ldconfig
    echo "gpu_check.sh: unpacked the carried Vulkan loader" >&2
  fi
fi
if [ -n "$gpu" ] && [ -z "${VK_DRIVER_FILES:-}" ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi

failed=0
# The carried test executables: every device of their build (flex, wgpu, cuda; tch for the
# -tch ones). The cuda build's tests need a GPU: without one they are not run.
for t in "$artefacts"/golden* "$artefacts"/fused*; do
  [ -x "$t" ] || continue
  name="test-$(basename "$t")"
  if [ -z "$gpu" ] && [[ "$name" != *tch* ]]; then
    [ "$dry" = 1 ] || printf '%s\t%s\t%s\n' "$name" "skip" "0" >> "$out/steps.tsv"
    continue
  fi
  run "$name" env QDARTS_GOLDEN_DIR=ops/tests/golden "$t" --test-threads=1 || failed=1
done

shape=(--batch "$batch" --layers "$layers" --init-channels "$channels")
for b in "${list[@]}"; do
  exe="$bin" dev=()
  case "$b" in
    cuda) dev=(--backend cuda) ;;
    wgpu) dev=(--backend wgpu) ;;
    tch)
      exe="$tchbin"
      if [ -n "$gpu" ]; then dev=(--backend tch --device cuda:0); else dev=(--backend tch); fi
      if [ ! -x "$exe" ]; then
        echo "gpu_check.sh: $exe missing: tch skipped (gpu_build.sh --tch builds it)" >&2
        [ "$dry" = 1 ] || printf '%s\t%s\t%s\n' "tch-missing" "skip" "0" >> "$out/steps.tsv"
        continue
      fi ;;
  esac
  echo "== $b${gpu:+ on $gpu}" >&2
  if [ "$b" = cuda ] && [ -z "$gpu" ]; then
    # No GPU: the one thing to check is the clean refusal.
    if [ "$dry" = 1 ]; then
      printf '%q ' "$exe" "${dev[@]}" parity; printf '\n'
    else
      "$exe" "${dev[@]}" parity > "$out/cuda-refusal.log" 2>&1
      rc=$?
      if [ "$rc" = 1 ] && grep -q 'the cuda backend could not start' "$out/cuda-refusal.log" \
          && ! grep -q 'panicked' "$out/cuda-refusal.log"; then
        printf '%s\t%s\t%s\n' "cuda-refusal" 0 0 >> "$out/steps.tsv"
        echo "  ok    cuda refuses cleanly without a GPU: $(tail -1 "$out/cuda-refusal.log")" >&2
      else
        printf '%s\t%s\t%s\n' "cuda-refusal" "$rc" 0 >> "$out/steps.tsv"
        echo "  FAIL  cuda without a GPU: exit $rc ($out/cuda-refusal.log)" >&2
        failed=1
      fi
    fi
    continue
  fi
  run "$b-parity" "$exe" "${dev[@]}" parity || failed=1
  run "$b-search" "$exe" "${dev[@]}" search --set "search.epochs=$epochs" \
    ${limit:+--set "data.limit=$limit"} --set "record.results_dir=\"$out/runs-$b\"" || failed=1
  run "$b-quant" "$exe" "${dev[@]}" bench quant --reps "$reps" --csv "$out/quant-$b.csv" || failed=1
  run "$b-step" "$exe" "${dev[@]}" bench search --shape darts "${shape[@]}" --reps "$reps" \
    --csv "$out/step-$b.csv" || failed=1
done

echo "== PyTorch eager on $torch_device" >&2
for order in first second; do
  for quant in float tensorrt; do
    if [ "$dry" = 1 ]; then
      printf '%q ' "$python" scripts/torch_reference.py bench --device "$torch_device" \
        --order "$order" --quant "$quant" "${shape[@]}" --reps "$reps"; printf '\n'
      continue
    fi
    run "torch-$order-$quant" "$python" scripts/torch_reference.py bench --device "$torch_device" \
      --order "$order" --quant "$quant" "${shape[@]}" --reps "$reps" || failed=1
    [ -s "$out/torch-$order-$quant.log" ] && tail -1 "$out/torch-$order-$quant.log" >> "$out/torch.jsonl"
  done
done
[ "$dry" = 1 ] && exit 0

"$python" - "$out" <<'EOF' | tee "$out/table.md"
import csv, glob, json, os, sys
out = sys.argv[1]
steps = {}
for line in open(os.path.join(out, "steps.tsv")):
    name, rc, secs = line.rstrip("\n").split("\t")
    steps[name] = (rc, float(secs))
def status(name):
    if name not in steps:
        return "-"
    rc, _ = steps[name]
    return {"0": "pass", "skip": "skipped"}.get(rc, f"FAIL ({rc})")
print(open(os.path.join(out, "machine.txt")).read().strip().replace("\n", "  \n"))
print()
print("| check | result |")
print("|---|---|")
for name in sorted(steps):
    if name.startswith(("test-", "cuda-refusal", "tch-missing")) or name.endswith(("-parity", "-search")):
        extra = ""
        if name.endswith("-search") and steps[name][0] == "0":
            extra = f", {steps[name][1]:.1f} s wall"
        print(f"| {name} | {status(name)}{extra} |")
torch = {}
path = os.path.join(out, "torch.jsonl")
if os.path.exists(path):
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        torch[(r["order"], r["quant"])] = r
rows = []
for f in sorted(glob.glob(os.path.join(out, "step-*.csv"))):
    for r in csv.DictReader(open(f)):
        rows.append(r)
print()
print("| backend | order | quant | s/step (min..max) | vs PyTorch eager | peak MiB |")
print("|---|---|---|---|---|---|")
for key in sorted(torch):
    t = torch[key]
    peak = t.get("peak_gpu_mib", t.get("peak_rss_mib"))
    what = "GPU, allocated" if "peak_gpu_mib" in t else "RSS"
    print(f"| PyTorch {t['torch']} ({t['device']}) | {key[0]} | {key[1]} | "
          f"{t['median_s']:.4f} ({t['min_s']:.4f}..{t['max_s']:.4f}) | 1.00 | {peak:.0f} ({what}) |")
for r in rows:
    t = torch.get((r["order"], r["quant"]))
    ratio = f"{float(r['median_s']) / t['median_s']:.2f}x" if t else "-"
    peak = f"{int(r['peak_bytes']) / 2**20:.0f}" if r["peak_bytes"] else "-"
    print(f"| {r['backend']} | {r['order']} | {r['quant']} | {float(r['median_s']):.4f} "
          f"({float(r['min_s']):.4f}..{float(r['max_s']):.4f}) | {ratio} | {peak} |")
qrows = []
for f in sorted(glob.glob(os.path.join(out, "quant-*.csv"))):
    qrows += list(csv.DictReader(open(f)))
if qrows:
    print()
    print("| backend | fake-quant kernel | pass | median ms | vs a copy |")
    print("|---|---|---|---|---|")
    copy = {(r["backend"], r["pass"]): float(r["median_s"]) for r in qrows if r["observer"].startswith("copy")}
    for r in qrows:
        if not r["observer"].startswith("kernel"):
            continue
        c = copy.get((r["backend"], r["pass"]))
        ratio = f"{float(r['median_s']) / c:.2f}x" if c else "-"
        print(f"| {r['backend']} | {r['observer']} {r['granularity']} | {r['pass']} | "
              f"{float(r['median_s']) * 1e3:.3f} | {ratio} |")
EOF
echo "gpu_check.sh: $out/table.md" >&2
exit "$failed"
