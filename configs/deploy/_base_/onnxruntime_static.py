# What every mmrepa deploy config shares: ONNX for ONNX Runtime, traced for one input size.
#
# mmdeploy 1.3.1 ships no configs in its wheel, so these are written out in full (the keys of
# mmdeploy's configs/_base_/onnx_config.py and backends/onnxruntime.py). mmengine imports
# `custom_imports` when mmdeploy loads the file, so mmrepa's rewrites (mmrepa.integrations.mmdeploy) are
# registered for mmdeploy's own tools/deploy.py too.
custom_imports = dict(
    imports=['mmrepa', 'mmrepa.integrations.mmdeploy'], allow_failed_imports=False
)

onnx_config = dict(
    type='onnx',
    export_params=True,
    keep_initializers_as_inputs=False,
    # 16+: ONNX RoiAlign's half_pixel mode is mmcv's aligned=True exactly; before 16 mmdeploy
    # shifts the boxes instead and ONNX Runtime stretches RoIs under one feature pixel to one
    # pixel, which changes the masks and boxes of small objects (mmdeploy's default is 11)
    opset_version=17,
    save_file='end2end.onnx',
    input_names=['input'],
    output_names=['output'],
    # None: the size the model's test pipeline gives the export image; [W, H] to fix one
    input_shape=None,
    # mmdeploy's extra graph passes need its compiled TorchScript extension (not in the wheel)
    optimize=False,
)
backend_config = dict(type='onnxruntime')
