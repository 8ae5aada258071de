"""The MACs docs/backbones and the metafiles give beside a paper's numbers are the counter's
(``mmrepa.utils.model_complexity``, as tools/get_flops.py counts the whole model at 224²), under
both conventions: with softmax attention's QKᵀ and AV products and without them; a model with no
softmax attention has one number for both (the ``EITHER`` column). Each model is built and
counted once per test session (RePa-ViT-H, the largest, takes about a minute)."""

import copy
import functools
import glob
import os.path as osp
import re

import pytest
import torch
import yaml
from mmengine.config import Config

import mmrepa
from mmrepa.apis import init_model
from mmrepa.integrations.cli.batches import pipeline_batch
from mmrepa.utils import model_complexity
from tests.helpers import ROOT

WITH, WITHOUT = 'GMACs with attention matmuls', 'GMACs without attention matmuls'
# the column of a table whose models have no softmax attention: both conventions in one number
EITHER = 'GMACs with or without attention matmuls'
# what a paper's number says of softmax attention's products (paper_results.yml)
CONVENTIONS = ('counted', 'not counted', 'none in the model')
LINK = re.compile(r'\]\(\.\./\.\./(configs/[\w./-]+\.py)\)')


@functools.lru_cache(maxsize=None)
def counted(config: str) -> dict:
    """``{(attention matmuls, folded): GMACs}`` of a config's model on a 224² image through its
    test pipeline, rounded as the docs and metafiles give them (2 decimals)."""
    cfg = Config.fromfile(osp.join(ROOT, config))
    if isinstance(cfg.model.backbone.get('scales'), str):
        # RepOpt-VGG's Hyper-Search constants (a file not in the repository) change no count
        cfg.model.backbone.scales = None
    torch.manual_seed(0)
    model = init_model(cfg)
    folded = mmrepa.reparameterize(copy.deepcopy(model))
    with torch.no_grad():
        data = model.data_preprocessor(pipeline_batch(model.cfg, (224, 224)), False)
        return {
            (attention, fold): round(model_complexity(m, data, attention)['macs'] / 1e9, 2)
            for attention in (True, False)
            for fold, m in ((False, model), (True, folded))
        }


def docs_rows() -> list:
    """``(doc, config, {column: cell})`` for every row of a docs/backbones table whose header
    has both GMACs columns (or the ``EITHER`` one) and whose row links a config."""
    rows = []
    for doc in sorted(glob.glob(osp.join(ROOT, 'docs', 'backbones', '*.md'))):
        header = None
        with open(doc) as f:
            for line in f:
                cells = [c.strip() for c in line.strip().strip('|').split('|')]
                if not line.startswith('|'):
                    header = None
                elif (WITH in cells and WITHOUT in cells) or EITHER in cells:
                    header = cells
                elif header and LINK.search(line):
                    config = LINK.search(line).group(1)
                    rows.append((osp.basename(doc), config, dict(zip(header, cells))))
    return rows


def metafile_models() -> list:
    with open(osp.join(ROOT, 'model-index.yml')) as f:
        metafiles = yaml.safe_load(f)['Import']
    models = []
    for metafile in metafiles:
        with open(osp.join(ROOT, metafile)) as f:
            models += [m for m in yaml.safe_load(f)['Models'] if 'Paper GMACs' in m['Metadata']]
    return models


def before_after(cell: str) -> tuple:
    numbers = re.fullmatch(r'([\d.]+) → ([\d.]+)', cell)
    assert numbers, f'{cell!r} is not "GMACs before → after folding"'
    return float(numbers.group(1)), float(numbers.group(2))


def test_the_docs_tables_are_found():
    configs = {config for _, config, _ in docs_rows()}
    assert 'configs/repa_vit/repa_lvvit_s_8xb128_in1k.py' in configs
    assert {m['Config'] for m in metafile_models()} <= configs
    assert {'configs/mlp_mixer/repa_mlp_mixer_b16_32xb128_in1k.py'} <= configs


@pytest.mark.parametrize('doc, config, row', docs_rows(), ids=lambda v: str(v)[:60])
def test_docs_macs_are_the_counters(doc, config, row):
    counts = counted(config)
    assert EITHER in row or (WITH in row and WITHOUT in row), f'{doc}, {config}: a cell is missing'
    for column, attention in ((WITH, True), (WITHOUT, False), (EITHER, True), (EITHER, False)):
        ours = (counts[attention, False], counts[attention, True])
        if column in row:
            assert before_after(row[column]) == ours, f'{doc}, {config}, {column}: counter {ours}'


@pytest.mark.parametrize('model', metafile_models(), ids=lambda m: m['Name'])
def test_metafile_macs_are_the_counters_and_the_papers_conventions_hold(model):
    meta, counts = model['Metadata'], counted(model['Config'])
    assert (meta['GMACs'], meta['GMACs (folded)']) == (counts[True, False], counts[True, True])
    assert (
        meta['GMACs without attention matmuls'],
        meta['GMACs (folded) without attention matmuls'],
    ) == (counts[False, False], counts[False, True])
    # each paper number is ours under the convention it states, to the paper's rounding
    # (0.05) and 2 % (RePa-LV-ViT: its token-labelling head, run only once trained); a paper
    # may give one number, for the model it trains or the folded one
    for paper in meta['Paper GMACs']:
        assert 'GMACs' in paper or 'GMACs (folded)' in paper, paper['Source']
        for key, folded in (('', False), (' (folded)', True)):
            if f'GMACs{key}' not in paper:
                continue
            convention = paper[f'Attention matmuls{key}']
            assert convention in CONVENTIONS, (paper['Source'], convention)
            if convention == 'none in the model':
                assert counts[True, folded] == counts[False, folded], paper['Source']
            ours, theirs = counts[convention == 'counted', folded], paper[f'GMACs{key}']
            assert abs(ours - theirs) <= 0.05 + 0.02 * theirs, (paper['Source'], key, ours)
