#!/usr/bin/env bash
# The GPU check: qdarts on every GPU backend of one machine, against eager PyTorch on the same
# GPU, in one table. Build the artefacts where cargo is (scripts/gpu_build.sh), carry them to
# the machine with the NVIDIA GPU, and run this there from the repository root:
#
#   scripts/gpu_check.sh [--artefacts DIR] [--backends LIST] [--python PY] [--out DIR]
#                        [--reps N] [--rounds R] [--epochs N] [--limit N] [--batch B] [--layers L]
#                        [--init-channels C] [--step-timeout S] [--skip LIST] [--kernels]
#                        [--adaptive] [--quant Q] [--waves] [--dry-run]
#   DIR (--artefacts): what gpu_build.sh wrote (default .gpu): qdarts (flex, wgpu and cuda in
#        one binary), optionally qdarts-tch (LibTorch) and the kernels' test executables
#        (golden-*, fused-*, reduce-*, quant_kernels-*, batch_norm-*, optim-*, relu-*,
#        direct_conv-*, scale-*, memory-*).
#   LIST: comma-separated, of cuda, wgpu, tch (default: all three).
#   PY:  a Python with torch (CUDA build on a GPU), numpy and safetensors (default: python3).
#   --out DIR: logs, CSVs and the table (default: a new folder under results/).
#   --reps N: timed steps per row (default 3, after one warm-up).
#   --rounds R: timed rounds, PyTorch and each backend interleaved (default 3); each ratio is
#        the median of the per-round ratios, with their min..max.
#   --epochs N: epochs of the short default search per backend (default 1).
#   --limit N: training images of that search (default: the default experiment's 1280).
#   --batch/--layers/--init-channels: the search-step shape (default DARTS': 64, 8, 16; 4 nodes,
#        3x32x32), the same on both sides.
#   --step-timeout S: stop any one step after S seconds and count it failed (default 900).
#   --skip LIST: comma-separated steps left out, of tests, parity, search, quant, cell, step, torch.
#   --kernels: also profile the CubeCL backends' kernels (cuda, wgpu): one default-shape
#        step (first order, float, then tensorrt) after one warm-up, every kernel timed by
#        CubeCL's profiling logger; scripts/cubecl_profile.py sums the timed step's launches
#        (the log's last, as many as the bench counts) per kernel into
#        <backend>-<quant>-kernels.txt (the whole log's if the step did not finish).
#   --adaptive: also time cuda and wgpu with CubeCL's default memory pools (`--memory-pools
#        adaptive`: less memory, more host time than the binary's exclusive pages), as rows
#        of their own in every round.
#   --quant Q: time one quantization preset only (float or tensorrt), both orders, on every
#        side (PyTorch's cases too): a shorter check.
#   --waves: also time cuda and wgpu with the supernet's cells in waves (`bench search
#        --batched-cells`, the batched cell: float and tensorrt, or --quant's), as rows of
#        their own in every round, check them against the float parity fixtures (`parity
#        --batched-cells`), and with --kernels profile the steps in waves too.
#   --dry-run: print the commands, run none.
#
# Per backend it runs: the golden-vector and kernel tests (the carried test executables, all
# devices of their build), `qdarts parity` (one search step against the PyTorch reference's
# fixtures), a short default search (wall time, genotype), `qdarts bench quant` (fused fake-quant
# against a copy) and `qdarts bench search` (s/step, first and second order, float and
# tensorrt, peak GPU memory, launches per step on cuda and wgpu); then `scripts/torch_reference.py
# bench --device cuda` on the same cases. Without an NVIDIA GPU it falls back to the CPU so that
# every part can be tried: cuda must then fail cleanly (exit 1, the missing driver named), wgpu
# runs on Vulkan's adapter (Mesa's software driver), tch on LibTorch's CPU, PyTorch on the CPU.
# Exit status: 0 when every check passed, 1 when one failed, 2 on bad arguments.
set -uo pipefail

cd "$(dirname "$0")/.."
artefacts=.gpu backends=cuda,wgpu,tch python=python3 out="" reps=3 epochs=1 limit=""
batch=64 layers=8 channels=16 dry=0 step_timeout=900 skip="" rounds=3 kernels=0 adaptive=0
quant="" waves=0

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
    --rounds) need "$@"; posint "$1" "$2"; rounds="$2"; shift 2 ;;
    --limit) need "$@"; posint "$1" "$2"; limit="$2"; shift 2 ;;
    --batch) need "$@"; posint "$1" "$2"; batch="$2"; shift 2 ;;
    --layers) need "$@"; posint "$1" "$2"; layers="$2"; shift 2 ;;
    --init-channels) need "$@"; posint "$1" "$2"; channels="$2"; shift 2 ;;
    --step-timeout) need "$@"; posint "$1" "$2"; step_timeout="$2"; shift 2 ;;
    --skip) need "$@"; skip="$2"; shift 2 ;;
    --kernels) kernels=1; shift ;;
    --adaptive) adaptive=1; shift ;;
    --quant) need "$@"; quant="$2"; shift 2 ;;
    --waves) waves=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,/^# Exit status/p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case "$quant" in ""|float|tensorrt) ;; *) die "--quant: '$quant' is neither float nor tensorrt" ;; esac
[ "$layers" -ge 3 ] || die "--layers must be at least 3 (two reduction cells)"
[ $((channels % 2)) = 0 ] || die "--init-channels must be even"
IFS=, read -r -a list <<< "$backends"
[ ${#list[@]} -gt 0 ] || die "--backends is empty"
for b in "${list[@]}"; do
  case "$b" in cuda|wgpu|tch) ;; *) die "--backends: '$b' is none of cuda, wgpu, tch" ;; esac
done
IFS=, read -r -a skips <<< "$skip"
for k in "${skips[@]}"; do
  case "$k" in tests|parity|search|quant|cell|step|torch) ;;
    *) die "--skip: '$k' is none of tests, parity, search, quant, cell, step, torch" ;; esac
done
wanted() { [[ ",$skip," != *",$1,"* ]]; }
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
    for f in "$artefacts"/*; do
      [ -f "$f" ] && [[ "$f" != *.xz ]] && cp "$f" "$unpacked/"
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
  timeout --kill-after=10 "$step_timeout" "$@" > "$out/$name.log" 2>&1
  rc=$?
  [ "$rc" = 124 ] && echo "gpu_check.sh: stopped after $step_timeout s (--step-timeout)" >> "$out/$name.log"
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

# The cuda backend compiles its kernels at run time with NVRTC, against the CUDA toolkit's
# headers: CubeCL looks for them under $CUDA_PATH, else /usr/local/cuda. NVRTC (libnvrtc.so)
# comes with the toolkit, not the driver: where the loader does not find it, the toolkit's
# lib64 or the pip wheels of the chosen Python (nvidia-cuda-nvrtc) are added to its path.
if [ "$dry" = 0 ] && [ -n "$gpu" ]; then
  if [ -z "${CUDA_PATH:-}" ]; then
    for c in /usr/local/cuda /opt/cuda; do
      [ -f "$c/include/cuda.h" ] && { export CUDA_PATH="$c"; break; }
    done
  fi
  echo "cuda toolkit: ${CUDA_PATH:-not found (the cuda backend needs its headers: set CUDA_PATH)}" >> "$out/machine.txt"
  if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
    nvrtc="$(ls -d "${CUDA_PATH:-/nonexistent}"/lib64/libnvrtc.so* \
      "$("$python" -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)"/nvidia/*/lib/libnvrtc.so* \
      2>/dev/null | head -1)"
    if [ -n "$nvrtc" ]; then
      export LD_LIBRARY_PATH="$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "nvrtc: $nvrtc" >> "$out/machine.txt"
    else
      echo "nvrtc: not found (the cuda backend cannot compile kernels)" >> "$out/machine.txt"
    fi
  fi
fi
# qdarts-tch links LibTorch dynamically: the chosen Python's PyTorch provides it, and must be
# the version it was built against (gpu_build.sh records it in qdarts-tch.torch).
torchlib="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)"
tchenv=(env "LD_LIBRARY_PATH=$torchlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
if [ "$dry" = 0 ] && [ -x "$tchbin" ] && [ -f "${tchbin%-tch}-tch.torch" ]; then
  built="$(cat "${tchbin%-tch}-tch.torch")"
  have="$("$python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)"
  if [ "$built" != "$have" ]; then
    echo "gpu_check.sh: $tchbin was built against PyTorch $built, but $python has $have: tch skipped (gpu_build.sh --tch-torch $have builds a matching one)" >&2
    mv "$tchbin" "$tchbin.mismatch"
  fi
fi

failed=0
# The carried test executables, once per device of their build (flex, wgpu, cuda; tch for the
# -tch ones), each run limited to that backend (QDARTS_TEST_BACKENDS) so that one backend's
# failure does not hide another's. The cuda build's tests need a GPU: without one they are not
# run.
for t in "$artefacts"/golden* "$artefacts"/fused* "$artefacts"/reduce* "$artefacts"/quant_kernels* \
  "$artefacts"/batch_norm* "$artefacts"/optim* "$artefacts"/relu* "$artefacts"/direct_conv* "$artefacts"/scale* "$artefacts"/memory*; do
  [ -x "$t" ] && wanted tests || continue
  name="test-$(basename "$t")"
  if [ -z "$gpu" ] && [[ "$name" != *tch* ]]; then
    [ "$dry" = 1 ] || printf '%s\t%s\t%s\n' "$name" "skip" "0" >> "$out/steps.tsv"
    continue
  fi
  devices=(flex wgpu cuda)
  [[ "$name" == *tch* ]] && devices=(flex tch)
  for d in "${devices[@]}"; do
    run "$name-$d" env QDARTS_GOLDEN_DIR=ops/tests/golden QDARTS_TEST_BACKENDS="$d" \
      QDARTS_REQUIRE_CUDA=1 "$t" --test-threads=1 || failed=1
  done
done

shape=(--batch "$batch" --layers "$layers" --init-channels "$channels")
# The backends that start, each as one line of its command prefix, for the timed rounds below.
timed=()
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
  pre=()
  [ "$b" = tch ] && pre=("${tchenv[@]}")
  if wanted parity; then run "$b-parity" "${pre[@]}" "$exe" "${dev[@]}" parity || failed=1; fi
  if wanted parity && [ "$waves" = 1 ]; then
    # The batched cell against the same references: the float fixtures, small and default shape.
    run "$b-parity-waves" "${pre[@]}" "$exe" "${dev[@]}" parity --batched-cells \
      search/tests/fixtures/parity/float search/tests/fixtures/parity-default-shape/float || failed=1
  fi
  if wanted search; then
    run "$b-search" "${pre[@]}" "$exe" "${dev[@]}" search --set "search.epochs=$epochs" \
      ${limit:+--set "data.limit=$limit"} --set "record.results_dir=\"$out/runs-$b\"" || failed=1
  fi
  if [ "$kernels" = 1 ] && [ "$b" != tch ]; then
    forms=("")
    [ "$waves" = 1 ] && forms+=(-waves)
    for q in float tensorrt; do
      for form in "${forms[@]}"; do
        # CubeCL reads cubecl.toml from the working directory: a folder of its own holds one
        # that turns the profiling logger on, and the step runs there (every path absolute).
        name="$b$form-$q-kernels"
        kdir="$out/kernels-$b$form-$q" klog="$out/kernels-$b$form-$q.log"
        if [ "$dry" = 0 ]; then
          mkdir -p "$kdir" && kdir="$(cd "$kdir" && pwd)" && klog="$kdir.log"
          printf '[profiling.logger]\nlevel = "full"\nappend = false\nfile = "%s"\n' "$klog" \
            > "$kdir/cubecl.toml"
        fi
        kexe="$exe"
        [ "$dry" = 1 ] || kexe="$(cd "$(dirname "$exe")" && pwd)/$(basename "$exe")"
        cells=()
        [ -n "$form" ] && cells=(--batched-cells)
        run "$name" env -C "$kdir" "$kexe" "${dev[@]}" bench search --shape default \
          --order first --quant "$q" "${cells[@]}" --reps 1 --warmup 1 || failed=1
        # The timed step is the log's last launches, as many as the bench's launches column
        # counts; a step stopped by --step-timeout still leaves the launches it timed: summed.
        if [ "$dry" = 0 ] && [ -s "$klog" ]; then
          launches="$(tail -1 "$out/$name.log" | awk '{print $NF}')"
          steps=()
          [[ "$launches" =~ ^[1-9][0-9]*$ ]] && steps=(--last "$launches")
          "$python" scripts/cubecl_profile.py "$klog" "${steps[@]}" \
            --csv "$out/kernels-$b$form-$q.csv" > "$out/$name.txt" 2>&1 || failed=1
        fi
      done
    done
  fi
  if wanted quant; then
    run "$b-quant" "${pre[@]}" "$exe" "${dev[@]}" bench quant --reps "$reps" \
      --csv "$out/quant-$b.csv" || failed=1
  fi
  if wanted cell && [ "$b" != tch ]; then
    # One float DARTS cell edge by edge against in waves (the batched cell): launches, seconds.
    run "$b-cell" "${pre[@]}" "$exe" "${dev[@]}" bench cell --batch 64 --channels 16 \
      --size 32 --rounds 5 --csv "$out/cell-$b.csv" || failed=1
  fi
  timed+=("$b $(printf '%q ' "${pre[@]}" "$exe" "${dev[@]}")")
  if [ "$adaptive" = 1 ] && [ "$b" != tch ]; then
    timed+=("$b-adaptive $(printf '%q ' "$exe" "${dev[@]}" --memory-pools adaptive)")
  fi
  if [ "$waves" = 1 ] && [ "$b" != tch ]; then
    timed+=("$b-waves $(printf '%q ' "$exe" "${dev[@]}")")
  fi
done

# The timed rows, interleaved: each round runs PyTorch's four cases, then every backend's, so
# that a drift of the machine (clocks, another tenant) falls on both sides of each ratio.
for r in $(seq 1 "$rounds"); do
  if wanted torch; then
    echo "== round $r: PyTorch eager on $torch_device" >&2
    for order in first second; do
      for q in float tensorrt; do
        [ -z "$quant" ] || [ "$q" = "$quant" ] || continue
        cmd=("$python" scripts/torch_reference.py bench --device "$torch_device" \
          --order "$order" --quant "$q" "${shape[@]}" --reps "$reps")
        if [ "$dry" = 1 ]; then printf '%q ' "${cmd[@]}"; printf '\n'; continue; fi
        name="torch-$order-$q-r$r"
        run "$name" "${cmd[@]}" || failed=1
        [ -s "$out/$name.log" ] && tail -1 "$out/$name.log" |
          "$python" -c 'import json, sys; r = json.load(sys.stdin); r["round"] = int(sys.argv[1]); print(json.dumps(r))' "$r" \
          >> "$out/torch.jsonl"
      done
    done
  fi
  if wanted step; then
    for line in "${timed[@]}"; do
      b="${line%% *}"
      eval "cmd=(${line#* })"
      cases=()
      [ -n "$quant" ] && cases=(--quant "$quant")
      [[ "$b" == *-waves ]] && cases+=(--batched-cells)
      echo "== round $r: $b" >&2
      run "$b-step-r$r" "${cmd[@]}" bench search --shape darts "${shape[@]}" --reps "$reps" \
        "${cases[@]}" --csv "$out/step-$b-r$r.csv" || failed=1
    done
  fi
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
    if name.startswith(("test-", "cuda-refusal", "tch-missing")) or name.endswith(("-parity", "-search", "-kernels")):
        extra = ""
        if name.endswith("-search") and steps[name][0] == "0":
            extra = f", {steps[name][1]:.1f} s wall"
        print(f"| {name} | {status(name)}{extra} |")
import re, statistics
torch = {}  # (order, quant) -> {round: row}
path = os.path.join(out, "torch.jsonl")
if os.path.exists(path):
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        torch.setdefault((r["order"], r["quant"]), {})[r.get("round", 1)] = r
steps_by = {}  # (backend, order, quant) -> {round: row}
for f in sorted(glob.glob(os.path.join(out, "step-*.csv"))):
    m = re.search(r"-r(\d+)\.csv$", f)
    rnd = int(m.group(1)) if m else 1
    for r in csv.DictReader(open(f)):
        # The CubeCL backends' rows name their memory pools (--adaptive times both kinds).
        backend = f"{r['backend']} ({r['pools']} pools)" if r.get("pools") else r["backend"]
        # The batched cell's rows (--waves) say so in their network column.
        if "in waves" in r.get("network", ""):
            backend += ", in waves"
        steps_by.setdefault((backend, r["order"], r["quant"]), {})[rnd] = r
def spread(xs, fmt):
    xs = sorted(xs)
    return f"{fmt(statistics.median(xs))} ({fmt(xs[0])}..{fmt(xs[-1])})" if xs else "-"
s4 = lambda v: f"{v:.4f}"
print()
print("Each figure: the median over the rounds (min..max); a ratio is the median of the per-round")
print("ratios to PyTorch eager in the same round. Peak: the largest over the rounds.")
print()
print("| backend | order | quant | rounds | s/step | vs PyTorch eager | peak GPU MiB | launches/step |")
print("|---|---|---|---|---|---|---|---|")
for key in sorted(torch):
    rows = torch[key]
    t = next(iter(rows.values()))
    if "peak_gpu_mib" in t:
        # Allocated, and reserved by the caching allocator: a CubeCL pool's size compares
        # with the second.
        peak = (f"{max(r['peak_gpu_mib'] for r in rows.values()):.0f} allocated, "
                f"{max(r['peak_gpu_reserved_mib'] for r in rows.values()):.0f} reserved")
    else:
        peak = f"{max(r['peak_rss_mib'] for r in rows.values()):.0f} (RSS)"
    print(f"| PyTorch {t['torch']} ({t['device']}) | {key[0]} | {key[1]} | {len(rows)} | "
          f"{spread([r['median_s'] for r in rows.values()], s4)} | 1 | {peak} | - |")
for (backend, order, quant), rows in sorted(steps_by.items()):
    t = torch.get((order, quant), {})
    ratios = [float(r["median_s"]) / t[k]["median_s"] for k, r in rows.items() if k in t]
    peaks = [int(r["peak_bytes"]) for r in rows.values() if r["peak_bytes"]]
    peak = f"{max(peaks) / 2**20:.0f} (pool)" if peaks else "-"
    # Kernel launches per step, counted on the CubeCL backends (the same every round).
    launches = sorted(int(r["launches"]) for r in rows.values() if r.get("launches"))
    launches = f"{launches[len(launches) // 2]}" if launches else "-"
    print(f"| {backend} | {order} | {quant} | {len(rows)} | "
          f"{spread([float(r['median_s']) for r in rows.values()], s4)} | "
          f"{spread(ratios, lambda v: f'{v:.2f}x')} | {peak} | {launches} |")
for f in sorted(glob.glob(os.path.join(out, "*-kernels.txt"))):
    lines = open(f).read().splitlines()
    print()
    backend, quant = os.path.basename(f)[:-len('-kernels.txt')].rsplit("-", 1)
    print(f"Kernel time of {backend}, one default-shape step (first order, {quant}) after its "
          "warm-up, per kernel (scripts/cubecl_profile.py):")
    print()
    print("```")
    print("\n".join(lines[:18]))
    print("```")
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
