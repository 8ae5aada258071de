# mmseg segmentors (UperNet, ...) with mmrepa backbones -> ONNX Runtime.
# Output: the class map (1, 1, H, W) of the input size (with_argmax=True); with_argmax=False
# exports the logits (1, num_classes, H, W) instead.
#
# Static shape: UperNet's pyramid pooling windows, and the window layout of mmrepa's window
# attention, are computed from the map sizes and exported as constants of the traced size.
_base_ = ['./_base_/onnxruntime_static.py']

codebase_config = dict(type='mmseg', task='Segmentation', with_argmax=True)
