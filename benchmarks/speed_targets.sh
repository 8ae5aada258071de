#!/usr/bin/env bash
# The measurements behind the README's speed table (issue "Speed"): CPU, fp32, random weights.
#   PYTHON=.venv/bin/python bash benchmarks/speed_targets.sh [OUT_DIR]
# Each line writes one JSON (tools/benchmark.py / benchmarks/train_step.py). Run it on an
# otherwise idle machine: about 45 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-benchmarks/results}
REPEAT=${REPEAT:-5}
mkdir -p "$OUT"
# a result already in OUT_DIR is kept (delete it to measure again)
bench() {
  name=$1; shift
  [ -f "$OUT/$name.json" ] ||
    "$PY" tools/benchmark.py "$@" --repeat "$REPEAT" --out "$OUT/$name.json"
}

# backbones at 1x3x800x1333, speed-up vs the GMACs ratio; whole detectors' test_step, batch 1
bench retinanet_repa_swin_b configs/repa_swin/retinanet_repa_swin_b_1x_coco.py
bench mask-rcnn_repa_swin_b configs/repa_swin/mask-rcnn_repa_swin_b_1x_coco.py
bench upernet_repa_swin_b configs/repa_swin/upernet_repa_swin_b_512x512_160k_ade20k.py
bench repa_swin_t_backbone configs/repa_swin/retinanet_repa_swin_t_1x_coco.py --backbone-only
bench repa_caformer_m36_backbone configs/metaformer/cascade-mask-rcnn_repa_caformer_m36_ms-3x_coco.py \
    --backbone-only
bench caformer_m36_backbone configs/metaformer/cascade-mask-rcnn_caformer_m36_ms-3x_coco.py --backbone-only
# folding PRepBN saves no MACs, only norm passes: more rounds to see it through the noise
REPEAT=11 bench prepbn_swin_t_backbone configs/prepbn_swin/retinanet_prepbn_swin_t_1x_coco.py --backbone-only
REPEAT=11 OMP_NUM_THREADS=1 bench prepbn_swin_t_backbone_1thread \
    configs/prepbn_swin/retinanet_prepbn_swin_t_1x_coco.py --backbone-only
# throughput at 224x224, batch 16 (RePaFormer Table 1)
bench repa_swin_b_224_b16 configs/repa_swin/retinanet_repa_swin_b_1x_coco.py --shape 224 224 --batch 16 \
    --backbone-only
# training step of RePa-Swin-T against mmdet's Swin-T
[ -f "$OUT/train_step_tiny.json" ] ||
  "$PY" benchmarks/train_step.py --arch tiny --repeat 11 --out "$OUT/train_step_tiny.json"
