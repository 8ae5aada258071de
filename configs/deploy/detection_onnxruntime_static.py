# mmdet detectors (RetinaNet, Faster R-CNN, ...) with mmrepa backbones -> ONNX Runtime.
# Outputs: dets (1, K, 5) = x1, y1, x2, y2, score in the network input's pixels; labels (1, K).
#
# Static shape: mmrepa's window attention computes its window layout (padding, shift,
# partition) from the map size, and the exported graph holds it as constants of the traced
# size. Export with an image of the size you will run (input_shape=[W, H] fixes it).
_base_ = ['./_base_/onnxruntime_static.py']

onnx_config = dict(output_names=['dets', 'labels'])
codebase_config = dict(
    type='mmdet',
    task='ObjectDetection',
    model_type='end2end',
    # used only where the model's test_cfg does not say: its score_thr, nms and max_per_img
    # win (mmrepa.integrations.mmdeploy's RetinaNet, RPN and R-CNN rewrites keep mmdet's post-processing)
    post_processing=dict(
        score_threshold=0.05,
        confidence_threshold=0.005,
        iou_threshold=0.5,
        max_output_boxes_per_class=200,
        pre_top_k=5000,
        keep_top_k=100,
        background_label_id=-1,
    ),
)
