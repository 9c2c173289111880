#!/usr/bin/env bash
# Build mmcv (with its compiled ops) once per (mmcv, torch, Python, CUDA version and GPU
# archs) and keep the wheel in a cache outside the repository. Prints the folder holding
# the wheel; build logs go to stderr.
#   usage: .dev_scripts/build_mmcv_wheel.sh PYTHON
# POLA_WHEEL_CACHE overrides the cache root (default: ${XDG_CACHE_HOME:-~/.cache}/polaformer_mm/wheels).
set -euo pipefail
PY=${1:?usage: build_mmcv_wheel.sh PYTHON}
MMCV_VERSION=${MMCV_VERSION:-2.1.0}
CACHE_ROOT=${POLA_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/polaformer_mm/wheels}

# How to build the ops (.dev_scripts/mmcv_build_plan.py decides; it imports nothing of the
# package, which is not installed yet): CPU ops for a CPU torch; for a CUDA torch, CUDA ops for TORCH_CUDA_ARCH_LIST
# (default: the visible GPUs), and a stop with the fix when there is no nvcc, unless
# POLA_MMCV_CPU_ONLY=1 asks for CPU-only ops.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PLAN=$("$PY" "$HERE/mmcv_build_plan.py") || exit 1
read -r KEY FORCE_CUDA ARCH_LIST HIDE_GPUS <<<"$PLAN"
BUILD_ENV=(MMCV_WITH_OPS=1 FORCE_CUDA="$FORCE_CUDA" MAX_JOBS="${MAX_JOBS:-$(nproc)}")
if [ "$ARCH_LIST" != "-" ]; then BUILD_ENV+=(TORCH_CUDA_ARCH_LIST="$ARCH_LIST"); fi
# mmcv's setup.py compiles CUDA ops whenever a GPU is visible: hide them for CPU-only ops
if [ "$HIDE_GPUS" = "1" ]; then BUILD_ENV+=(CUDA_VISIBLE_DEVICES=); fi
DEST="$CACHE_ROOT/mmcv-$MMCV_VERSION-$KEY"
if compgen -G "$DEST/mmcv-$MMCV_VERSION-*.whl" >/dev/null; then
  echo "mmcv $MMCV_VERSION wheel cached in $DEST" >&2
  echo "$DEST"
  exit 0
fi

echo "building mmcv $MMCV_VERSION with ops ($KEY); this takes about 10 minutes on 2 cores" >&2
mkdir -p "$CACHE_ROOT"
TMP=$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
# --no-cache-dir: pip's own wheel cache is keyed by the sdist alone, not by the torch or
# CUDA it was compiled against; this cache is the one that knows.
env "${BUILD_ENV[@]}" \
  "$PY" -m pip wheel --no-cache-dir --no-build-isolation --no-deps --no-binary mmcv \
  "mmcv==$MMCV_VERSION" -w "$TMP" >&2
# Publish atomically so an interrupted build never looks cached.
mkdir -p "$DEST.partial"
mv "$TMP"/mmcv-*.whl "$DEST.partial/"
rm -rf "$DEST"
mv "$DEST.partial" "$DEST"
echo "$DEST"
