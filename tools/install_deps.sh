#!/usr/bin/env bash
# Install mmrepa's pinned stack into the environment of $1 (a python executable).
#
#   tools/install_deps.sh .venv/bin/python [--tests]
#
# Idempotent: what is already installed and working is left alone. mmcv 2.1.0 has no wheel for
# torch 2.14 on PyPI, so it is compiled once per (torch, Python ABI, machine) and cached under
# $MMREPA_CACHE (default ~/.cache/mmrepa). A directory named by $MMREPA_WHEELHOUSE is tried first,
# then ../shared/wheels beside the checkout.
set -euo pipefail

PY=${1:?usage: tools/install_deps.sh PYTHON [--tests]}
WITH_TESTS=${2:-}
# absolute, but without resolving symlinks (a venv's python is a symlink out of the venv)
case "$PY" in
  */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;;
  *) PY=$(command -v "$PY") ;;
esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
MMCV_VERSION=2.1.0
MMDEPLOY_VERSION=1.3.1
NNCF_VERSION=3.4.0
CACHE=${MMREPA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmrepa}

log() { printf '[install] %s\n' "$*" >&2; }

# Everything the steps below install, checked in one interpreter (each step's own check starts
# one: ~20 s in all); prints the versions. Run first (all there: nothing to do) and last.
check_all() {
  local reqs="stack" mmdeploy="" nncf=""
  if [ "$WITH_TESTS" = "--tests" ]; then
    reqs="stack tests docs deploy openvino" mmdeploy=$MMDEPLOY_VERSION nncf=$NNCF_VERSION
  fi
  (cd / && "$PY" - "$ROOT" "$TORCH_VERSION" "$TORCHVISION_VERSION" "$MMCV_VERSION" "$mmdeploy" \
    "$nncf" $reqs <<'EOF'
import os, sys
from importlib.metadata import version
from packaging.requirements import Requirement
root, torch_v, torchvision_v, mmcv_v, mmdeploy_v, nncf_v, *reqs = sys.argv[1:]
pins = dict(torch=torch_v, torchvision=torchvision_v, mmcv=mmcv_v, mmdeploy=mmdeploy_v, nncf=nncf_v)
for name, pin in pins.items():
    if pin and version(name).split('+')[0] != pin:
        sys.exit(f'{name} {version(name)} is not {pin}')
for req in reqs:
    for line in open(f'{root}/requirements/{req}.txt'):
        line = line.split('#')[0].strip()
        if line:
            r = Requirement(line)
            if not r.specifier.contains(version(r.name), prereleases=True):
                sys.exit(f'{line}: {version(r.name)} is installed')
import torch, torchvision
torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
import mmcv, mmcv.ops
from mmcv.ops import RoIAlign, nms
import mmdet, mmengine, mmseg, mmrepa
if os.path.dirname(os.path.dirname(os.path.abspath(mmrepa.__file__))) != root:
    sys.exit(f'mmrepa is installed from {mmrepa.__file__}, not {root}')
print(f'torch {torch.__version__}, mmcv {mmcv.__version__}, mmengine {mmengine.__version__}, '
      f'mmdet {mmdet.__version__}, mmseg {mmseg.__version__}, mmrepa {mmrepa.__version__} '
      f'({mmrepa.__file__})')
EOF
  )
}

if versions=$(check_all 2>/dev/null); then
  log "ok: $versions"
  exit 0
fi
pip_install() { "$PY" -m pip install --disable-pip-version-check "$@"; }
installed() { "$PY" - "$1" "$2" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    v = version(sys.argv[1])
except PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if v.split('+')[0] == sys.argv[2] else 1)
EOF
}

# 1. torch and torchvision, as a matched pair (a +cpu torch beside the standard torchvision
#    fails at import with "operator torchvision::nms does not exist").
if ! installed torch "$TORCH_VERSION" || ! installed torchvision "$TORCHVISION_VERSION"; then
  log "installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
  pip_install "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
fi
if ! "$PY" -c 'import torch, torchvision; torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)' 2>/dev/null; then
  log "torch and torchvision do not work together in this environment:"
  "$PY" -c 'import torch, torchvision' || true
  log "reinstall a matched pair, e.g. pip install --force-reinstall torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
  exit 1
fi

# 2. The rest of the pinned stack.
satisfied() {  # are all requirements in file $1 installed? (pip itself takes ~30 s to say so)
  "$PY" - "$1" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
from packaging.requirements import Requirement
for line in open(sys.argv[1]):
    line = line.split('#')[0].strip()
    if line:
        req = Requirement(line)
        if not req.specifier.contains(version(req.name), prereleases=True):
            sys.exit(1)
EOF
}
for req in stack $([ "$WITH_TESTS" = "--tests" ] && echo tests docs); do
  satisfied "$ROOT/requirements/$req.txt" || pip_install --quiet -r "$ROOT/requirements/$req.txt"
done

# 2b. With --tests: mmdeploy 1.3.1, for tools/deploy.py and tests/integration/test_mmdeploy.py. Its metadata
#     pins protobuf<=3.20.2, which the onnx above cannot run with (pip would refuse, or
#     downgrade protobuf and break onnx); nothing it runs for ONNX Runtime needs that protobuf.
#     So it is installed without dependencies, and requirements/deploy.txt lists the ones it
#     imports that the stack lacks.
if [ "$WITH_TESTS" = "--tests" ]; then
  satisfied "$ROOT/requirements/deploy.txt" || pip_install --quiet -r "$ROOT/requirements/deploy.txt"
  if ! installed mmdeploy "$MMDEPLOY_VERSION"; then
    log "installing mmdeploy==$MMDEPLOY_VERSION without its dependencies (its protobuf<=3.20.2 pin does not fit onnx)"
    pip_install --quiet --no-deps "mmdeploy==$MMDEPLOY_VERSION"
  fi
  # OpenVINO and NNCF (tools/deploy.py's OpenVINO configs, tools/quantize.py --backend openvino);
  # NNCF without the scikit-learn it never imports (requirements/openvino.txt says why)
  satisfied "$ROOT/requirements/openvino.txt" || pip_install --quiet -r "$ROOT/requirements/openvino.txt"
  if ! installed nncf "$NNCF_VERSION"; then
    pip_install --quiet --no-deps "nncf==$NNCF_VERSION"
  fi
fi

# 3. mmcv with compiled ops.
mmcv_ops_ok() { "$PY" -c 'import mmcv, mmcv.ops; from mmcv.ops import nms, RoIAlign' >/dev/null 2>&1; }

try_mmcv_wheel() {  # $1: a directory that may hold a matching wheel
  local dir=$1 whl
  [ -n "$dir" ] && [ -d "$dir" ] || return 1
  for whl in "$dir"/mmcv-"$MMCV_VERSION"-*.whl; do
    [ -f "$whl" ] || continue
    log "trying $whl"
    pip_install --quiet --no-deps --force-reinstall --no-cache-dir "$whl"
    if mmcv_ops_ok; then return 0; fi
    log "its mmcv.ops does not import against this torch; discarding it"
    "$PY" -m pip uninstall --quiet -y mmcv
  done
  return 1
}

build_mmcv() {  # $1: output directory for the wheel
  local out=$1 work tools
  work=$(mktemp -d)
  tools="$CACHE/build-tools/$("$PY" -c 'import sys; print(sys.implementation.cache_tag)')"
  trap 'rm -rf "$work"' RETURN
  # mmcv's setup.py imports pkg_resources (setuptools < 70); keep that old setuptools out of
  # the environment itself by putting it on PYTHONPATH for the build only.
  if [ ! -d "$tools/setuptools" ]; then
    pip_install --quiet --no-cache-dir --no-warn-conflicts --target "$tools" "setuptools<70" wheel ninja
  fi
  log "downloading the mmcv $MMCV_VERSION source release"
  PYTHONPATH="$tools" "$PY" -m pip download --quiet --no-deps --no-binary :all: \
    --no-build-isolation --no-cache-dir -d "$work" "mmcv==$MMCV_VERSION"
  tar -xzf "$work"/mmcv-"$MMCV_VERSION".tar.gz -C "$work"
  # torch >= 2.14 headers need C++20; mmcv 2.1.0 hard-codes -std=c++17.
  sed -i 's/-std=c++17/-std=c++20/g' "$work/mmcv-$MMCV_VERSION/setup.py"
  log "compiling mmcv $MMCV_VERSION with ops (about 12-16 minutes on 2 cores)"
  mkdir -p "$out"
  PATH="$tools/bin:$PATH" PYTHONPATH="$tools" MMCV_WITH_OPS=1 CFLAGS=-g0 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
    "$PY" -m pip wheel --no-build-isolation --no-deps --no-cache-dir -w "$out" "$work/mmcv-$MMCV_VERSION"
}

if installed mmcv "$MMCV_VERSION" && mmcv_ops_ok; then
  :
else
  key=$("$PY" -c 'import platform, sys, torch; print(f"torch{torch.__version__}-{sys.implementation.cache_tag}-{platform.machine()}")')
  wheels="$CACHE/wheels/$key"
  # a wheelhouse beside the checkout (../shared/wheels on the project's machines) is tried after
  # $MMREPA_WHEELHOUSE; any wheel must import mmcv.ops against this torch before it is kept
  if ! try_mmcv_wheel "${MMREPA_WHEELHOUSE:-}" && ! try_mmcv_wheel "$ROOT/../shared/wheels" \
    && ! try_mmcv_wheel "$wheels"; then
    rm -f "$wheels"/mmcv-"$MMCV_VERSION"-*.whl
    build_mmcv "$wheels"
    try_mmcv_wheel "$wheels" || { log "the freshly built mmcv does not import mmcv.ops"; exit 1; }
  fi
fi

# 4. mmrepa itself, editable. (Checked from / so that a checkout in the cwd does not count.)
where=$(cd / && "$PY" -c 'import mmrepa, os; print(os.path.dirname(os.path.dirname(os.path.abspath(mmrepa.__file__))))' 2>/dev/null || true)
if [ "$where" != "$ROOT" ]; then
  pip_install --quiet --no-deps --no-build-isolation -e "$ROOT"
fi
versions=$(check_all) || { log "installed, but the check above still fails"; exit 1; }
log "ok: $versions"
