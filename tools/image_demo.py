"""Draw a model's predictions on an image or a folder of images: detections (boxes, and masks if
the model predicts them) for mmdet configs, the segmentation for mmseg configs; the model as
trained, or as tools/deploy.py exported it to ONNX Runtime or OpenVINO.

    python tools/image_demo.py CONFIG CHECKPOINT IMAGE --out-file OUT.png [--reparam]
        [--score-thr 0.3] [--device cpu] [--cfg-options KEY=VALUE ...]
    python tools/image_demo.py CONFIG CHECKPOINT FOLDER --out-dir OUT_DIR [...]
    python tools/image_demo.py DIR IMAGE --out-file OUT.png [--score-thr 0.3]
    python tools/image_demo.py DIR FOLDER --out-dir OUT_DIR [--score-thr 0.3]

A FOLDER's images (its files ending in .jpg, .png, ...; not its subfolders) are drawn one by one
with the model loaded once, each to OUT_DIR/NAME.png (``--out-dir`` takes a single IMAGE too).

The model runs through mmdet's ``inference_detector`` or mmseg's ``inference_model`` (picked by
the config's ``default_scope``) and is drawn with their ``DetLocalVisualizer`` /
``SegLocalVisualizer``. ``--reparam`` folds the model first (``mmrepa.apis.init_model(...,
reparam=True)``): the picture and the printed lines are the same. Prints one line per detection
above ``--score-thr``, or the area of every predicted class.

DIR, the output folder of ``tools/deploy.py CONFIG CHECKPOINT DEPLOY_CFG --out DIR``, takes the
place of CONFIG CHECKPOINT: its model runs in its backend (DIR/end2end.onnx in ONNX Runtime,
DIR/end2end.xml in OpenVINO) through mmdeploy's task processor and backend model, as
tools/deploy.py checked it (:class:`mmrepa.integrations.mmdeploy.deployed.DeployedModel`), and
is drawn and printed as above, with the classes of DIR/folded.pth. The export is static: an image
whose test pipeline (DIR/model_cfg.py's) gives another input size than the traced one is refused
with one line. ``--reparam`` and ``--cfg-options`` do not apply (the model is folded and
configured).

A picture may not be an input (an image, the config, the checkpoint, DIR's files) or a link to
one, nor OUT_DIR the image folder, DIR or a folder holding an input: checked before the model is
built. Each picture is written atomically; OUT_DIR's pictures go to a temporary folder beside it,
moved into OUT_DIR at the end (its other files are kept), so a failed or killed run leaves none
half drawn.
"""

import argparse
import contextlib
import functools
import os
import os.path as osp
import sys
from typing import Callable, NamedTuple

from mmengine.config import DictAction  # light; torch, mmdet and mmseg load after the checks

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')
TOOL = 'tools/image_demo.py'


def image_tool_parser(
    description: str, folders: bool = False, deployed: bool = False
) -> argparse.ArgumentParser:
    """The arguments of the tools that run a model on one image (this one, vis_features.py);
    ``folders``: IMAGE may be a folder, written to ``--out-dir`` (or one image to
    ``--out-file``); ``deployed``: a tools/deploy.py output folder may replace CONFIG
    CHECKPOINT."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        'config',
        help='mmdet or mmseg config file'
        + (', or DIR: a tools/deploy.py output folder, without CHECKPOINT' if deployed else ''),
    )
    parser.add_argument('checkpoint', nargs='?' if deployed else None, help='checkpoint file')
    if folders:
        parser.add_argument('image', help='image file, or a folder of images')
        out = parser.add_mutually_exclusive_group(required=True)
        out.add_argument('--out-file', help='where to write the picture of one IMAGE (PNG)')
        out.add_argument('--out-dir', help='where to write a picture (NAME.png) per image')
    else:
        parser.add_argument('image', help='image file')
        parser.add_argument('--out-file', required=True, help='where to write the picture (PNG)')
    parser.add_argument('--device', default='cpu', help='e.g. cpu, cuda:0')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config entries, e.g. model.test_cfg.score_thr=0.1',
    )
    return parser


def missing_inputs(tool: str, args, folders: bool = False) -> list:
    """One line per input file that does not exist (``folders``: the image may be a folder, and
    a tools/deploy.py output folder replace CONFIG CHECKPOINT)."""
    hint = ''
    if args.checkpoint is not None and not osp.isfile(args.config):
        from mmrepa.config.paths import find_config  # mmrepa, torch: slow

        try:  # a config path from before the configs moved into folders
            args.config = find_config(args.config)
        except FileNotFoundError as err:
            hint = str(err).partition(': no such config file')[2]
    model = [('config', args.config, osp.isfile), ('checkpoint', args.checkpoint, osp.isfile)]
    if folders and args.checkpoint is None:  # DIR IMAGE
        if osp.isfile(args.config):
            return [f'{tool}: no CHECKPOINT after the config {args.config}']
        model = [('tools/deploy.py output folder', args.config, osp.isdir)]
    image = ('image', args.image, lambda p: osp.isfile(p) or folders and osp.isdir(p))
    return [
        f'{tool}: {what} not found: {path}' + (hint if what == 'config' else '')
        for what, path, found in (*model, image)
        if not found(path)
    ]


def image_files(args) -> list:
    """(image, picture to write) of the IMAGE argument: the file, or the images of the folder."""
    if osp.isfile(args.image):
        if args.out_file:
            return [(args.image, args.out_file)]
        images = [args.image]
    elif args.out_file:
        sys.exit(f'image_demo.py: {args.image} is a folder: write its pictures with --out-dir')
    else:
        images = sorted(
            osp.join(args.image, f)
            for f in os.listdir(args.image)
            if f.lower().endswith(IMAGE_EXTENSIONS) and osp.isfile(osp.join(args.image, f))
        )
        if not images:
            sys.exit(f'image_demo.py: no image ({", ".join(IMAGE_EXTENSIONS)}) in {args.image}')
    stems = [osp.splitext(osp.basename(i))[0] for i in images]
    names = [stem if stems.count(stem) == 1 else osp.basename(i) for i, stem in zip(images, stems)]
    pairs = [(image, osp.join(args.out_dir, name + '.png')) for image, name in zip(images, names)]
    drawn = {}
    for image, out in pairs:  # a.jpg and a.png give a.jpg.png and a.png.png: so does a.jpg.png
        if out in drawn:
            sys.exit(
                f'image_demo.py: {drawn[out]} and {image} would both be drawn to {out}; '
                'rename one of them or draw them apart'
            )
        drawn[out] = image
    return pairs


def parse_args(argv=None):
    parser = image_tool_parser(__doc__.split('\n\n')[0], folders=True, deployed=True)
    parser.add_argument('--reparam', action='store_true', help='fold the model first')
    parser.add_argument(
        '--score-thr',
        type=float,
        default=0.3,
        help='detections: draw and print those scoring above this',
    )
    return parser.parse_args(argv)


def print_detections(result, classes, score_thr: float) -> None:
    """One line per detection scoring above ``score_thr`` (the visualizer's criterion)."""
    pred = result.pred_instances
    keep = (pred.scores > score_thr).nonzero().flatten().tolist()
    print(f'{len(keep)} detection(s) with score > {score_thr} (of {len(pred.scores)})')
    masks = pred.get('masks')
    for i in keep:
        label = int(pred.labels[i])
        name = classes[label] if label < len(classes) else f'class_{label}'
        x0, y0, x1, y1 = (float(v) for v in pred.bboxes[i])
        line = (
            f'{name:<16} score {float(pred.scores[i]):.3f}  box '
            f'{x0:7.1f} {y0:7.1f} {x1:7.1f} {y1:7.1f}'
        )
        if masks is not None:
            line += f'  mask {int(masks[i].sum())} px'
        print(line)


def print_class_areas(result, classes, top: int = 20) -> None:
    """The predicted classes by area, largest first (the ``top`` largest, then the rest)."""
    import torch

    seg = result.pred_sem_seg.data.flatten().long()
    counts = torch.bincount(seg, minlength=len(classes))
    order = [int(i) for i in counts.argsort(descending=True) if counts[i] > 0]
    total = seg.numel()
    print(f'{len(order)} class(es) predicted on {total} pixels')
    for i in order[:top]:
        name = classes[i] if i < len(classes) else f'class_{i}'
        print(f'{name:<20} {100 * counts[i] / total:5.1f} %  ({int(counts[i])} px)')
    if len(order) > top:
        rest = int(sum(counts[i] for i in order[top:]))
        print(f'... {len(order) - top} more class(es), {100 * rest / total:.1f} % together')


class Predictor(NamedTuple):
    """What the pictures need of a model: its scope ('mmdet' or 'mmseg'), class names and
    palette, image path -> data sample, and how it is named."""

    scope: str
    dataset_meta: dict
    predict: Callable
    name: str


def main(argv=None):
    args = parse_args(argv)
    missing = missing_inputs('image_demo.py', args, folders=True)
    if missing:  # before the slow imports: a typo is answered at once
        sys.exit('\n'.join(missing))
    if args.checkpoint is None and (args.reparam or args.cfg_options):
        sys.exit(
            'image_demo.py: --reparam and --cfg-options are for CONFIG CHECKPOINT; the model of '
            f'{args.config} (tools/deploy.py) is folded and configured'
        )
    from mmrepa.integrations.cli.args import one_line_errors

    # mmrepa's errors (an unreadable image, an output over an input, ...) as one line
    with one_line_errors(TOOL):
        return run(args)


def model_inputs(args) -> list:
    """(what, path) of the files the model is read from."""
    if args.checkpoint is not None:
        return [('config', args.config), ('checkpoint', args.checkpoint)]
    from mmrepa.integrations.mmdeploy.deployed import deployed_files

    files = deployed_files(args.config)[1]
    return [
        ('tools/deploy.py output folder', args.config),
        *(('tools/deploy.py output file', path) for path in files),
    ]


def run(args):
    images = image_files(args)
    from mmrepa.integrations.cli.args import one_line_errors
    from mmrepa.integrations.cli.outputs import check_outputs
    from mmrepa.utils.files import atomic_folder, atomic_output

    check_outputs(
        TOOL,
        [('--out-file', args.out_file), ('--out-dir', args.out_dir, True)],
        [
            *model_inputs(args),
            ('image' if osp.isfile(args.image) else 'image folder', args.image),
            *(('image', image) for image, _ in images),
        ],
    )
    with one_line_errors(TOOL):
        predictor = (pytorch_model if args.checkpoint else deployed_model)(args)
    visualizer = make_visualizer(predictor)
    with contextlib.ExitStack() as stack:
        folder = args.out_dir and stack.enter_context(atomic_folder(args.out_dir, replace=False))
        for path, out_file in images:
            if len(images) > 1:
                print(f'{path}:')
            with atomic_output(
                osp.join(folder, osp.basename(out_file)) if folder else out_file
            ) as tmp:
                draw_predictions(predictor, visualizer, path, tmp, args.score_thr)
            print(f'wrote {out_file} ({predictor.name})')


def pytorch_model(args) -> Predictor:
    from mmrepa.apis import init_model

    model = init_model(
        args.config, args.checkpoint, args.device, args.cfg_options, reparam=args.reparam
    )
    scope = model.cfg.get('default_scope')
    if scope not in ('mmdet', 'mmseg'):
        sys.exit(
            f'{args.config}: default_scope is {scope!r}; image_demo.py draws mmdet and '
            'mmseg models only'
        )
    if scope == 'mmdet':
        from mmdet.apis import inference_detector as inference
    else:
        from mmseg.apis import inference_model as inference
    name = f'{"folded" if args.reparam else "as trained"} model'
    return Predictor(scope, model.dataset_meta, functools.partial(inference, model), name)


def deployed_model(args) -> Predictor:
    """The model of a tools/deploy.py output folder, in its backend."""
    from mmrepa.integrations.mmdeploy.deployed import DeployedModel

    model = DeployedModel(args.config, args.device, tool=TOOL)
    scope = model.model_cfg.get('default_scope')  # mmdet or mmseg: what tools/deploy.py exports
    return Predictor(scope, model.dataset_meta, model, f'folded model in {model.backend}')


def make_visualizer(predictor: Predictor):
    """mmdet's or mmseg's visualizer, with the model's classes and palette."""
    meta = predictor.dataset_meta
    if predictor.scope == 'mmdet':
        from mmdet.visualization import DetLocalVisualizer

        visualizer = DetLocalVisualizer(name='image_demo')
        visualizer.dataset_meta = meta
    else:
        from mmseg.visualization import SegLocalVisualizer

        visualizer = SegLocalVisualizer(name='image_demo', alpha=0.5)
        visualizer.dataset_meta = dict(classes=meta['classes'], palette=meta['palette'])
    return visualizer


def draw_predictions(
    predictor: Predictor, visualizer, path: str, out_file: str, score_thr: float
) -> None:
    """Run the model on the image at ``path``, print what it predicts, draw it to
    ``out_file``."""
    from mmrepa.integrations.cli.inputs import read_image

    image = read_image(TOOL, path)  # not an image: one line, no cv2 traceback
    classes = predictor.dataset_meta['classes']
    result = predictor.predict(path)
    if predictor.scope == 'mmdet':
        print_detections(result, classes, score_thr)
        visualizer.add_datasample(
            'image', image, result, draw_gt=False, pred_score_thr=score_thr, out_file=out_file
        )
    else:
        print_class_areas(result, classes)
        visualizer.add_datasample(
            'image', image, result, draw_gt=False, with_labels=True, out_file=out_file
        )


if __name__ == '__main__':
    main()
