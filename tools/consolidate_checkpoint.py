"""Consolidate a sharded checkpoint (FoldableFSDPStrategy) into an ordinary one.

    python tools/consolidate_checkpoint.py SHARDED_DIR OUT [--force]

SHARDED_DIR is what a sharded run saved (``work_dir/iter_N.pth/`` with ``rank0.pth``,
``rank1.pth``, ...). OUT holds the whole weights (``state_dict``) and the run's ``meta``, the
layout of a single-process run's checkpoint: ``tools/test.py``, ``tools/reparameterize.py`` and
the other tools read it, and ``load_from`` starts a run (sharded or not) from it. The optimizer
state is left out: resume a sharded run from SHARDED_DIR itself. Every rank file must be there
and the pieces must cover every parameter exactly once. OUT may not be inside SHARDED_DIR; it
is written atomically and an existing OUT is refused unless --force is given. A step that runs
longer than 30 s says so every 30 s.
"""

import argparse
import os.path as osp

import mmrepa  # noqa: F401  registers the checkpoint schemes and the allow-list
from mmrepa.checkpoint import save_atomically
from mmrepa.checkpoint.sharded import consolidate
from mmrepa.errors import ConfigError
from mmrepa.integrations.cli.args import one_line_errors
from mmrepa.utils.progress import step

TOOL = 'tools/consolidate_checkpoint.py'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('sharded', metavar='SHARDED_DIR')
    parser.add_argument('out', metavar='OUT')
    parser.add_argument('--force', action='store_true', help='replace an existing OUT')
    return parser.parse_args(argv)


@one_line_errors(TOOL)
def main(argv=None):
    args = parse_args(argv)
    out, folder = osp.realpath(args.out), osp.realpath(args.sharded)
    if out == folder or out.startswith(folder + osp.sep):
        raise ConfigError(
            f'OUT {args.out} is inside SHARDED_DIR {args.sharded}; write it elsewhere'
        )
    if osp.exists(args.out) and not args.force:
        raise ConfigError(f'OUT {args.out} exists; pass --force to replace it')
    with step(TOOL, f'reading the rank files of {args.sharded}'):
        checkpoint = consolidate(args.sharded)
    with step(TOOL, f'writing {args.out}'):
        save_atomically(checkpoint, args.out)
    numel = sum(v.numel() for v in checkpoint['state_dict'].values())
    print(
        f'wrote {len(checkpoint["state_dict"])} tensors ({numel / 1e6:.2f} M values) to {args.out}'
    )


if __name__ == '__main__':
    main()
