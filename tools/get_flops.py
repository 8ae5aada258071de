"""Parameters and GMACs of a config's model before and after folding.

    python tools/get_flops.py CONFIG [--shape H W] [--checkpoint CKPT] [--json OUT.json]

Counts with mmengine's analysis (one multiply-accumulate = one MAC; attention included unless
``--no-attention-matmuls``): the
backbone alone on a 1 x 3 x H x W tensor, and the whole model's tensor forward on an H x W image
sent through the config's test pipeline (which may resize it, as it does real images). A model
whose joined branches are not joined yet (λ < 1, docs/backbones/depth_rep_vit.md) is counted
folded as it will fold once joined: its structure does not depend on λ.
``--json`` also writes the exact counts (what ``tools/misc/gen_metafiles.py`` reads), atomically;
it may not be an input (the config, the checkpoint) or a link to one.
"""

import argparse
import copy
import os.path as osp

import torch
from mmengine.config import DictAction

import mmrepa
from mmrepa.apis import init_model
from mmrepa.engine.hooks import join_modules
from mmrepa.integrations.cli.args import ConfigPath, one_line_errors
from mmrepa.integrations.cli.batches import add_shape_argument, default_input_shape, pipeline_batch
from mmrepa.integrations.cli.outputs import guarded_config
from mmrepa.utils import complexity, model_complexity
from mmrepa.utils.files import write_json

TOOL = 'tools/get_flops.py'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('config', action=ConfigPath)
    add_shape_argument(parser)
    parser.add_argument('--checkpoint')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    parser.add_argument(
        '--json',
        metavar='OUT.json',
        help='also write the counts (parameters, MACs) to this JSON file',
    )
    parser.add_argument(
        '--no-attention-matmuls',
        action='store_true',
        help="count softmax attention's QK^T and AV products as free (RePaFormer Table 1's way)",
    )
    parser.add_argument(
        '--seed',
        type=int,
        default=0,
        help="seed of the random weights and input (a two-stage detector's "
        'proposals, and so its MACs, depend on the weights)',
    )
    return parser.parse_args(argv)


def to_json(config: str, shape, input_shape, rows: dict) -> dict:
    """The counts of :func:`main` as plain JSON: for ``model`` and ``backbone``, the
    parameters and MACs before and after folding (exact integers)."""
    out = dict(config=config, shape=list(shape), input_shape=list(input_shape))
    for scope, (before, after) in rows.items():
        out[scope] = dict(
            params_before=int(before['params']),
            params_after=int(after['params']),
            macs_before=int(before['macs']),
            macs_after=int(after['macs']),
        )
    return out


@one_line_errors(TOOL)
def main(argv=None):
    """Print the table (and write ``--json``); returns ``{scope: [before, after]}``."""
    args = parse_args(argv)
    cfg = guarded_config(
        TOOL, [('--json', args.json)], args.config, args.checkpoint, args.cfg_options
    )
    torch.manual_seed(args.seed)
    model = init_model(cfg, args.checkpoint)
    shape = tuple(args.shape or default_input_shape(model.cfg))
    folded = copy.deepcopy(model)
    unjoined = [name for name, m in join_modules(folded) if m.current_join_lambda < 1.0]
    if unjoined:  # the structure does not depend on λ; only a joined model folds exactly
        print(
            f'{len(unjoined)} module(s) with joined branches are at λ < 1 (first: '
            f'{unjoined[0]}): counting the network they fold into once joined (λ = 1)'
        )
        for _, module in join_modules(folded):
            module.set_join_lambda(1.0)
    folded = mmrepa.reparameterize(folded)
    attn = not args.no_attention_matmuls
    with torch.no_grad():
        data = model.data_preprocessor(pipeline_batch(model.cfg, shape), False)
        x = torch.randn(1, 3, *shape)
        rows = dict(
            model=[model_complexity(m, data, attn) for m in (model, folded)],
            backbone=[complexity(m.backbone, (x,), attn) for m in (model, folded)],
        )
    print(
        f'{args.config}: backbone on 1x3x{shape[0]}x{shape[1]}; model on a {shape[0]}x'
        f'{shape[1]} image through the test pipeline, input {tuple(data["inputs"].shape)}'
    )
    print(
        f'{"":<10}{"params M before":>16}{"after":>9}{"GMACs before":>14}{"after":>9}{"ratio":>8}'
    )
    for scope, (b, a) in rows.items():
        print(
            f'{scope:<10}{b["params"] / 1e6:>16.2f}{a["params"] / 1e6:>9.2f}'
            f'{b["macs"] / 1e9:>14.2f}{a["macs"] / 1e9:>9.2f}{b["macs"] / a["macs"]:>8.3f}'
        )
    if args.json:
        write_json(to_json(osp.normpath(args.config), shape, data['inputs'].shape, rows), args.json)
    return rows


if __name__ == '__main__':
    main()
