"""The main job on an embedded default (``make demo``).

1. generate a small COCO-format detection set (``data/demo_shapes``);
2. train a small RePa-Swin RetinaNet on it with ``tools/train.py``;
3. test the checkpoint with ``tools/test.py`` as trained, then with ``--reparam`` (folded, with
   the latency table), and check that folding leaves the bbox mAP unchanged.

Users with COCO / ADE20K run the same tools on the configs in ``configs/``.
"""
import argparse
import json
import os.path as osp
import subprocess
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG = osp.join(ROOT, 'configs', 'demo', 'retinanet_repa_swin_shapes.py')


def run(*args):
    cmd = [sys.executable, *args]
    print('+', ' '.join(osp.relpath(a, ROOT) if osp.isabs(a) else a for a in cmd[1:]),
          flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--config', default=CONFIG,
                        help='demo config (configs/demo/*_shapes.py); default: RePa-Swin')
    parser.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'demo'))
    parser.add_argument('--epochs', type=int, default=None, help='override max_epochs')
    parser.add_argument('--min-map', type=float, default=0.3,
                        help='fail if the trained model does not reach this bbox mAP')
    args = parser.parse_args()

    sys.path.insert(0, ROOT)
    from mmrepa.datasets import make_shapes_coco
    make_shapes_coco(osp.join(ROOT, 'data', 'demo_shapes'))

    n = args.epochs  # the cosine schedule and the checkpoint follow the length
    extra = ['--cfg-options', f'train_cfg.max_epochs={n}', f'train_cfg.val_interval={n}',
             f'param_scheduler.1.end={n}', f'param_scheduler.1.T_max={n}',
             f'default_hooks.checkpoint.interval={n}'] if n else []
    run(osp.join(ROOT, 'tools', 'train.py'), args.config, '--work-dir', args.work_dir, *extra)
    with open(osp.join(args.work_dir, 'last_checkpoint')) as f:
        ckpt = osp.join(args.work_dir, f.read().strip())  # join keeps an absolute path

    results = {}
    for name, flags in (('as trained', []), ('folded', ['--reparam'])):
        out = osp.join(args.work_dir, f'metrics_{"folded" if flags else "trained"}.json')
        run(osp.join(ROOT, 'tools', 'test.py'), args.config, ckpt, '--work-dir', args.work_dir,
            '--dump-metrics', out, *flags)
        with open(out) as f:
            results[name] = json.load(f)

    before = results['as trained']['coco/bbox_mAP']
    after = results['folded']['coco/bbox_mAP']
    print(f'\nbbox mAP as trained: {before:.3f}   folded: {after:.3f}')
    if abs(before - after) > 0.002:
        sys.exit(f'folding changed the mAP by {after - before:+.3f}')
    if before < args.min_map:
        sys.exit(f'the demo detector reached mAP {before:.3f} < {args.min_map}: it did not learn')
    print('demo ok: the detector learned, and the folded model scores the same.')


if __name__ == '__main__':
    main()
