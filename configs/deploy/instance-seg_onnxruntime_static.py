# mmdet instance segmentation (Mask R-CNN, ...) with mmrepa backbones -> ONNX Runtime.
# Outputs: dets, labels as detection_onnxruntime_static.py, and masks (1, K, 28, 28): the mask
# head's per-box probabilities, pasted into the image by mmdeploy's ONNX Runtime model as mmdet
# does (export_postprocess_mask=False).
_base_ = ['./detection_onnxruntime_static.py']

onnx_config = dict(output_names=['dets', 'labels', 'masks'])
codebase_config = dict(post_processing=dict(export_postprocess_mask=False))
