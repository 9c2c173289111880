#!/usr/bin/env bash
# Build mmcv (with its compiled ops) once per (mmcv, torch, Python, CUDA) and keep the wheel in a
# cache outside the repository. Prints the folder holding the wheel; build logs go to stderr.
#   usage: tools/build_mmcv_wheel.sh PYTHON
# POLA_WHEEL_CACHE overrides the cache root (default: ${XDG_CACHE_HOME:-~/.cache}/polaformer_mm/wheels).
set -euo pipefail
PY=${1:?usage: build_mmcv_wheel.sh PYTHON}
MMCV_VERSION=${MMCV_VERSION:-2.1.0}
CACHE_ROOT=${POLA_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/polaformer_mm/wheels}

# CUDA ops are built only where torch is a CUDA build and nvcc is present; otherwise CPU ops.
read -r KEY FORCE_CUDA < <("$PY" - <<'PYEOF'
import shutil, sys, torch
cuda = torch.version.cuda if shutil.which('nvcc') else None
tag = 'cu' + cuda.replace('.', '') if cuda else 'cpu'
torch_v = torch.__version__.split('+')[0]
print(f'torch{torch_v}-cp{sys.version_info[0]}{sys.version_info[1]}-{tag}', 1 if cuda else 0)
PYEOF
)
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
MMCV_WITH_OPS=1 FORCE_CUDA=$FORCE_CUDA MAX_JOBS=${MAX_JOBS:-$(nproc)} \
  "$PY" -m pip wheel --no-cache-dir --no-build-isolation --no-deps --no-binary mmcv \
  "mmcv==$MMCV_VERSION" -w "$TMP" >&2
# Publish atomically so an interrupted build never looks cached.
mkdir -p "$DEST.partial"
mv "$TMP"/mmcv-*.whl "$DEST.partial/"
rm -rf "$DEST"
mv "$DEST.partial" "$DEST"
echo "$DEST"
