#!/usr/bin/env bash
# Makes (once) a Python venv with the PyTorch that `--features tch` links against, and prints
# the `export` lines the build and the binary need:
#
#   eval "$(bash scripts/setup_torch.sh)" && cargo build --release --features tch
#
# usage: scripts/setup_torch.sh [--venv DIR] [--torch VERSION] [--check]
#   DIR:     where the venv lives (default $QDARTS_TORCH_VENV, else
#            ~/.cache/qdarts/torch-<version>); an existing venv with the right PyTorch is reused.
#   VERSION: another PyTorch than the pinned one, to build a binary for a machine that has
#            that one (a GPU machine's own PyTorch): the build then skips torch-sys' version
#            check (LIBTORCH_BYPASS_VERSION_CHECK=1). Tested with 2.11.0 only.
#   --check: make nothing; exit 1 (with the reason) unless DIR already holds that PyTorch.
# Everything but the export lines goes to standard error, so `eval` sees only them.
# The pinned version is scripts/requirements-tch.txt's (torch-sys 0.22 wants exactly 2.9.0).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
req="$here/requirements-tch.txt"
version="$(sed -n 's/^torch==\([0-9.]*\).*/\1/p' "$req")"
[ -n "$version" ] || { echo "setup_torch.sh: no torch==X line in $req" >&2; exit 2; }
pinned="$version"
venv="${QDARTS_TORCH_VENV:-}"
check=0
while [ $# -gt 0 ]; do
  case "$1" in
    --venv)
      [ $# -ge 2 ] || { echo "setup_torch.sh: --venv needs a folder" >&2; exit 2; }
      venv="$2"; shift 2 ;;
    --torch)
      [ $# -ge 2 ] && [[ "$2" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
        { echo "setup_torch.sh: --torch needs a version such as 2.11.0" >&2; exit 2; }
      version="$2"; shift 2 ;;
    --check) check=1; shift ;;
    -h|--help) sed -n '2,16p' "$0" >&2; exit 0 ;;
    *) echo "setup_torch.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$venv" ] || venv="$HOME/.cache/qdarts/torch-$version"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
if [ "$version" != "$pinned" ]; then
  # The pinned file with only its torch line changed: the stamp below then tells the two apart.
  other="$(mktemp)"
  trap 'rm -f "$other"' EXIT
  sed "s/^torch==.*/torch==$version/" "$req" > "$other"
  req="$other"
fi

# Ready means: pip finished installing this requirements file there (its copy is the stamp),
# and its Python imports torch at exactly the pinned version. A venv left half-installed by an
# interrupted pip, or made from an older requirements file, is installed into again.
stamp="$venv/qdarts-requirements.txt"
ready() {
  [ -x "$venv/bin/python" ] && cmp -s "$req" "$stamp" &&
    [ "$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" = "$version" ]
}

if ! ready; then
  if [ "$check" = 1 ]; then
    echo "setup_torch.sh: $venv holds no PyTorch $version (run scripts/setup_torch.sh to make it)" >&2
    exit 1
  fi
  echo "setup_torch.sh: installing PyTorch $version into $venv (about 4 GB from the package registry)" >&2
  mkdir -p "$(dirname "$venv")"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >&2
  rm -f "$stamp"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2
  cp "$req" "$stamp"
  ready || { echo "setup_torch.sh: $venv still does not import torch $version" >&2; exit 1; }
fi

lib="$("$venv/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
echo "setup_torch.sh: PyTorch $version in $venv" >&2
# torch-sys runs `python` (with VIRTUAL_ENV set) to find the headers and libraries; the binary
# finds libtorch through LD_LIBRARY_PATH (libtorch_cuda.so finds the CUDA wheels by its rpath).
printf 'export VIRTUAL_ENV=%q\n' "$venv"
printf 'export PATH=%q:"$PATH"\n' "$venv/bin"
printf 'export LIBTORCH_USE_PYTORCH=1\n'
if [ "$version" != "$pinned" ]; then
  printf 'export LIBTORCH_BYPASS_VERSION_CHECK=1\n'
else
  printf 'unset LIBTORCH_BYPASS_VERSION_CHECK\n'
fi
# The wheel's NVRTC too (a dependency of this PyTorch on Linux), so that a cuda build finds
# it where no CUDA toolkit is installed: tests/cuda.rs compiles the kernels' CUDA C++ with it.
nvrtc="$("$venv/bin/python" -c 'import os, nvidia.cuda_nvrtc as n; print(os.path.join(n.__path__[0], "lib"))' 2>/dev/null || true)"
if [ -n "$nvrtc" ] && [ -d "$nvrtc" ]; then
  lib="$lib:$nvrtc"
fi
printf 'export LD_LIBRARY_PATH=%q"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' "$lib"
