# mmdet instance segmentation (Mask R-CNN, ...) with mmrepa backbones -> OpenVINO (CPU).
# Inputs, outputs and the static shape as instance-seg_onnxruntime_static.py: the same ONNX graph
# (mmrepa's rewrites apply to both backends), converted by openvino.convert_model to
# end2end.xml / end2end.bin (float32 weights) and run by OpenVINO's CPU plug-in in float32.
# mmdeploy 1.3.1's own OpenVINO backend needs the removed openvino.inference_engine and `mo`;
# importing mmrepa.integrations.mmdeploy (custom_imports) registers a current one in its place.
_base_ = ['./instance-seg_onnxruntime_static.py']

backend_config = dict(type='openvino')
