"""Every measured number says where it was measured: the ``machine`` block (CPU model, vector
extensions, threads, load) of mmrepa.utils.machine in the benchmarks' JSON."""

import glob
import json
import os
import os.path as osp

import pytest
import torch
import torch.nn as nn

from mmrepa.utils.machine import finish, machine_info, vector_extensions
from tests.helpers import ROOT, script_module

RESULTS = sorted(glob.glob(osp.join(ROOT, 'benchmarks', 'results', '*.json')))


def check_machine(machine):
    assert isinstance(machine, dict), machine
    assert isinstance(machine['cpu'], str) and machine['cpu'], machine
    assert isinstance(machine['vector_extensions'], list), machine
    assert all(isinstance(f, str) for f in machine['vector_extensions']), machine
    assert machine['threads'] is None or machine['threads'] >= 1, machine
    for key in ('omp_num_threads', 'load_average_start', 'load_average_end', 'torch'):
        assert key in machine, (key, machine)


def test_results_exist():
    assert len(RESULTS) >= 10, RESULTS


@pytest.mark.parametrize('path', RESULTS, ids=osp.basename)
def test_every_result_says_where_it_was_measured(path):
    with open(path) as f:
        result = json.load(f)
    machine = result['machine']
    check_machine(machine)
    if 'threads' in result:  # tools/benchmark.py's own field: the two agree
        assert machine['threads'] == result['threads'], (machine['threads'], result['threads'])
    for row in (*result.get('models', {}).values(), *result.get('runs', ())):
        if 'machine' in row:  # measured by a run of its own (--only)
            check_machine(row['machine'])


def naive_flags():
    with open('/proc/cpuinfo') as f:
        for line in f:
            if line.startswith(('flags', 'Features')):
                return line.split(':', 1)[1].split()
    return []


@pytest.mark.skipif(not osp.exists('/proc/cpuinfo'), reason='no /proc/cpuinfo')
def test_machine_info_reads_this_machine():
    machine = finish(machine_info())
    check_machine(machine)
    flags = naive_flags()
    for ext in ('avx2', 'avx512f', 'avx512_vnni', 'avx_vnni', 'amx_tile', 'avx512_bf16'):
        assert (ext in machine['vector_extensions']) == (ext in flags), ext
    assert set(machine['vector_extensions']) <= set(flags)
    assert machine['threads'] == torch.get_num_threads()
    assert machine['omp_num_threads'] == os.environ.get('OMP_NUM_THREADS')
    assert machine['logical_cores'] == os.cpu_count()
    assert len(machine['load_average_start']) == len(machine['load_average_end']) == 3
    assert machine['torch'] == torch.__version__
    assert machine['torch_cpu_capability'] == torch.backends.cpu.get_cpu_capability()
    json.dumps(machine)  # JSON as it is


def test_vector_extensions_name_every_simd_subset_and_nothing_else():
    sapphire_rapids = (
        'fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c smep avx2 avx512f avx512dq '
        'avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni avx_vnni amx_bf16 '
        'amx_tile amx_int8 sha_ni'
    )
    assert vector_extensions({'flags': sapphire_rapids}) == [
        'fma',
        'sse4_1',
        'sse4_2',
        'avx',
        'f16c',
        'avx2',
        'avx512f',
        'avx512dq',
        'avx512cd',
        'avx512bw',
        'avx512vl',
        'avx512_bf16',
        'avx512_vnni',
        'avx_vnni',
        'amx_bf16',
        'amx_tile',
        'amx_int8',
    ]
    graviton3 = 'fp asimd aes sha2 asimddp sve i8mm bf16 svebf16 paca'
    assert vector_extensions({'Features': graviton3}) == [
        'asimd',
        'asimddp',
        'sve',
        'i8mm',
        'bf16',
        'svebf16',
    ]
    assert vector_extensions({}) == []


class Tiny(nn.Module):
    """A model with a backbone: all tools/benchmark.py's backbone scope needs."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        self.cfg = None  # unused with --shape and --backbone-only


def test_benchmark_tool_writes_the_machine(tmp_path, monkeypatch):
    benchmark = script_module('tools/benchmark.py')
    # the tool as it runs, on a model built here (building one from a config imports mmpretrain)
    monkeypatch.setattr(benchmark, 'init_model', lambda *args: Tiny().eval())
    out = tmp_path / 'result.json'
    benchmark.main(
        [
            'tiny.py',
            '--shape',
            '16',
            '16',
            '--backbone-only',
            '--repeat',
            '1',
            '--warmup',
            '0',
            '--device',
            'cpu',
            '--out',
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    machine = result['machine']
    check_machine(machine)
    assert machine['threads'] == result['threads']
    assert machine['load_average_start'] is not None and machine['load_average_end'] is not None
    assert result['device_name'] == machine['cpu']  # the field readers had before stays


MIXER_TINY = dict(
    embed_dims=16, num_layers=2, tokens_mlp_dims=8, channels_mlp_dims=64, patch_size=16
)


def test_family_speed_times_a_tiny_model_folded_and_unfolded(tmp_path, monkeypatch, capsys):
    """benchmarks/family_speed.py on a tiny RePa-MLPMixer classifier (at 224², as every model)."""
    from mmrepa.apis import init_model

    family_speed = script_module('benchmarks/family_speed.py')
    config = tmp_path / 'tiny_mixer.py'
    base = osp.join(ROOT, 'configs', 'mlp_mixer', 'repa_mlp_mixer_b16_32xb128_in1k.py')
    config.write_text(
        f'_base_ = {base!r}\n'
        f'model = dict(backbone=dict(arch=dict({MIXER_TINY!r}, _delete_=True)), '
        'head=dict(in_channels=16))\n'
    )
    tiny = family_speed.Model('tiny', str(config), 130.1, 'RePaFormer Table 1')
    monkeypatch.setattr(family_speed, 'MODELS', (tiny,))
    with pytest.raises(SystemExit, match=r"--models: unknown \['huge'\]; choose from \['tiny'\]"):
        family_speed.main(['--models', 'huge'])
    out = tmp_path / 'speed.json'
    threads = torch.get_num_threads()
    family_speed.main(
        ['--repeat', '2', '--warmup', '0', '--batches', '1', '2', '--threads', '1']
        + ['--out', str(out)]
    )
    assert torch.get_num_threads() == threads  # given back
    result = json.loads(out.read_text())
    check_machine(result['machine'])
    assert result['machine']['load_average_end'] is not None
    row = result['models']['tiny']
    assert [(r['batch'], r['threads']) for r in row['runs']] == [(1, 1), (2, 1)]
    for r in row['runs']:
        assert r['speedup'] == r['unfolded']['median_ms'] / r['folded']['median_ms']
        assert r['speedup_over_mac_ratio'] == r['speedup'] / row['mac_ratio']
    assert row['mac_ratio'] == pytest.approx(row['gmacs_before'] / row['gmacs_after'])
    assert row['mac_ratio'] > 1 and row['paper_gain_percent'] == 130.1
    # the folded copy is what deploy=True builds
    deployed = init_model(str(config), cfg_options={'model.backbone.deploy': True})
    assert row['params_after'] == sum(p.numel() for p in deployed.parameters())
    assert row['params_before'] > row['params_after']
    table = capsys.readouterr().out
    assert 'tiny' in table and '+130.1 %' in table


def test_fsdp_memory_counts_the_configured_optimizers_state():
    """By hand: a Linear(3, 2) has 8 parameters; a RepOptConvBN(2, 2) a 2x2x3x3 kernel (36) and
    a BatchNorm (4), and 3 branch scales per kernel entry."""
    from mmrepa.backbones.repopt_vgg.blocks import RepOptConvBN

    count = script_module('benchmarks/fsdp_memory.py').optimizer_state_floats
    linear, repopt = nn.Linear(3, 2), RepOptConvBN(2, 2)
    assert count(dict(type='SGD', lr=0.1), linear) == 0  # torch's SGD: no momentum by default
    assert count(dict(type='SGD', lr=0.1, momentum=0.9), linear) == 8
    assert count(dict(type='AdamW', lr=0.1), linear) == 16
    assert count(dict(type='AdamW', lr=0.1, amsgrad=True), linear) == 24
    assert count(dict(type='RepOptSGD', momentum=0.9), repopt) == 40 + 36  # momentum, M
    assert count(dict(type='RepOptSGD'), repopt) == 36
    assert count(dict(type='RepOptAdamW'), repopt) == 2 * 40 + 3 * 36  # moments, A
    with pytest.raises(ValueError, match="optimizer 'Lamb'"):
        count(dict(type='Lamb'), linear)


def test_demo_end_to_end_measures_an_untrained_retinanet(tmp_path, monkeypatch):
    """benchmarks/demo_end_to_end.py's path (the OpenVINO sessions in the model, the interleaved
    timing of every variant, the comparison with the trained model, the JSON) on the demo
    RetinaNet as initialised and two generated validation images, without mmdeploy.
    tools/quantize.py's NNCF run (tests/integration/test_quantize.py runs it) is left out: the
    INT8 session computes the float32 graph the benchmark exports (the one NNCF would
    quantize); NNCF alone takes longer than this test may."""
    from mmrepa.apis import init_model
    from mmrepa.datasets import make_shapes_coco
    from mmrepa.integrations import openvino

    pytest.importorskip('openvino')
    e2e = script_module('benchmarks/demo_end_to_end.py')
    data = make_shapes_coco(str(tmp_path / 'data'), num_train=2, num_val=2, size=64) + '/'
    config, ckpt = e2e.MODELS['retinanet'].config, e2e.MODELS['retinanet'].checkpoint
    folder = tmp_path / 'work_dirs' / 'demo'
    (folder / osp.dirname(config)).mkdir(parents=True)
    (folder / config).write_text(
        f'_base_ = {osp.join(ROOT, "configs", "demo", osp.basename(config))!r}\n'
        f'data_root = {data!r}\n'
        'test_dataloader = dict(dataset=dict(data_root=data_root), num_workers=0, '
        'persistent_workers=False)\n'
        'train_dataloader = test_dataloader\n'
        "test_evaluator = dict(ann_file=data_root + 'annotations/val.json')\n"
    )
    model = init_model(str(folder / config))
    meta = dict(dataset_meta=model.dataset_meta)
    torch.save(dict(state_dict=model.state_dict(), meta=meta), folder / ckpt)
    int8 = []

    def quantize_tool(tool, args, dump):
        assert tool == 'quantize.py' and args[2:6] == ['--backend', 'openvino', '--form', 'folded']
        assert '--full' in args  # RetinaNet: the whole tensor forward
        int8.append(args[args.index('--out') + 1])
        return dict(sqnr_db=float('inf'), int8_ops=dict(fake_quantize=0))

    def session(path, threads=0):
        if path in int8:  # the float32 graph exported beside it
            path = osp.join(osp.dirname(path), 'retinanet_fp32.onnx')
        return real_session(path, threads)

    real_session = openvino.OpenVINOSession
    monkeypatch.setattr(e2e, 'run_tool', quantize_tool)
    monkeypatch.setattr(openvino, 'OpenVINOSession', session)
    monkeypatch.chdir(tmp_path)  # the script moves to --demo-root; given back after
    threads = torch.get_num_threads()
    out = tmp_path / 'e2e.json'
    try:
        e2e.main(
            ['--only', 'retinanet', '--images', '2', '--repeat', '1', '--warmup', '0']
            + ['--no-mmdeploy', '--demo-root', str(tmp_path), '--out', str(out)]
        )
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    check_machine(result['machine'])
    assert result['machine']['load_average_end'] is not None and result['skipped'] == []
    row = result['models']['retinanet']
    ms = {k: v['median'] for k, v in row['latency_ms'].items()}
    assert set(ms) == {*e2e.VARIANTS, 'pipeline'} and row['images'] == 2
    assert row['ratios_to_trained'] == {k: ms['trained'] / ms[k] for k in e2e.VARIANTS}
    assert row['end_to_end'] == ms['trained'] / ms['openvino_int8']
    assert row['int8_vs_openvino_fp32'] == ms['openvino_fp32'] / ms['openvino_int8']
    agreement = row['agreement_with_trained']
    assert agreement['folded']['instances'] > 0 and agreement['folded']['same_labels']
