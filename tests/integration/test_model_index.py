"""The model index (model-index.yml, configs/<family>/metafile.yml) and its packaging in
mmrepa/.mim."""

import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys

import yaml

import mmrepa
from tests.helpers import ROOT, run_script_here

MIM = osp.join(osp.dirname(osp.abspath(mmrepa.__file__)), '.mim')
REINSTALL = 'pip install --no-deps --no-build-isolation -e . (it links mmrepa/.mim)'
# a quick config to count at its full test size (224 x 224; 3.5 s in a test process, half of
# RepOpt-VGG-B1's at 32 x 32, whose 55 M parameters take longer to build): the one counted again
CHEAPEST = 'configs/repa_vit/repa_deit_t_32xb128_in1k.py'


def load_generator():
    spec = importlib.util.spec_from_file_location(
        'gen_metafiles', osp.join(ROOT, 'tools', 'misc', 'gen_metafiles.py')
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_yaml(path):
    with open(path) as f:
        return yaml.safe_load(f)


def indexed_models() -> dict:
    """{name: model entry} of every metafile model-index.yml imports (read as plain YAML:
    modelindex drops the results' Notes)."""
    models = {}
    for metafile in read_yaml(osp.join(ROOT, 'model-index.yml'))['Import']:
        for model in read_yaml(osp.join(ROOT, metafile))['Models']:
            assert model['Name'] not in models, f'{model["Name"]} is indexed twice'
            models[model['Name']] = model
    return models


def test_mim_dir_is_installed():
    for path in (
        'model-index.yml',
        'configs/repa_swin/retinanet_repa_swin_t_1x_coco.py',
        'configs/demo/retinanet_repa_swin_shapes.py',
        'tools/train.py',
        'tools/test.py',
    ):
        assert osp.exists(osp.join(MIM, path)), f'mmrepa/.mim/{path} is missing: {REINSTALL}'
    if MIM.startswith(ROOT + osp.sep):  # editable install: links to the live files
        assert osp.realpath(osp.join(MIM, 'configs')) == osp.join(ROOT, 'configs')


def test_index_has_every_config_with_its_paper():
    """What the library of mim reads: every config once, each path existing in the checkout
    and in mmrepa/.mim, each collection with a paper; no weights are published."""
    from modelindex.load_model_index import load

    gen = load_generator()
    index = load(osp.join(ROOT, 'model-index.yml'))
    index.build_models_with_collections()
    collections = {c.name: c for c in index.collections}
    names = sorted(m.name for m in index.models)
    assert names == sorted(gen.model_name(c) for c in gen.list_configs())
    for model in index.models:
        assert osp.isfile(osp.join(ROOT, model.config)), model.config
        assert osp.isfile(osp.join(MIM, model.config)), f'{model.config}: {REINSTALL}'
        assert gen.model_name(model.config) == model.name
        paper = collections[model.in_collection].paper
        assert paper['Title'] and paper['URL'].startswith('https://'), model.name
        assert not model.weights
        meta = model.metadata.data
        for key in ('Parameters', 'Parameters (folded)', 'GMACs', 'GMACs (folded)'):
            assert meta[key] > 0, (model.name, key)
        # folding StarReLU into a bias-free layer gives it a bias: a few parameters more
        assert meta['Parameters (folded)'] <= meta['Parameters'] * 1.001
        assert meta['GMACs (folded)'] <= meta['GMACs']


def test_results_are_the_papers_and_marked_so():
    gen = load_generator()
    for name, model in indexed_models().items():
        assert model.get('Results') == gen.PAPER_RESULTS.get(name), name
        for result in model.get('Results', []):
            assert 'not reproduced' in result['Notes'], name


def test_entry_equals_a_fresh_get_flops_run(tmp_path):
    """The numbers are get_flops's, not typed in: the cheapest config, counted again."""
    gen = load_generator()
    out = str(tmp_path / 'counts.json')
    _, log = run_script_here('tools/get_flops.py', CHEAPEST, '--json', out)
    with open(out) as f:
        counts = json.load(f)
    assert counts['shape'] == [224, 224]
    # the JSON is what the table printed
    model_line = next(ln for ln in log.splitlines() if ln.startswith('model'))
    assert float(model_line.split()[1]) == round(counts['model']['params_before'] / 1e6, 2)
    # its paper gives GMACs: the entry also has the count without attention matmuls
    without = str(tmp_path / 'without.json')
    run_script_here('tools/get_flops.py', CHEAPEST, '--no-attention-matmuls', '--json', without)
    with open(without) as f:
        counts[gen.WITHOUT] = json.load(f)
    assert indexed_models()[gen.model_name(CHEAPEST)] == gen.model_entry(CHEAPEST, counts)


def install_wheel(tmp_path) -> str:
    """Build mmrepa's wheel and pip-install it into a directory; returns that directory.
    The build's own directories are under ``tmp_path`` too, not in the checkout."""
    # (not the egg-info beside the site either: pkg_resources would take it for the package)
    (tmp_path / 'build').mkdir()
    build = [
        'egg_info',
        '-e',
        str(tmp_path / 'build'),
        'build',
        '-b',
        str(tmp_path / 'build'),
        'bdist_wheel',
        '-d',
        str(tmp_path / 'dist'),
        '-b',
        str(tmp_path / 'bdist'),
    ]
    proc = subprocess.run(
        [sys.executable, 'setup.py', '-q', *build], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / 'dist').glob('mmrepa-*.whl')
    site = str(tmp_path / 'site')
    proc = subprocess.run(
        [sys.executable, '-m', 'pip', 'install', '-q', '--no-deps', '--target', site, str(wheel)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return site


def test_a_wheel_carries_copies_and_mim_search_finds_the_models(tmp_path):
    """A regular install gets real files in mmrepa/.mim (not links into a checkout), and
    ``mim search`` finds the models there by name."""
    site = install_wheel(tmp_path)
    mim = osp.join(site, 'mmrepa', '.mim')
    for path in (
        'model-index.yml',
        'configs/repa_swin/retinanet_repa_swin_t_1x_coco.py',
        'configs/repa_swin/metafile.yml',
        'tools/train.py',
    ):
        assert osp.isfile(osp.join(mim, path)) and not osp.islink(osp.join(mim, path)), path
    assert not osp.islink(osp.join(mim, 'configs'))
    # mim finds a package where its distribution says it is: the site directory comes first
    # on the path (before the editable install), as pip's target would in a fresh environment
    out = str(tmp_path / 'found.json')
    proc = subprocess.run(
        [sys.executable, '-m', 'mim', 'search', 'mmrepa', '--model', 'repa-swin', '--json', out],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        env={**os.environ, 'PYTHONPATH': site},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out) as f:
        found = json.load(f)['config']  # {field: {config id: value}}
    models = indexed_models()
    assert sorted(found) == sorted(
        n for n, m in models.items() if m['In Collection'] == 'RePa-Swin'
    ), found
    assert (
        found['retinanet_repa_swin_t_1x_coco'] == models['retinanet_repa_swin_t_1x_coco']['Config']
    )


def test_each_family_readme_lists_its_metafile_models_with_the_papers_numbers():
    """A family folder's README.md has one row per model of its metafile, in order, with the
    metafile's parameter count and the paper's numbers (Results)."""
    for metafile in read_yaml(osp.join(ROOT, 'model-index.yml'))['Import']:
        with open(osp.join(ROOT, osp.dirname(metafile), 'README.md')) as f:
            rows = [ln for ln in f.read().splitlines() if ln.startswith('| [')]
        models = read_yaml(osp.join(ROOT, metafile))['Models']
        assert [r.split(']')[0][3:] for r in rows] == [m['Name'] for m in models], metafile
        for row, model in zip(rows, models):
            assert f'| {model["Metadata"]["Parameters"] / 1e6:.1f} → ' in row, row
            for result in model.get('Results', []):
                for value in result['Metrics'].values():
                    assert f'{value} ' in row.split('|')[-2], row
