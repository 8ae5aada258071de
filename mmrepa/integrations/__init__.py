"""What connects mmrepa's models to tools and runtimes, kept apart from the models: the
command-line helpers of ``tools/`` (:mod:`.cli`), ONNX export (:mod:`.onnx`), INT8 quantization
(:mod:`.quantize`) and mmdeploy's rewrites (:mod:`.mmdeploy`).

``import mmrepa`` imports none of these. The one rule for optional packages (onnx, onnxruntime,
mmdeploy, ...): a module that needs one checks it with :func:`.optional.require`, which raises
:class:`mmrepa.errors.DependencyError` naming the package and the install command; the tools
turn that into one line and an exit status."""
