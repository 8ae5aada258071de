"""What the tests share: the repository's paths, running a tool (as a subprocess or in this
process), small models and random weights, and the independent reference implementations that
more than one test module checks against. Test modules import from here, never from each other;
fixtures live in conftest.py."""

import contextlib
import glob
import importlib.util
import io
import json
import math
import os
import os.path as osp
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from PIL import Image
from torch.nn.modules.batchnorm import _BatchNorm
from torch.overrides import TorchFunctionMode

from mmrepa.apis import build_model, load_config
from mmrepa.backbones import RepOptVGG
from mmrepa.backbones.repopt_vgg.blocks import _random_kernel

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'configs', 'demo', 'retinanet_repa_swin_shapes.py')

# --------------------------------------------------------------------------- models, weights

# A small RePa-Swin that still has every structural feature (shifted blocks, 4 stages).
TINY_ARCH = dict(embed_dims=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4))


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights everywhere and non-trivial BN statistics, so no fold term is invisible."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        for m in model.modules():
            if isinstance(m, _BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) * 1.5 + 0.25)
                if m.weight is not None:
                    m.weight.copy_(1 + torch.randn(m.weight.shape, generator=g) * 0.2)
    return model


def max_abs_diff(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(max_abs_diff(x, y) for x, y in zip(a, b))
    return (a - b).abs().max().item()


# the MetaFormer and RepOpt-VGG counterparts of TINY_ARCH: same structure, small widths;
# MetaFormer's stages 3-4 stay multiples of CAFormer's head_dim 32 (RepOpt-VGG's: test_repopt_vgg's)
METAFORMER_TINY = dict(depths=(1, 1, 2, 1), dims=(16, 32, 64, 96))
REPOPT_VGG_TINY = dict(depths=(2, 2, 2, 1), widths=(8, 16, 16, 32), stem_width=8)


def csla_model_like(target, generator_seed):
    """A CSLA model with the target's constants and the K0, P0 the target's rule of
    initialization draws from the same seed."""
    csla = RepOptVGG(REPOPT_VGG_TINY, mode='csla', scales=target_scales(target))
    g = torch.Generator().manual_seed(generator_seed)
    with torch.no_grad():
        for layer in csla.layers().values():
            layer.conv.weight.copy_(_random_kernel(layer.conv.weight.shape, 'torch', g))
            layer.conv_1x1.weight.copy_(_random_kernel(layer.conv_1x1.weight.shape, 'torch', g))
    return csla


def target_scales(target):
    out = {}
    for name, m in target.layers().items():
        out[f'{name}.scale_conv.weight'] = m.scale_conv.clone()
        out[f'{name}.scale_1x1.weight'] = m.scale_1x1.clone()
        if m.has_identity:
            out[f'{name}.scale_identity.weight'] = m.scale_identity.clone()
    return out


def random_scales(model, seed):
    g = torch.Generator().manual_seed(seed)
    scales = {}
    for name, m in model.layers().items():
        for key in ('scale_conv', 'scale_1x1', 'scale_identity')[: 3 if m.has_identity else 2]:
            v = torch.randn(m.out_channels, generator=g)
            v[0] = 0.0 if key == 'scale_1x1' else v[0]
            scales[f'{name}.{key}.weight'] = v
    return scales


def _feature_users(model_cfg):
    """(config dict, indices into the backbone outputs) of what reads the backbone's features:
    the neck (all outputs, in order), or the decode / auxiliary heads (their ``in_index``)."""
    if model_cfg.type.endswith('ImageClassifier'):  # on the last output, maybe pooled
        return [(model_cfg.head, -1)]
    if model_cfg.get('neck'):
        return [(model_cfg.neck, None)]
    users = []
    for key in ('decode_head', 'auxiliary_head'):
        heads = model_cfg.get(key) or []
        for head in heads if isinstance(heads, list) else [heads]:
            users.append((head, head.get('in_index', -1)))
    return users


def feature_channels(model_cfg):
    """The backbone output channels the neck / heads of ``model_cfg`` are configured for."""
    return [user.in_channels for user, _ in _feature_users(model_cfg)]


def set_feature_channels(model_cfg, outputs):
    """Make the neck / heads take ``outputs`` (channels of each backbone output)."""
    for user, index in _feature_users(model_cfg):
        user.in_channels = (
            outputs[-1]
            if index is None and isinstance(user.in_channels, int)
            else list(outputs)
            if index is None
            else [outputs[i] for i in index]
            if isinstance(index, (list, tuple))
            else outputs[index]
        )


def backbone_outputs(backbone):
    return [backbone.num_features[i] for i in backbone.out_indices]


def config_paths():
    """Every config file under configs/, in its folders."""
    return sorted(glob.glob(osp.join(ROOT, 'configs', '**', '*.py'), recursive=True))


# -------------------------------------------------------------------------------- data, configs


def shapes_cfg_options(data: str) -> list:
    """``--cfg-options`` that point the demo detector config at a generated shapes set in
    ``data`` (ending in '/'), without worker processes; an untrained detector still detects."""
    options = []
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        options += [
            f'{loader}.dataset.data_root={data}',
            f'{loader}.num_workers=0',
            f'{loader}.persistent_workers=False',
        ]
    for ev in ('val_evaluator', 'test_evaluator'):
        options.append(f'{ev}.ann_file={data}annotations/val.json')
    options.append('model.test_cfg.score_thr=0.0')
    return options


def demo_cfg(data_root, work_dir, **overrides):
    cfg = load_config(DEMO)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = data_root
        cfg[loader].num_workers = 0
        cfg[loader].persistent_workers = False
    cfg.train_dataloader.batch_size = 4
    for ev in ('val_evaluator', 'test_evaluator'):
        cfg[ev].ann_file = osp.join(data_root, 'annotations/val.json')
    cfg.work_dir = work_dir
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=2, val_interval=1)
    cfg.param_scheduler = []
    cfg.default_hooks.logger.interval = 1
    cfg.randomness = dict(seed=0, deterministic=True)
    cfg.merge_from_dict(overrides)
    return cfg


CLASSES = 3  # of write_images' data set
ITERS = 4  # tiny_classifier_config's training


def write_images(root: str, count: int = 6) -> str:
    """``root/{train,val}/class_k/*.png``: the folder layout mmpretrain's CustomDataset reads."""
    rng = np.random.default_rng(0)
    for split in ('train', 'val'):
        for i in range(count):
            folder = osp.join(root, split, f'class_{i % CLASSES}')
            os.makedirs(folder, exist_ok=True)
            pixels = rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(osp.join(folder, f'{i}.png'))
    return root


def tiny_classifier_config(base: str, arch: dict, data: str, path: str) -> str:
    """A config that inherits ``configs/<base>`` with a tiny backbone, a few generated images,
    ``ITERS`` iterations and one checkpoint; everything else (recipe, hooks, sync_bn) as is."""
    cfg = Config.fromfile(osp.join(ROOT, 'configs', base))
    cfg.model.backbone.arch = arch
    tiny = build_model(cfg).backbone
    stage = tiny.out_indices[-1]
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='RandomResizedCrop', scale=32),
        dict(type='PackInputs'),
    ]
    test_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='ResizeEdge', scale=32),
        dict(type='CenterCrop', crop_size=32),
        dict(type='PackInputs'),
    ]

    def loader(split, steps):
        # training is by iteration: an InfiniteSampler, since mmengine's iteration loop sleeps
        # 2 s each time another sampler's epoch ends (every iteration or two here)
        sampler = 'InfiniteSampler' if split == 'train' else 'DefaultSampler'
        return dict(
            _delete_=True,
            batch_size=4,
            num_workers=0,
            sampler=dict(type=sampler, shuffle=split == 'train'),
            dataset=dict(type='CustomDataset', data_root=data, data_prefix=split, pipeline=steps),
        )

    hooks = [
        dict(h, num_batches=2) if h['type'] == 'BNRecalibrationHook' else h
        for h in cfg.get('custom_hooks', [])
    ]
    overrides = dict(
        model=dict(
            backbone=dict(arch=dict(arch, _delete_=True)),
            head=dict(num_classes=CLASSES, in_channels=tiny.num_features[stage]),
        ),
        data_preprocessor=dict(num_classes=CLASSES),
        train_dataloader=loader('train', pipeline),
        val_dataloader=loader('val', test_pipeline),
        test_dataloader=loader('val', test_pipeline),
        val_evaluator=dict(type='Accuracy', topk=(1,)),
        test_evaluator=dict(type='Accuracy', topk=(1,)),
        train_cfg=dict(
            _delete_=True, type='IterBasedTrainLoop', max_iters=ITERS, val_interval=ITERS
        ),
        param_scheduler=[dict(type='ConstantLR', factor=1.0, by_epoch=False)],
        default_hooks=dict(
            checkpoint=dict(by_epoch=False, interval=ITERS), logger=dict(interval=1)
        ),
        custom_hooks=hooks,
        auto_scale_lr=dict(enable=False),
    )
    with open(path, 'w') as f:
        f.write(f'_base_ = {osp.join(ROOT, "configs", base)!r}\n')
        for key, value in overrides.items():
            f.write(f'{key} = {value!r}\n')
    return path


def _memoize_external_config_paths():
    """mmengine resolves a ``mmdet::``/``mmseg::``/... base config by parsing every metafile of
    the package's model index (thousands of YAML files, ~0.35 s) on every lookup, and a base
    config (no metafile entry) by catching the ValueError of that lookup. Both outcomes are the
    same each time within a run (the installed packages do not change): memoized in this
    process, the ValueError raised again (a new one, same message) for a name not in the index.
    In-process config loads (~100 in the test_configs_<group>.py files) read each package's
    index once."""
    from mmengine.config import config

    lookup = config._get_external_cfg_path
    if getattr(lookup, '_memoized', False):
        return
    outcomes = {}

    def memoized(package_path, cfg_file):
        key = (package_path, cfg_file)
        if key not in outcomes:
            try:
                outcomes[key] = (True, lookup(package_path, cfg_file))
            except ValueError as e:
                outcomes[key] = (False, str(e))
        ok, value = outcomes[key]
        if not ok:
            raise ValueError(value)
        return value

    memoized._memoized = True
    config._get_external_cfg_path = memoized


def _memoize_config_files():
    """``Config.fromfile`` parses a config and each of its bases (``mmdet::`` ones included)
    by executing a copy of each file: ~0.15 s for a demo config, paid again on every load
    (the hostile-checkpoint tests alone load the demo config 115 times). The parse of a file is
    kept by its path and the environment, with the files it read (itself and its bases, each
    with its size, times and inode): a parse is used again only while none of them changed, and
    handed out as a deep copy, so a test that writes or appends to a config or one of its bases
    gets the new contents."""
    import copy

    from mmengine.config import Config

    parse = Config._file2dict
    if getattr(parse, '_memoized', False):
        return
    parsed = {}  # key -> (the files read with their stamps, the parse)
    reading = []  # the files of the parses under way, innermost last

    def stamp(path):
        st = os.stat(path)
        return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino

    def memoized(
        filename, use_predefined_variables=True, use_environment_variables=True, lazy_import=None
    ):
        path = osp.abspath(filename)
        flags = (use_predefined_variables, use_environment_variables, lazy_import)
        key = (path, flags, frozenset(os.environ.items()))
        hit = parsed.get(key)
        if hit is None or any(stamp(p) != s for p, s in hit[0].items()):
            files = {path: stamp(path)}
            reading.append(files)
            try:
                hit = parsed[key] = (files, parse(filename, *flags))
            finally:
                reading.pop()
        for outer in reading:  # a config being parsed depends on this base and its bases
            outer.update(hit[0])
        return copy.deepcopy(hit[1])

    memoized._memoized = True
    Config._file2dict = staticmethod(memoized)


def memoize_config_parsing():
    """Both memos above, in this process (the test workers; the FSDP launch's ranks)."""
    _memoize_external_config_paths()
    _memoize_config_files()


# ----------------------------------------------------------------------------- running a tool


def run(*cmd, ok=True, cwd=ROOT, env=None):
    """Run a command as a user would (from the repository root unless ``cwd``); assert that it
    succeeded (``ok``) or failed; return its output (standard output, then error)."""
    proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, env=env)
    log = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == ok, log[-4000:]
    return log


def run_tool(*args, ok=True, cwd=ROOT, env=None):
    """``python ARGS`` (a script and its arguments), as ``run`` runs a command."""
    return run(sys.executable, *args, ok=ok, cwd=cwd, env=env)


def tool_process(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    """``python ARGS`` from ``cwd``, whatever its exit code: for checks of the exit code and of
    what goes to standard error."""
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True)


def assert_no_warnings(stderr: str):
    """Nothing on standard error is a Python warning. mmengine's ``pkg_resources`` import used
    to warn twice in every tool that reads a config (mmrepa.seams, item 0)."""
    assert not [line for line in stderr.splitlines() if 'Warning' in line], stderr[-3000:]


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def own_script(package: str, tool: str = 'test') -> str:
    """``tools/TOOL.py`` as the package ships it (``<package>/.mim/tools/TOOL.py``), the script
    ``mim TOOL`` runs."""
    module = __import__(package)
    script = osp.join(osp.dirname(module.__file__), '.mim', 'tools', f'{tool}.py')
    assert osp.exists(script), script
    return script


def written_metrics(work_dir: str) -> dict:
    """The metrics the runner's logger wrote for a test run in ``work_dir``
    (``<work_dir>/<timestamp>/<timestamp>.json``)."""
    files = glob.glob(osp.join(work_dir, '*', '*.json'))
    assert len(files) == 1, files
    with open(files[0]) as f:
        return json.load(f)


_SCRIPTS = {}


def script_module(script: str):
    """The script (``tools/train.py``, or a package's ``.mim/tools/test.py``) as a module, loaded
    once per process; its ``if __name__ == '__main__'`` block does not run."""
    path = osp.join(ROOT, script)
    if path not in _SCRIPTS:
        name = '_script_' + osp.splitext(osp.relpath(path, ROOT))[0].replace(os.sep, '_')
        spec = importlib.util.spec_from_file_location(name.replace('.', '_'), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SCRIPTS[path] = module
    return _SCRIPTS[path]


def _managed_classes() -> list:
    """mmengine's process-wide named instances live in each ManagerMixin class (MMLogger,
    MessageHub, Visualizer and the libraries' visualizers): a tool run in this process leaves
    its own there, and the next run's hooks would take them as current."""
    from mmengine.utils import ManagerMixin

    classes, stack = [], [ManagerMixin]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in classes:
                classes.append(sub)
                stack.append(sub)
    return classes


@contextlib.contextmanager
def fresh_mmengine_instances():
    """Drop the named instances (loggers, with their handlers closed, message hubs,
    visualizers) created inside, so nothing after finds them as current."""
    from mmengine.logging import MMLogger

    before = {cls: set(cls._instance_dict) for cls in _managed_classes()}
    try:
        yield
    finally:
        for cls in _managed_classes():
            for name in set(cls._instance_dict) - before.get(cls, set()):
                instance = cls._instance_dict.pop(name, None)  # a dict may be inherited
                if isinstance(instance, MMLogger):
                    for handler in instance.handlers:
                        handler.close()


def run_script_here(script: str, *args, ok: bool = True, cwd: str = ROOT):
    """``python SCRIPT ARGS`` from ``cwd`` (the repository root) as ``run_tool`` runs it, but in
    this process, without the interpreter start and the imports (torch, mmengine, mmdet, ...) a
    subprocess pays: the script's ``main()`` with ``sys.argv`` as the interpreter sets it, its
    standard output and error captured. Asserts it succeeded (``ok``) or stopped with an error,
    as ``run_tool`` asserts the exit code; returns (what ``main`` returned, the output, with the
    message of a stop at the end).

    For tests whose point is what a tool computes, not its process; a check of what a user sees
    at the command line keeps a subprocess. Restored after the call: ``sys.argv``, the working
    directory, ``LOCAL_RANK`` (the runner scripts set it from ``--local_rank``) and the flushing
    of denormals (tools/benchmark.py turns it on; off is torch's default). The messages of a
    runner's logger are captured only if the runner created it: do not assert that something is
    absent from them without asserting something of the same run is present. The named instances
    the call created (loggers, with their handlers closed, message hubs, visualizers) are
    dropped after it, so the next call's runner creates its own even where its name (config
    name and second of the start) is the same, and its hooks never find an earlier run's."""
    out, value, code = io.StringIO(), None, 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, 'argv', [osp.join(ROOT, script), *map(str, args)])
        mp.chdir(cwd)
        if 'LOCAL_RANK' in os.environ:
            mp.setenv('LOCAL_RANK', os.environ['LOCAL_RANK'])
        else:
            mp.delenv('LOCAL_RANK', raising=False)
        main = script_module(script).main
        try:
            with fresh_mmengine_instances():
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    value = main()
        except SystemExit as stop:  # as the interpreter turns it into an exit code
            code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
            if not isinstance(stop.code, (int, type(None))):
                out.write(f'{stop.code}\n')
        except BaseException:  # the script's output, shown with the failure
            sys.stdout.write(out.getvalue()[-4000:])
            raise
        finally:
            torch.set_flush_denormal(False)
    log = out.getvalue()
    assert (code == 0) == ok, log[-4000:]
    return value, log


# ------------------------------------------------------------ reference implementations


class KeepResults(TorchFunctionMode):
    """Keeps every floating tensor an operation makes (not views: no rounding), with its
    gradient."""

    def __init__(self):
        super().__init__()
        self.tensors = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.requires_grad and t._base is None:
                if id(t) not in self.tensors and t.is_floating_point():
                    t.retain_grad()
                    self.tensors[id(t)] = t
        return out


def rounding_condition(fn, model: torch.nn.Module, inputs: torch.Tensor):
    """(``fn(inputs)``, a scalar computed in float64, and kappa = sqrt(sum (dL/dt * t)^2) over
    the model's parameters, the input and every result of an operation of ``fn``): the tensors a
    lower precision rounds. Each rounding moves t by at most u|t|, the scalar by dL/dt times
    that to first order; taken as independent and of mean zero (the probabilistic model of
    Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019), Hoeffding's inequality bounds their sum by
    lambda u kappa except with probability 2 exp(-lambda^2 / 2) (lambda = 5: below 1e-5)."""
    model.zero_grad(set_to_none=True)
    inputs = inputs.detach().requires_grad_()
    inputs.retain_grad()
    with KeepResults() as kept:
        value = fn(inputs)
    value.backward()
    tensors = [inputs, *kept.tensors.values(), *model.parameters()]
    kappa = sum(float((t.grad * t).detach().square().sum()) for t in tensors if t.grad is not None)
    return float(value.detach()), kappa**0.5


def naive_windowed_attention(attn, x, window):
    """Plain softmax attention of each window's real tokens (no padding, no masks)."""
    B, H, W, C = x.shape
    out = torch.empty(B, H, W, C, dtype=x.dtype)
    w = window or max(H, W)
    for r in range(0, H, w):
        for c in range(0, W, w):
            tokens = x[:, r : r + w, c : c + w]
            h, wd = tokens.shape[1:3]
            qkv = attn.qkv(tokens.reshape(B, h * wd, C))
            q, k, v = qkv.view(B, h * wd, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim), dim=-1)
            y = (a @ v).transpose(1, 2).reshape(B, h * wd, -1)
            out[:, r : r + w, c : c + w] = attn.proj(y).view(B, h, wd, C)
    return out


# -------------------------------------------------------------- the SPEC's formulas, naively


def reference_attention(attn, u, lam, valid=None):
    """§7.3 (logits) / §7.4.3 (qkv) branch by branch, with explicit N×N logits per branch."""
    B, N, d = u.shape
    n, H = attn.num_branches, attn.num_heads
    dh = d // H
    qs, ks, vs, projs = [], [], [], []
    for s in attn.branch_state_dicts():
        q, k, v = (
            (u @ s['qkv.weight'].T + s['qkv.bias']).view(B, N, 3, H, dh).permute(2, 0, 3, 1, 4)
        )
        qs.append(q), ks.append(k), vs.append(v), projs.append(s)
    out = 0
    for b in range(n):
        if attn.join == 'logits':
            logits = [qs[c] @ ks[c].transpose(-1, -2) for c in range(n)]
            mixed = logits[b] + lam * sum(logits[c] for c in range(n) if c != b)
            mixed = mixed / ((1 + (n - 1) * lam**2) ** 0.5 * dh**0.5)
            value = vs[b]
        else:

            def join(t, b=b):
                return t[b] + lam * sum(t[c] for c in range(n) if c != b)

            mixed = join(qs) @ join(ks).transpose(-1, -2) / ((1 + (n - 1) * lam**2) * dh**0.5)
            value = join(vs)
        if valid is not None:
            mixed = mixed.masked_fill(~valid[:, None, None, :], float('-inf'))
        heads = (mixed.softmax(-1) @ value).transpose(1, 2).reshape(B, N, d)
        out = out + heads @ projs[b]['proj.weight'].T + projs[b]['proj.bias']
    return out


def reference_ffn(ffn, v, lam):
    n = ffn.num_branches
    z = [v @ s['fc1.weight'].T + s['fc1.bias'] for s in ffn.branch_state_dicts()]
    out = 0
    for b, s in enumerate(ffn.branch_state_dicts()):
        joined = z[b] + lam * sum(z[c] for c in range(n) if c != b)
        out = out + F.gelu(joined) @ s['fc2.weight'].T + s['fc2.bias']
    return out


def reference_windows(attn, u, lam, hw, ws):
    """Windowed attention with no padding at all: each window (cut short at the right and
    bottom edges) attends among its real tokens only."""
    B, N, d = u.shape
    H, W = hw
    grid = u.view(B, H, W, d)
    out = torch.empty_like(grid)
    for i in range(0, H, ws):
        for j in range(0, W, ws):
            window = grid[:, i : i + ws, j : j + ws]
            h, w = window.shape[1:3]
            out[:, i : i + ws, j : j + ws] = reference_attention(
                attn, window.reshape(B, h * w, d), lam
            ).view(B, h, w, d)
    return out.view(B, N, d)


def reference_block(blk, x, valid=None, hw=None):
    lam = blk.current_join_lambda
    u = blk.norm1(x)
    if blk.window_size is None:
        x = x + reference_attention(blk.attn, u, lam, valid)
    else:
        x = x + reference_windows(blk.attn, u, lam, hw, blk.window_size)
    return x + reference_ffn(blk.mlp, blk.norm2(x), lam)


def parse_options(options):
    """``--cfg-options`` as mmengine's DictAction reads them."""
    import argparse

    from mmengine.config import DictAction

    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(['--cfg-options', *options]).cfg_options
