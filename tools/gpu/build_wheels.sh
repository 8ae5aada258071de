#!/usr/bin/env bash
# Build, on a machine with network, the wheel folder that the GPU tier (tools/gpu/run_tier.sh)
# installs on a bare GPU machine without network.
#
#   tools/gpu/build_wheels.sh [OUTDIR]        # default: .whl/ in the checkout (git-ignored)
#
# The GPU machine (the device tool's nvidia-h100-x1 / nvidia-h200 image; see
# /work/.library/device/KINDS.md, "Python packages already there") has Python 3.12, torch 2.11,
# timm, numpy, opencv(-headless), matplotlib, pyyaml, rich, einops, click, markdown, zipp,
# packaging, pillow, pytest and pytest-xdist, but no mmengine, mmcv or mmpretrain. This folder
# holds those three at the project's pins (requirements/stack.txt, tools/install_deps.sh) and
# every dependency of theirs the image lacks, each at the version this project is tested with
# (.venv, 2026-11-27):
#
#   mmengine 0.10.7   addict, termcolor, yapf (-> platformdirs)
#   mmcv 2.1.0        as mmcv-lite (MMCV_WITH_OPS=0: no compiled ops; built here from the sdist
#                     in seconds, pure Python). mmcv.cnn, mmcv.transforms import; mmcv.ops does
#                     not: mmdet and mmseg models (RoIAlign, NMS) cannot run there, the
#                     classifiers and backbones can
#   mmpretrain 1.2.0  mat4py, modelindex (-> model-index -> ordered-set),
#                     importlib-metadata (-> lazy-importer)
#
# Every wheel must be pure Python (py3-none-any): this machine has Python 3.11, the GPU machine
# 3.12, so nothing compiled here could run there; the script refuses any other wheel. The folder
# must stay under 64 MiB (what travels to the device machine with the working tree); the script
# prints its size and fails above that. Run it again to rebuild: OUTDIR is replaced as a whole
# (built in a temporary folder beside it, renamed into place at the end).
#
# Using it with the device tool: name the folder in `carry` (it is git-ignored, so it does not
# travel otherwise): carry=[".whl"], command "bash tools/gpu/run_tier.sh".
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/.whl}
PY=${PYTHON:-$ROOT/.venv/bin/python}
LIMIT_MIB=64
MMCV_VERSION=2.1.0

# name==version of the pure-Python wheels to download (mmcv is built below)
PINNED=(
  mmengine==0.10.7
  mmpretrain==1.2.0
  addict==2.4.0
  termcolor==3.3.0
  yapf==0.43.0
  platformdirs==4.14.8
  mat4py==0.6.0
  modelindex==0.0.2
  model-index==0.1.11
  ordered-set==4.1.0
  importlib-metadata==10.2.0
  lazy-importer==0.1.0
)

log() { printf '[wheels] %s\n' "$*" >&2; }
[ -x "$PY" ] || { log "no python at $PY (make install, or PYTHON=/path/to/python)"; exit 1; }

OUT=$(mkdir -p "$(dirname "$OUT")" && cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")
tmp=$(mktemp -d "$(dirname "$OUT")/.$(basename "$OUT").XXXXXX")
chmod 755 "$tmp"
work=$(mktemp -d)
trap 'rm -rf "$tmp" "$work"' EXIT

pip() { "$PY" -m pip --disable-pip-version-check "$@"; }

log "downloading ${#PINNED[@]} pure-Python wheels for Python 3.12"
pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  -d "$tmp" "${PINNED[@]}"

# mmcv 2.1.0 publishes no wheel for this torch; without its ops it is pure Python. Its setup.py
# names the project mmcv-lite when MMCV_WITH_OPS=0, so the sdist is fetched first (as mmcv) and
# built from the unpacked folder. --no-build-isolation: setup.py imports pkg_resources, which
# the latest setuptools (what an isolated build would get) no longer has; the venv's
# setuptools (< 81, requirements/stack.txt) has it.
log "building mmcv-lite $MMCV_VERSION (MMCV_WITH_OPS=0) from the sdist"
pip download --quiet --no-deps --no-binary :all: --no-build-isolation -d "$work" \
  "mmcv==$MMCV_VERSION"
tar -xzf "$work/mmcv-$MMCV_VERSION.tar.gz" -C "$work"
MMCV_WITH_OPS=0 pip wheel --quiet --no-deps --no-build-isolation -w "$tmp" \
  "$work/mmcv-$MMCV_VERSION"

# checks: pure Python only, one version per project, under the size limit
bad=0
for whl in "$tmp"/*.whl; do
  case "$(basename "$whl")" in
    *-py3-none-any.whl | *-py2.py3-none-any.whl) ;;
    *) log "not a pure-Python wheel (cannot run on the GPU machine's Python 3.12): $(basename "$whl")"; bad=1 ;;
  esac
done
dups=$(for whl in "$tmp"/*.whl; do basename "$whl" | cut -d- -f1 | tr 'A-Z_.' 'a-z--'; done | sort | uniq -d)
[ -z "$dups" ] || { log "two versions of: $dups (pip refuses the whole install)"; bad=1; }
[ "$bad" = 0 ] || exit 1
kib=$(du -sk "$tmp" | cut -f1)
if [ "$kib" -ge $((LIMIT_MIB * 1024)) ]; then
  log "the folder is $((kib / 1024)) MiB, over the $LIMIT_MIB MiB the device tool carries"
  exit 1
fi

# into place in one step (an old folder is moved aside first, then removed)
if [ -e "$OUT" ]; then
  old=$(mktemp -d "$(dirname "$OUT")/.old-$(basename "$OUT").XXXXXX")
  mv "$OUT" "$old/"
  mv "$tmp" "$OUT"
  rm -rf "$old"
else
  mv "$tmp" "$OUT"
fi
ls -l "$OUT" | tail -n +2 | awk '{printf "  %8d  %s\n", $5, $9}'
awk -v out="$OUT" -v n="$(ls "$OUT"/*.whl | wc -l)" -v kib="$kib" -v limit="$LIMIT_MIB" \
  'BEGIN { printf "%s: %d wheels, %d KiB (%.1f MiB; limit %d MiB)\n", out, n, kib, kib / 1024, limit }'
