#!/usr/bin/env bash
# Builds, on a machine with cargo, what scripts/gpu_check.sh runs on a machine with an NVIDIA
# GPU (which needs no Rust toolchain): one folder to carry there.
#
# usage: scripts/gpu_build.sh [--out DIR] [--tch] [--tch-torch VERSION] [--debs] [--no-tests]
#                             [--tests LIST] [--tests-only]
#   DIR (--out): the folder to write (default .gpu, ignored by git):
#     qdarts          release binary with flex, wgpu and cuda (cuda through NVRTC: see
#                     vendor/README.md), stripped;
#     golden-*, fused-*, reduce-*, quant_kernels-*, batch_norm-*, optim-*, relu-*,
#     direct_conv-*, scale-*, memory-*
#                     the test executables of the same build: golden vectors, the fused
#                     fake-quant, row reductions, the observer and bias kernels, BatchNorm,
#                     the optimizer, ReLU, the convolutions, the mixed op's scaling, the
#                     memory pools;
#     qdarts-tch      with --tch: the LibTorch build (scripts/setup_torch.sh); it runs where the
#                     same PyTorch's libraries are found (LD_LIBRARY_PATH), whose version
#                     qdarts-tch.torch records; --tch-torch VERSION builds it against that
#                     PyTorch instead of the pinned one (the GPU machine's own, e.g. 2.11.0);
#     debs/           with --debs: Debian's Vulkan loader packages, which gpu_check.sh unpacks
#                     on a machine that has the NVIDIA driver but no loader.
#   --no-tests: leave the test executables out (smaller, when the carry limit is tight).
#   --tests LIST: only these test executables, comma-separated (e.g. golden,fused,reduce).
#   --tests-only: no qdarts binary, only the test executables.
#   Compressed, the qdarts binary is about 18 MB and each test executable 8 to 9.5 MB, and the
#   repository's files, which travel with a carry, about 11 MB: everything does not fit one
#   64 MiB carry. Build it in parts, carry one per call while the machine is warm, and run
#   gpu_check.sh on each, e.g.
#     gpu_build.sh --tch --debs --tests golden,fused                       # the whole check
#     gpu_build.sh --out .gpu2 --tests-only --tests reduce,quant_kernels,batch_norm,optim
#     gpu_build.sh --out .gpu3 --tests-only --tests relu,direct_conv,scale,memory
#   and there, for .gpu2 and .gpu3: gpu_check.sh --artefacts .gpu2 --backends tch
#   --skip parity,search,quant,step,torch (the tests only; it says tch is skipped).
# Every executable is stripped and xz-compressed (NAME.xz: about a sixth of the stripped
# size, golden 49 -> 8 MB), so that the folder fits a small carry limit; gpu_check.sh unpacks
# them.
# At the end it prints the folder's size beside the carry limit (QDARTS_CARRY_MIB, default
# 64) less the repository's tracked files, which travel with it, and warns when it is over.
# Environment: CUDARC_CUDA_VERSION (e.g. 12080) pins the CUDA API version cudarc is built for;
# without nvcc here it takes the newest it knows, which a driver at least that new loads.
set -euo pipefail

cd "$(dirname "$0")/.."
out=.gpu tch=0 debs=0 tests=1 binary=1 torch_args=()
all_tests=(golden fused reduce quant_kernels batch_norm optim relu direct_conv scale memory)
chosen=("${all_tests[@]}")
while [ $# -gt 0 ]; do
  case "$1" in
    --out)
      [ $# -ge 2 ] && [ -n "$2" ] || { echo "gpu_build.sh: --out needs a folder" >&2; exit 2; }
      out="$2"; shift 2 ;;
    --tch) tch=1; shift ;;
    --tch-torch)
      [ $# -ge 2 ] && [ -n "$2" ] || { echo "gpu_build.sh: --tch-torch needs a version" >&2; exit 2; }
      tch=1; torch_args=(--torch "$2"); shift 2 ;;
    --debs) debs=1; shift ;;
    --no-tests) tests=0; shift ;;
    --tests-only) binary=0; shift ;;
    --tests)
      [ $# -ge 2 ] && [ -n "$2" ] || { echo "gpu_build.sh: --tests needs a list" >&2; exit 2; }
      IFS=, read -r -a chosen <<< "$2"
      for t in "${chosen[@]}"; do
        [[ " ${all_tests[*]} " == *" $t "* ]] ||
          { echo "gpu_build.sh: --tests: '$t' is none of ${all_tests[*]}" >&2; exit 2; }
      done
      shift 2 ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "gpu_build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ "$binary" = 1 ] || [ "$tests" = 1 ] ||
  { echo "gpu_build.sh: --tests-only with --no-tests leaves nothing to build" >&2; exit 2; }
mkdir -p "$out"
target="${CARGO_TARGET_DIR:-target}"

if [ "$binary" = 1 ]; then
  echo "== qdarts with wgpu and cuda" >&2
  cargo build --release --features wgpu,cuda
  install -m 755 "$target/release/qdarts" "$out/qdarts"
  strip "$out/qdarts"
fi

if [ "$tests" = 1 ]; then
  echo "== the kernels' test executables (flex, wgpu, cuda)" >&2
  # Same profile and features as the binary, so the build is shared.
  test_args=()
  for t in "${chosen[@]}"; do test_args+=(--test "$t"); done
  cargo test --release -p qdarts-ops -p qdarts-kernels --features wgpu,cuda "${test_args[@]}" --no-run \
    --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do
    install -m 755 "$exe" "$out/$name"
    strip "$out/$name"
  done
fi

if [ "$tch" = 1 ]; then
  echo "== qdarts with LibTorch (tch)" >&2
  eval "$(bash scripts/setup_torch.sh "${torch_args[@]}")"
  cargo build --release --features tch
  install -m 755 "$target/release/qdarts" "$out/qdarts-tch"
  strip "$out/qdarts-tch"
  python -c 'import torch; print(torch.__version__.split("+")[0])' > "$out/qdarts-tch.torch"
fi

if [ "$debs" = 1 ]; then
  echo "== Vulkan loader packages" >&2
  mkdir -p "$out/debs" /tmp/qdarts-apt/partial
  o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/qdarts-apt)
  apt-get "${o[@]}" update -qq
  (cd "$out/debs" && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi

for f in "$out"/*; do
  [ -f "$f" ] && [ -x "$f" ] && [[ "$f" != *.xz ]] && xz -T0 -6 -f "$f"
done
du -ah "$out" | sort -k2 >&2
limit_mib="${QDARTS_CARRY_MIB:-64}"
tree_kib=$(git ls-files -z | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
out_kib=$(du -sk "$out" | cut -f1)
room_kib=$((limit_mib * 1024 - tree_kib))
echo "gpu_build.sh: $out is $((out_kib / 1024)) MiB; a carry holds ${limit_mib} MiB, of which the repository's files take $((tree_kib / 1024)) MiB, leaving $((room_kib / 1024)) MiB" >&2
if [ "$out_kib" -gt "$room_kib" ]; then
  echo "gpu_build.sh: warning: $out does not fit one carry; build it in parts (--tests LIST, --tests-only, --no-tests, --out; see --help) and carry one per call" >&2
fi
echo "gpu_build.sh: carry $out (scripts/gpu_check.sh --artefacts $out)" >&2
