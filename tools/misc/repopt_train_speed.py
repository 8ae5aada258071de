"""Training-step and inference speed of RepOpt-VGG against RepVGG, interleaved in one run.

    python tools/misc/repopt_train_speed.py [--arch B1] [--batch 8] [--size 224] [--repeat 5]
        [--out result.json]

A training step is forward, cross-entropy backward and the optimizer step of backbone + pooling +
FC-1000: RepOpt-VGG (the plain 3x3 conv-BN network, RepOptSGD with the Hyper-Search multipliers;
random constants, which do not change the cost) against RepVGG (3x3-BN + 1x1-BN + BN identity
per layer, plain SGD). Then both are folded, which gives the same network, and their inference
is timed too (equal up to noise). Prints the medians, the ratios, and the MACs and activation
memory of one training forward that explain them.
"""

import argparse
import copy
import json

import torch
import torch.nn as nn
from mmengine.optim import build_optim_wrapper

import mmrepa
from mmrepa.backbones import RepOptVGG
from mmrepa.utils import complexity, time_interleaved
from mmrepa.utils.files import write_json
from mmrepa.utils.machine import finish, machine_info


class Classifier(nn.Module):
    def __init__(self, backbone: RepOptVGG):
        super().__init__()
        self.backbone = backbone
        self.fc = nn.Linear(backbone.num_features[-1], 1000)

    def forward(self, x):
        return self.fc(self.backbone(x)[-1].mean((2, 3)))


def build(arch: str, mode: str):
    model = Classifier(RepOptVGG(arch, mode=mode, out_indices=(3,))).train()
    if mode == 'target':
        with torch.no_grad():
            for m in model.backbone.layers().values():
                m.set_scales(
                    torch.rand(m.out_channels) + 0.5,
                    torch.rand(m.out_channels) + 0.5,
                    torch.rand(m.out_channels) + 0.5,
                )
        model.backbone.reinitialize()
        optim = dict(
            constructor='RepOptOptimWrapperConstructor',
            optimizer=dict(
                type='RepOptSGD', lr=0.01, momentum=0.9, nesterov=True, weight_decay=4e-5
            ),
        )
    else:
        optim = dict(
            optimizer=dict(type='SGD', lr=0.01, momentum=0.9, nesterov=True, weight_decay=4e-5)
        )
    return model, build_optim_wrapper(model, optim)


def activation_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps for backward in one training forward."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return total


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--arch', default='B1')
    parser.add_argument('--batch', type=int, default=8)
    parser.add_argument('--size', type=int, default=224)
    parser.add_argument('--repeat', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--out', help='write the numbers to this JSON file')
    return parser.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, args.size, args.size)
    y = torch.randint(0, 1000, (args.batch,))
    models = {mode: build(args.arch, mode) for mode in ('target', 'repvgg')}
    machine = machine_info()

    def step(mode):
        model, wrapper = models[mode]

        def run():
            wrapper.update_params(nn.functional.cross_entropy(model(x), y))

        return run

    train = time_interleaved(
        {'RepOpt-VGG': step('target'), 'RepVGG': step('repvgg')},
        repeat=args.repeat,
        warmup=args.warmup,
    )
    one = x[:1]
    result = dict(
        arch=args.arch,
        batch=args.batch,
        size=args.size,
        threads=torch.get_num_threads(),
        train_step_ms={k: v.median for k, v in train.items()},
    )
    for mode, name in (('target', 'RepOpt-VGG'), ('repvgg', 'RepVGG')):
        model = models[mode][0]
        result.setdefault('train_gmacs_per_image', {})[name] = (
            complexity(model, (one,))['macs'] / 1e9
        )
        result.setdefault('params', {})[name] = sum(p.numel() for p in model.parameters())
        result.setdefault('saved_activation_mb', {})[name] = activation_bytes(model, x) / 2**20
    folded = {
        name: mmrepa.reparameterize(copy.deepcopy(models[mode][0]).eval())
        for mode, name in (('target', 'RepOpt-VGG'), ('repvgg', 'RepVGG'))
    }
    assert [p.shape for p in folded['RepOpt-VGG'].parameters()] == [
        p.shape for p in folded['RepVGG'].parameters()
    ]  # one inference network
    with torch.no_grad():
        infer = time_interleaved(
            {k: (lambda m=m: m(x)) for k, m in folded.items()},
            repeat=args.repeat,
            warmup=args.warmup,
        )
    result['folded_inference_ms'] = {k: v.median for k, v in infer.items()}
    result['train_speedup'] = train['RepVGG'].median / train['RepOpt-VGG'].median
    result['machine'] = finish(machine)
    print(json.dumps(result, indent=2))
    if args.out:
        write_json(result, args.out)  # atomic: never half a file


if __name__ == '__main__':
    main()
