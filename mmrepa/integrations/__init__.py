"""What connects mmrepa's models to tools and runtimes, kept apart from the models: the
command-line helpers of ``tools/`` (:mod:`.cli`), ONNX export (:mod:`.onnx`), INT8 quantization
(:mod:`.quantize`) and mmdeploy's rewrites (:mod:`.mmdeploy`).

``import mmrepa`` imports none of these. Optional packages (onnx, onnxruntime, mmdeploy, ...)
follow one rule, stated in :mod:`.optional`: imported where used, through
:func:`.optional.imported` or after :func:`.optional.require`, both raising
:class:`mmrepa.errors.DependencyError` that names the package and the install command; the
tools turn that into one line and an exit status."""
