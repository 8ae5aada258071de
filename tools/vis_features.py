"""The backbone's feature maps on one image before and after folding, and their difference.

    python tools/vis_features.py CONFIG CHECKPOINT IMAGE --out-file OUT.png [--device cpu]
        [--cfg-options KEY=VALUE ...]

The image goes through the config's test pipeline and the model's data preprocessor, as in
testing; the backbone then runs as loaded and folded (``mmrepa.reparameterize`` on a copy).
OUT.png has one row per backbone output: the input image, the output before and after folding
(projected on its first principal component over channels, the same projection for both) and
the largest absolute difference over channels at each position, each panel with its own colour
scale. Prints each output's largest absolute and relative
difference (relative to the largest absolute value before folding). OUT.png may not be an input
(the image, the config, the checkpoint) or a link to one, checked before the model is built; it
is written atomically.
"""

import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))  # the sibling image_demo.py
from image_demo import image_tool_parser, missing_inputs  # noqa: E402  light; the models later


def parse_args(argv=None):
    return image_tool_parser(__doc__.strip().splitlines()[0]).parse_args(argv)


def backbone_input(model, image: str):
    """``image`` through the config's test pipeline (annotation loading left out) and the
    model's data preprocessor: the tensor the backbone sees in testing."""
    from mmengine.dataset import Compose, pseudo_collate

    steps = [
        t
        for t in model.cfg.test_dataloader.dataset.pipeline
        if not t['type'].split('.')[-1].startswith('LoadAnnotations')
    ]
    data = Compose(steps)(dict(img_path=image, img_id=0))
    return model.data_preprocessor(pseudo_collate([data]), False)['inputs']


def compare_outputs(before, after) -> list:
    """Per output: shape, the largest absolute value before, the largest absolute difference
    and that difference relative to the largest value."""
    rows = []
    for b, a in zip(before, after):
        diff = (a - b).abs().max().item()
        scale = b.abs().max().item()
        rows.append(
            dict(
                shape=tuple(b.shape[1:]),
                max_abs=scale,
                max_diff=diff,
                rel_diff=diff / scale if scale > 0 else 0.0,
            )
        )
    return rows


def principal_component(before, after):
    """Both maps (1, C, H, W) projected on the first principal component over channels of
    ``before``: one map each, on the same axis. Norms over channels are no picture of
    LayerNorm-ed outputs (every position has norm ~sqrt(C)); their main direction is."""
    import torch

    x = before[0].flatten(1).T.double()  # (H * W, C)
    mean = x.mean(dim=0)
    _, _, v = torch.linalg.svd(x - mean, full_matrices=False)
    axis = v[0]
    shape = before.shape[-2:]
    return [((m[0].flatten(1).T.double() - mean) @ axis).reshape(shape) for m in (before, after)]


def draw(out_file: str, image, inputs, before, after, rows, title: str) -> None:
    """One row per output: [input image] | before | after | |after - before|."""
    import matplotlib

    matplotlib.use('Agg')  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec

    n = len(before)
    fig = plt.figure(figsize=(15, 3.2 * n + 0.8), dpi=100)
    grid = GridSpec(n, 4, figure=fig)
    ax = fig.add_subplot(grid[:, 0])
    ax.imshow(image)
    ax.set_title(
        f'input {image.shape[1]}x{image.shape[0]}\n(backbone sees '
        f'{inputs.shape[-1]}x{inputs.shape[-2]})',
        fontsize=9,
    )
    ax.axis('off')
    for i, (b, a, row) in enumerate(zip(before, after, rows)):
        c, h, w = row['shape']
        stride = inputs.shape[-1] / w
        pc_before, pc_after = principal_component(b, a)
        panels = (
            (
                pc_before,
                'viridis',
                f'output {i} before folding: {c}x{h}x{w}, stride '
                f'{stride:.0f}\n1st principal component over channels',
            ),
            (pc_after, 'viridis', f'output {i} after folding\n(same projection)'),
            (
                (a[0] - b[0]).abs().amax(dim=0),
                'magma',
                f'|after - before|, max over channels\nmax abs diff {row["max_diff"]:.2e}, '
                f'relative {row["rel_diff"]:.1e}',
            ),
        )
        for j, (values, cmap, label) in enumerate(panels):
            ax = fig.add_subplot(grid[i, j + 1])
            shown = ax.imshow(values.float().cpu().numpy(), cmap=cmap)  # own colour scale
            # tick labels carry their own exponent: a shared '1e-6' above the bar hits the title
            fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.03, format='%.2g')
            ax.set_title(label, fontsize=9)
            ax.axis('off')
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(out_file)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    missing = missing_inputs('vis_features.py', args)
    if missing:  # before the slow imports: a typo is answered at once
        sys.exit('\n'.join(missing))
    from mmrepa.integrations.cli.args import one_line_errors

    # mmrepa's errors (an unreadable image, an output over an input, ...) as one line
    with one_line_errors('tools/vis_features.py'):
        return run(args)


def run(args):
    from mmrepa.integrations.cli.outputs import check_outputs
    from mmrepa.utils.files import atomic_output

    check_outputs(
        'tools/vis_features.py',
        [('--out-file', args.out_file)],
        [('config', args.config), ('checkpoint', args.checkpoint), ('image', args.image)],
    )

    import copy

    import torch

    import mmrepa
    from mmrepa.apis import init_model
    from mmrepa.integrations.cli.args import one_line_errors
    from mmrepa.integrations.cli.inputs import read_image

    image = read_image('tools/vis_features.py', args.image)  # before the model is built

    with one_line_errors('tools/vis_features.py'):
        model = init_model(args.config, args.checkpoint, args.device, args.cfg_options)
        folded = mmrepa.reparameterize(copy.deepcopy(model))
    with torch.no_grad():
        inputs = backbone_input(model, args.image)
        before, after = model.backbone(inputs), folded.backbone(inputs)
    if isinstance(before, torch.Tensor):
        before, after = (before,), (after,)
    rows = compare_outputs(before, after)
    for i, row in enumerate(rows):
        print(
            f'output {i} {"x".join(map(str, row["shape"]))}: max |value| '
            f'{row["max_abs"]:.4g}, max abs diff {row["max_diff"]:.3e}, relative '
            f'{row["rel_diff"]:.3e}'
        )
    with atomic_output(args.out_file) as tmp:  # .tmp.png: matplotlib reads the extension
        draw(
            tmp,
            image,
            inputs,
            before,
            after,
            rows,
            f'{type(model.backbone).__name__} of {osp.basename(args.config)} '
            f'({osp.basename(args.checkpoint)}) before and after folding',
        )
    print(f'wrote {args.out_file}')
    return rows


if __name__ == '__main__':
    main()
