"""Per-rank training memory, DDP against FSDP (FoldableFSDPStrategy), computed from a config's
model: parameters, gradients, the optimizer's state, and activations with and without ``with_cp``.

    python benchmarks/fsdp_memory.py CONFIG [CONFIG ...] [--ranks 8 16 64] [--out FILE.json]

The model is built on the meta device (no memory, any size). Parameters, gradients and the
state of the config's optimizer are float32 (4 + 4 bytes per parameter, and for the state
:func:`optimizer_state_floats`: AdamW 8, SGD with momentum 4); DDP keeps all of it on every rank,
FSDP (FULL_SHARD) 1/N of it plus, while a unit runs, that unit's gathered parameters and
gradients (the largest unit counted: the config's ``block_types``). Activations are the bytes
autograd saves for the backward of one training forward of the config's per-rank batch
(``train_dataloader.batch_size``) at the config's crop size, counted on the meta device with
``saved_tensors_hooks``; with ``with_cp`` the blocks save their inputs only and one block's
activations come back during its recomputation (the largest counted). Not counted: the data,
temporary buffers, the allocator's fragmentation, communication buffers.
"""

import argparse
import os.path as osp
import sys

import torch
import torch.nn as nn

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

GIB = 2.0**30
# float32 tensors of a parameter's size an optimizer keeps per parameter: (count, the option
# that adds one more; its class's default, read from the class, applies when the config
# leaves it out)
STATE_PER_PARAMETER = {
    'SGD': (0, 'momentum'),
    'RepOptSGD': (0, 'momentum'),
    'Adam': (2, 'amsgrad'),
    'AdamW': (2, 'amsgrad'),
    'RepOptAdamW': (2, 'amsgrad'),
}


def optimizer_state_floats(optimizer_cfg: dict, model: nn.Module) -> int:
    """The floats the configured optimizer keeps for ``model``: per parameter, SGD's momentum
    buffer (none without momentum), Adam's and AdamW's two moments (three with amsgrad); the
    RepOpt optimizers keep besides, per RepOpt kernel, RepOptSGD its multiplier (one tensor of
    the kernel's size), RepOptAdamW its branch scales (one per branch)."""
    import inspect

    from mmengine.registry import OPTIMIZERS

    from mmrepa.engine.optimizers import collect_branch_scales

    kind = optimizer_cfg['type']
    name = kind if isinstance(kind, str) else kind.__name__
    if name not in STATE_PER_PARAMETER:
        raise ValueError(
            f'benchmarks/fsdp_memory.py does not know the state of optimizer {name!r}: add it '
            f'to STATE_PER_PARAMETER (known: {", ".join(STATE_PER_PARAMETER)})'
        )
    count, option = STATE_PER_PARAMETER[name]
    defaults = inspect.signature(OPTIMIZERS.get(kind) if isinstance(kind, str) else kind)
    if optimizer_cfg.get(option, defaults.parameters[option].default):
        count += 1
    floats = count * sum(p.numel() for p in model.parameters())
    if name.startswith('RepOpt'):
        scales = collect_branch_scales(model).values()
        floats += sum(a[0].numel() if name == 'RepOptSGD' else a.numel() for a in scales)
    return floats


def saved_bytes(model: nn.Module, inputs: torch.Tensor, block_types) -> dict:
    """Bytes autograd saves in one forward (the backbone's, per image batch), in total and
    in the largest block."""
    total, per_block, current = [0], {}, [None]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        if current[0] is not None:
            per_block[current[0]] = per_block.get(current[0], 0) + t.numel() * t.element_size()
        return t

    handles = []
    for name, m in model.named_modules():
        if type(m).__name__ in block_types:
            handles.append(
                m.register_forward_pre_hook(lambda m, a, n=name: current.__setitem__(0, n))
            )
            handles.append(m.register_forward_hook(lambda m, a, o: current.__setitem__(0, None)))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(inputs)
    for h in handles:
        h.remove()
    return dict(total=total[0], largest_block=max(per_block.values(), default=0))


def estimate(path: str, ranks) -> dict:
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    import mmrepa  # noqa: F401
    from mmrepa.apis import build_model

    cfg = Config.fromfile(path)
    blocks = cfg.strategy.model_wrapper.auto_wrap_policy.block_types
    batch = cfg.train_dataloader.batch_size
    size = cfg.model.backbone.get('img_size', 224)
    result = dict(config=osp.relpath(path), per_rank_batch=batch, image_size=size, ranks={})
    for with_cp in (False, True):
        cfg.model.backbone.with_cp = with_cp
        with DefaultScope.overwrite_default_scope(cfg.default_scope), torch.device('meta'):
            model = build_model(cfg)
            model.train()
            x = torch.empty(batch, 3, size, size)
            saved = saved_bytes(model.backbone, x, blocks)
        act = saved['total'] + (saved['largest_block'] if with_cp else 0)
        result['activations_cp' if with_cp else 'activations'] = act
    params = sum(p.numel() for p in model.parameters())
    unit = max(
        (
            sum(p.numel() for p in m.parameters())
            for m in model.modules()
            if type(m).__name__ in blocks
        ),
        default=params,
    )
    optimizer = cfg.optim_wrapper.optimizer
    state = 4 * optimizer_state_floats(optimizer, model)
    result.update(parameters=params, largest_unit_parameters=unit, optimizer=optimizer.type)
    for n in ranks:
        ddp = dict(params=4 * params, grads=4 * params, optimizer=state)
        fsdp = dict(
            params=4 * params / n + 4 * unit,
            grads=4 * params / n + 4 * unit,
            optimizer=state / n,
        )
        result['ranks'][n] = {
            name: dict(
                state=sum(s.values()),
                total=sum(s.values()) + result['activations'],
                total_cp=sum(s.values()) + result['activations_cp'],
                **s,
            )
            for name, s in (('ddp', ddp), ('fsdp', fsdp))
        }
    return result


def table(r: dict) -> str:
    lines = [
        f'{r["config"]}: {r["parameters"] / 1e6:.1f} M parameters (largest unit '
        f'{r["largest_unit_parameters"] / 1e6:.1f} M), {r["per_rank_batch"]} images of '
        f'{r["image_size"]} px per rank; activations {r["activations"] / GIB:.1f} GiB, '
        f'{r["activations_cp"] / GIB:.1f} GiB with with_cp',
        f'| ranks | run | params | grads | {r["optimizer"]} | + activations | '
        '+ activations, with_cp |',
        '|---|---|---|---|---|---|---|',
    ]
    for n, runs in r['ranks'].items():
        for name, s in runs.items():
            lines.append(
                f'| {n} | {name.upper()} | '
                + ' | '.join(
                    f'{s[k] / GIB:.2f}'
                    for k in ('params', 'grads', 'optimizer', 'total', 'total_cp')
                )
                + ' |'
            )
    return '\n'.join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('configs', nargs='+')
    parser.add_argument('--ranks', type=int, nargs='+', default=[8, 16, 64])
    parser.add_argument('--out', help='also write the numbers to this JSON file')
    args = parser.parse_args()
    from mmrepa.utils.machine import finish, machine_info

    machine = machine_info()  # the counts do not depend on it; the file says where they came from
    results = [estimate(c, args.ranks) for c in args.configs]
    for r in results:
        print(table(r) + '\n')
    if args.out:
        from mmrepa.utils.files import write_json

        command = ' '.join(['python', *sys.argv])
        write_json(dict(command=command, machine=finish(machine), results=results), args.out)


if __name__ == '__main__':
    main()
