"""Fold a trained checkpoint offline, for deployment.

    python tools/reparameterize.py CONFIG CHECKPOINT OUT [--force]

OUT holds the folded weights (``state_dict``) and the input's ``meta`` (class names and the
rest of ``dataset_meta``, which mmdet's ``init_detector`` reads) with ``meta.mmrepa.deploy =
True`` added. Load it with the same config and the backbone built folded:

    python tools/test.py CONFIG OUT --cfg-options model.backbone.deploy=True

OUT may not be an input (CHECKPOINT, CONFIG, a file the config reads) or a link to one, even
with --force; it is written atomically (a temporary file beside it, renamed at the end, removed
on an error or SIGTERM) and an existing OUT is refused unless --force is given.
"""

import argparse
import os.path as osp

from mmengine.config import DictAction
from mmengine.runner import load_checkpoint

import mmrepa
from mmrepa.apis import init_model
from mmrepa.checkpoint import save_atomically
from mmrepa.integrations.cli.args import ConfigPath, one_line_errors
from mmrepa.integrations.cli.outputs import guarded_config

TOOL = 'tools/reparameterize.py'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('config', action=ConfigPath)
    parser.add_argument('checkpoint')
    parser.add_argument('out')
    parser.add_argument('--force', action='store_true', help='replace an existing OUT')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(argv)


@one_line_errors(TOOL)
def main(argv=None):
    args = parse_args(argv)
    outputs = [('OUT', args.out)]
    cfg = guarded_config(  # config inputs: e.g. RepOptVGG's scales
        TOOL, outputs, args.config, args.checkpoint, args.cfg_options, args.force
    )
    model = init_model(cfg)
    # loaded here rather than by init_model: the checkpoint's meta is kept
    checkpoint = load_checkpoint(model, args.checkpoint, map_location='cpu', strict=True)
    model.eval()
    mmrepa.reparameterize(model)
    meta = dict(checkpoint.get('meta') or {})
    meta.update(
        mmrepa=dict(deploy=True, version=mmrepa.__version__, source=osp.abspath(args.checkpoint)),
        config=model.cfg.pretty_text,
    )
    save_atomically(dict(meta=meta, state_dict=model.state_dict()), args.out)
    params = sum(p.numel() for p in model.parameters())
    print(
        f'wrote the folded model ({params / 1e6:.2f} M parameters) to {args.out}; load it with '
        f'--cfg-options model.backbone.deploy=True'
    )


if __name__ == '__main__':
    main()
