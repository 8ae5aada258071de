"""The trained demo detectors (and UperNet) end to end, from an image file to the final results:
as trained in eager PyTorch float32 against folded in OpenVINO INT8.

    OMP_NUM_THREADS=1 python benchmarks/demo_end_to_end.py [--only NAME [NAME ...]]
        [--images 20] [--repeat 60] [--no-mmdeploy] [--demo-root DIR]
        [--out benchmarks/results/openvino_demo_end_to_end.json]

Per demo model (benchmarks/demo_models.py), variants that each go from a validation image
file to the data sample a user gets: reading and decoding the file, the config's test pipeline,
the data preprocessor, the model, and the post-processing (NMS, mask pasting, resizing to the
image, argmax). Four are one call of mmdet's ``inference_detector`` (mmseg's
``inference_model``):

- ``trained``: the checkpoint as trained (unfolded), eager PyTorch float32;
- ``folded``: folded (mmrepa.reparameterize), eager PyTorch float32;
- ``openvino_fp32``: folded, OpenVINO float32 computing the backbone (RetinaNet: the whole
  tensor forward, backbone, neck and head), the rest in PyTorch
  (:class:`mmrepa.integrations.quantize.SessionModel`);
- ``openvino_int8``: the same with the INT8 IR that ``tools/quantize.py --backend openvino
  --form folded`` writes (NNCF post-training, calibrated on train images through the config's
  test pipeline); its test metric and the float32 one are benchmarks/quantize_demo_models.py's
  ``openvino`` rows;

two run the whole model in OpenVINO, exported through mmdeploy (``tools/deploy.py`` with the
``*_openvino_static.py`` deploy config: every part, NMS and RoI heads included, in the graph),
and run by mmdeploy's own inference path (the task processor's ``create_input`` and the backend
model's ``test_step``, which post-processes as mmdeploy does):

- ``mmdeploy_fp32``: that IR in float32;
- ``mmdeploy_int8``: that IR quantized by NNCF (``mmrepa.integrations.openvino.quantize_nncf``,
  calibrated as tools/quantize.py does, 64 train images through the config's test pipeline); both
  evaluated here on the whole validation set (``mmrepa.integrations.quantize.config_metric``, as
  tools/quantize.py evaluates), as tools/quantize.py cannot quantize a whole two-stage detector
  or segmentor;

and, to show the part no runtime changes, ``pipeline``: the same call with a model that only runs
the data preprocessor (file, decoding, test pipeline, preprocessing; no network, no
post-processing).

Timed in one process, interleaved (every round runs each variant once on the round's image;
the images cycle), medians; the ratios are what to read on a loaded machine. The results of
each variant on the first image are compared with the trained model's (largest score and box
differences, same labels; class-map pixels that differ). One thread (OMP_NUM_THREADS, default
1) for PyTorch and OpenVINO; the JSON holds the machine (CPU, vector extensions, threads, load
at start and end).
"""

import argparse
import contextlib
import copy
import io
import os
import os.path as osp
import sys
import tempfile

import torch

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from demo_models import (  # noqa: E402
    MODELS,
    ROOT,
    add_demo_root_argument,
    run_tool,
    stamp,
    threads_from_env,
    use_demo_root,
)

# the demo models measured, and whether tools/quantize.py quantizes the whole tensor forward
# (--full: single-stage detectors) or the backbone
DEFAULT = {'retinanet': True, 'mask-rcnn': False, 'upernet': False}
VARIANTS = ('trained', 'folded', 'openvino_fp32', 'openvino_int8')
WHOLE = ('mmdeploy_fp32', 'mmdeploy_int8')
DEPLOY_CFG = {
    'retinanet': 'detection_openvino_static.py',
    'mask-rcnn': 'instance-seg_openvino_static.py',
    'upernet': 'segmentation_openvino_static.py',
}


class PipelineOnly(torch.nn.Module):
    """A model for ``inference_detector`` / ``inference_model`` that stops after the data
    preprocessor: the cost every variant pays before the network."""

    def __init__(self, model):
        super().__init__()
        self.cfg, self.data_preprocessor = model.cfg, model.data_preprocessor

    def test_step(self, batch):
        return self.data_preprocessor(batch, False)['data_samples']


def inference(model):
    """The ecosystem's image-file-to-result call for ``model`` (mmdet or mmseg)."""
    if model.cfg.get('default_scope') == 'mmseg':
        from mmseg.apis import inference_model

        return lambda path: inference_model(model, path)
    from mmdet.apis import inference_detector

    return lambda path: inference_detector(model, path)


def agreement(ref, result) -> dict:
    """How far ``result`` is from ``ref`` (data samples of one image)."""
    if 'pred_sem_seg' in ref:
        a, b = ref.pred_sem_seg.data, result.pred_sem_seg.data
        return dict(pixels=a.numel(), pixels_differing=int((a != b).sum()))
    a, b = ref.pred_instances, result.pred_instances
    out = dict(instances=len(a), instances_other=len(b))
    if len(a) == len(b) and len(a):
        out.update(
            same_labels=bool((a.labels == b.labels).all()),
            max_score_diff=float((a.scores - b.scores).abs().max()),
            max_box_diff_px=float((a.bboxes - b.bboxes).abs().max()),
        )
    return out


def int8_ir(config, ckpt, full: bool, out: str) -> dict:
    """tools/quantize.py --backend openvino on the folded model, no metric, no timing; its
    JSON."""
    dump = osp.splitext(out)[0] + '.json'
    args = [config, ckpt, '--backend', 'openvino', '--form', 'folded', '--no-metric']
    args += ['--repeat', '0', '--out', out, '--dump', dump, *(['--full'] if full else [])]
    return run_tool('quantize.py', args, dump)


def whole_models(name: str, config: str, ckpt: str, calib, tmp: str):
    """tools/deploy.py to OpenVINO, the IR quantized by NNCF; {variant: image path -> result},
    {variant: metric}, tools/deploy.py's report."""
    from mmdeploy.apis.utils import build_task_processor
    from mmdeploy.utils import get_input_shape
    from mmengine.config import Config

    import mmrepa.integrations.mmdeploy  # noqa: F401  (the current OpenVINO backend)
    from mmrepa.integrations.openvino import op_counts, quantize_nncf, read_model, save_ir
    from mmrepa.integrations.quantize import config_metric

    out = osp.join(tmp, f'{name}_deploy')
    deploy_cfg = osp.join(ROOT, 'configs', 'deploy', DEPLOY_CFG[name])
    print(f'{name}: the whole model to OpenVINO (tools/deploy.py), NNCF INT8 ...', flush=True)
    report = run_tool(
        'deploy.py', [config, ckpt, deploy_cfg, '--out', out], osp.join(out, 'report.json')
    )
    deploy_cfg = Config.fromfile(osp.join(out, 'deploy_cfg.py'))
    model_cfg = Config.fromfile(osp.join(out, 'model_cfg.py'))
    xml = {'mmdeploy_fp32': osp.join(out, 'end2end.xml')}
    xml['mmdeploy_int8'] = osp.join(tmp, f'{name}_end2end_int8.xml')
    save_ir(quantize_nncf(read_model(xml['mmdeploy_fp32']), calib), xml['mmdeploy_int8'])
    report['int8_fake_quantize'] = op_counts(xml['mmdeploy_int8']).get('FakeQuantize', 0)
    processor = build_task_processor(model_cfg, deploy_cfg, 'cpu')
    shape = get_input_shape(deploy_cfg)
    calls, metrics = {}, {}
    for k, path in xml.items():
        backend_model = processor.build_backend_model([path], processor.update_data_preprocessor)
        metrics[k] = config_metric(backend_model, model_cfg)

        def call(image, m=backend_model):
            return m.test_step(processor.create_input(image, shape)[0])[0]

        calls[k] = call
    return calls, metrics, report


def measure(name: str, full: bool, args, tmp: str) -> dict:
    from mmrepa import reparameterize
    from mmrepa.apis import init_model
    from mmrepa.integrations.onnx import TensorForward, export_onnx
    from mmrepa.integrations.openvino import OpenVINOSession
    from mmrepa.integrations.quantize import SessionModel, pipeline_inputs
    from mmrepa.utils.latency import time_interleaved

    config, ckpt = MODELS[name].paths()
    xml = osp.join(tmp, f'{name}_int8.xml')
    print(f'{name}: INT8 IR (tools/quantize.py --backend openvino) ...', flush=True)
    quantized = int8_ir(config, ckpt, full, xml)
    trained = init_model(config, ckpt).eval()
    folded = reparameterize(copy.deepcopy(trained))
    images = pipeline_inputs(trained.cfg, trained.data_preprocessor, args.images, 'test')
    # the float32 graph tools/quantize.py quantized: the same module, the same input shape
    onnx_path = osp.join(tmp, f'{name}_fp32.onnx')
    module = TensorForward(folded).eval() if full else folded.backbone
    export_onnx(module, torch.from_numpy(images[0][0]), onnx_path)
    threads = torch.get_num_threads()
    models = dict(
        trained=trained,
        folded=folded,
        openvino_fp32=SessionModel(folded, OpenVINOSession(onnx_path, threads), full),
        openvino_int8=SessionModel(folded, OpenVINOSession(xml, threads), full),
    )
    calls = {k: inference(m) for k, m in models.items()}
    whole = {}
    if args.mmdeploy:
        calib = pipeline_inputs(trained.cfg, trained.data_preprocessor, 64, 'train')
        whole_calls, whole_metrics, deploy_report = whole_models(name, config, ckpt, calib, tmp)
        calls.update(whole_calls)
        whole = dict(
            whole_model_metric=whole_metrics,
            deploy_report={k: v for k, v in deploy_report.items() if 'vs_pytorch' in k},
            whole_model_int8_fake_quantize=deploy_report['int8_fake_quantize'],
        )
    compared = tuple(calls)
    calls['pipeline'] = inference(PipelineOnly(trained))
    paths = [path for _, path in images]
    with torch.no_grad():
        first = {k: calls[k](paths[0]) for k in compared}
    state = dict(n=0)

    def variant(call):
        def run():
            call(paths[state['n'] // len(calls) % len(paths)])
            state['n'] += 1

        return run

    print(f'{name}: timing {", ".join(calls)} interleaved ...', flush=True)
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        stats = time_interleaved(
            {k: variant(c) for k, c in calls.items()}, repeat=args.repeat, warmup=args.warmup
        )
    ms = {k: v.median for k, v in stats.items()}
    return dict(
        model=name,
        what=MODELS[name].what,
        backbone=MODELS[name].backbone,
        config=config,
        checkpoint=ckpt,
        openvino_part='tensor forward (backbone, neck, head)' if full else 'backbone',
        input_shape=list(images[0][0].shape),
        images=len(paths),
        latency_ms={k: dict(median=v.median, min=v.min, max=v.max) for k, v in stats.items()},
        end_to_end=ms['trained'] / ms['openvino_int8'],
        ratios_to_trained={k: ms['trained'] / ms[k] for k in compared},
        int8_vs_openvino_fp32=ms['openvino_fp32'] / ms['openvino_int8'],
        **whole,
        int8_sqnr_db=quantized['sqnr_db'],
        int8_fake_quantize=quantized.get('int8_ops', {}).get('fake_quantize'),
        agreement_with_trained={
            k: agreement(first['trained'], first[k]) for k in compared if k != 'trained'
        },
        **stamp(),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--only', nargs='+', choices=sorted(DEFAULT), default=sorted(DEFAULT))
    parser.add_argument('--images', type=int, default=20, help='validation images cycled')
    parser.add_argument('--repeat', type=int, default=60, help='timed rounds')
    parser.add_argument('--warmup', type=int, default=5, help='untimed rounds first')
    parser.add_argument(
        '--no-mmdeploy',
        dest='mmdeploy',
        action='store_false',
        help='skip the whole models through mmdeploy',
    )
    parser.add_argument(
        '--out',
        default=osp.join(ROOT, 'benchmarks', 'results', 'openvino_demo_end_to_end.json'),
    )
    add_demo_root_argument(parser)
    args = parser.parse_args(argv)
    out = osp.abspath(args.out)
    use_demo_root(args.demo_root)
    os.chdir(args.demo_root)  # where the demo configs' relative data paths point
    from mmrepa.utils.files import write_json
    from mmrepa.utils.machine import finish, machine_info

    threads_from_env()
    machine = machine_info()
    results = dict(machine=machine, models={}, skipped=[])  # models by name, as the other JSONs
    with tempfile.TemporaryDirectory(prefix='mmrepa.e2e.') as tmp:
        for name in args.only:
            if MODELS[name].missing():
                results['skipped'].append(f'{name}: no {", ".join(MODELS[name].missing())}')
                continue
            results['models'][name] = measure(name, DEFAULT[name], args, tmp)
    finish(machine)
    write_json(results, out)
    print(
        '\n| model | OpenVINO runs | trained eager ms | folded eager | OV fp32 | OV INT8 | '
        'mmdeploy OV fp32 | mmdeploy OV INT8 | pipeline only | end to end |\n'
        '|---|---|---|---|---|---|---|---|---|---|'
    )
    for r in results['models'].values():
        cols = (*VARIANTS, *WHOLE, 'pipeline')
        ms = {k: r['latency_ms'].get(k, {}).get('median', float('nan')) for k in cols}
        print(
            f'| {r["backbone"]} {r["what"]} | {r["openvino_part"]} | '
            + ' | '.join(f'{ms[k]:.1f}' for k in cols)
            + f' | {r["end_to_end"]:.2f}x |'
        )
        if 'whole_model_metric' in r:
            print('  whole model metric (mmdeploy):', r['whole_model_metric'])
    for s in results['skipped']:
        print('skipped:', s)
    print(f'wrote {out}')


if __name__ == '__main__':
    main()
