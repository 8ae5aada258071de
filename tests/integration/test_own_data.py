"""``--data-root DIR`` (mmrepa.datasets.own_data): a config pointed at generated data
whose classes it does not have, for mmdet (COCO format, both layouts), mmseg (ADE20K's layout)
and mmpretrain (a folder per class); one short training and test on it at the command line."""

import json
import os
import os.path as osp
import pickle
import shutil

import pytest
from mmengine.registry import init_default_scope

from mmrepa.apis import load_config
from mmrepa.datasets import make_shapes_ade20k, make_shapes_classification, make_shapes_coco
from mmrepa.datasets.own_data import use_own_data
from mmrepa.errors import ConfigError
from tests.helpers import DEMO, ROOT, run_script_here

NO_WORKERS = [
    f'{loader}.{key}'
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader')
    for key in ('num_workers=0', 'persistent_workers=False')
]


def coco_with_other_classes(root: str, layout: str = 'demo') -> str:
    """The shapes set with 'circle' renamed 'disc' and the triangles dropped: two classes, none
    of the demo config's three by name. ``layout='coco'``: COCO's file names
    (annotations/instances_train2017.json, train2017/)."""
    make_shapes_coco(root, num_train=8, num_val=4, size=64)
    for split in ('train', 'val'):
        path = osp.join(root, 'annotations', f'{split}.json')
        with open(path) as f:
            coco = json.load(f)
        coco['annotations'] = [a for a in coco['annotations'] if a['category_id'] != 3]
        coco['categories'] = [dict(id=1, name='disc'), dict(id=2, name='square')]
        with open(path, 'w') as f:
            json.dump(coco, f)
        if layout == 'coco':
            os.rename(path, osp.join(root, 'annotations', f'instances_{split}2017.json'))
            os.rename(osp.join(root, split), osp.join(root, f'{split}2017'))
    return root


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    return coco_with_other_classes(str(tmp_path_factory.mktemp('own') / 'coco'))


# ----------------------------------------------------------------------------------- mmdet


def test_detection_heads_and_data_sets_follow_the_data(tmp_path):
    root = coco_with_other_classes(str(tmp_path / 'coco'), layout='coco') + '/'
    cascade = load_config(
        osp.join(ROOT, 'configs', 'repa_swin', 'cascade-mask-rcnn_repa_swin_t_1x_coco.py')
    )
    # a wrapped training set: the data set inside gets the data
    cascade.train_dataloader.dataset = dict(
        type='RepeatDataset', times=2, dataset=cascade.train_dataloader.dataset
    )
    line = use_own_data(cascade, root)
    assert line.startswith(f'--data-root {root}: 2 classes (disc, square)'), line
    roi = cascade.model.roi_head
    assert [head.num_classes for head in roi.bbox_head] == [2, 2, 2]
    assert roi.mask_head.num_classes == 2
    assert cascade.model.rpn_head.get('num_classes', 1) == 1  # object / not object
    inner = cascade.train_dataloader.dataset.dataset
    assert inner.data_root == root
    assert inner.ann_file == 'annotations/instances_train2017.json'
    assert inner.data_prefix.img == 'train2017/'
    assert inner.metainfo.classes == ('disc', 'square')
    test = cascade.test_dataloader.dataset
    assert (test.ann_file, test.data_prefix.img) == (
        'annotations/instances_val2017.json',
        'val2017/',
    )
    assert test.metainfo.classes == ('disc', 'square')
    for evaluator in (cascade.val_evaluator, cascade.test_evaluator):
        assert evaluator.ann_file == root + 'annotations/instances_val2017.json'

    # the demo config's own names (annotations/train.json, train/) are not there: COCO's are
    demo = load_config(DEMO)
    use_own_data(demo, root)
    assert (
        demo.train_dataloader.dataset.ann_file,
        demo.train_dataloader.dataset.data_prefix.img,
        demo.model.bbox_head.num_classes,
    ) == ('annotations/instances_train2017.json', 'train2017/', 2)
    mask = load_config(osp.join(ROOT, 'configs', 'repa_swin', 'mask-rcnn_repa_swin_t_1x_coco.py'))
    use_own_data(mask, root)
    assert mask.model.roi_head.bbox_head.num_classes == 2
    assert mask.model.roi_head.mask_head.num_classes == 2
    retina = load_config(osp.join(ROOT, 'configs', 'repa_swin', 'retinanet_repa_swin_t_1x_coco.py'))
    use_own_data(retina, root, classes=['square'])  # one of the categories
    assert retina.model.bbox_head.num_classes == 1
    assert retina.val_dataloader.dataset.metainfo.classes == ('square',)


def test_data_the_model_cannot_serve_is_refused(coco, tmp_path):
    with pytest.raises(ConfigError, match='--classes circle: not a category'):
        use_own_data(load_config(DEMO), coco, classes=['circle'])
    with pytest.raises(FileNotFoundError, match='no such directory'):
        use_own_data(load_config(DEMO), str(tmp_path / 'nothing'))
    # mmdet's "need at least one array to concatenate": no object of the classes to train on
    empty = str(tmp_path / 'empty')
    shutil.copytree(coco, empty)
    path = osp.join(empty, 'annotations', 'train.json')
    with open(path) as f:
        data = json.load(f)
    data['annotations'] = [a for a in data['annotations'] if a['category_id'] == 1]
    with open(path, 'w') as f:
        json.dump(data, f)
    with pytest.raises(ConfigError, match='no object of the classes square: nothing to train'):
        use_own_data(load_config(DEMO), empty, classes=['square'])
    # a validation category the training set lacks could never be predicted
    path = osp.join(empty, 'annotations', 'val.json')
    with open(path) as f:
        data = json.load(f)
    data['categories'].append(dict(id=9, name='star'))
    with open(path, 'w') as f:
        json.dump(data, f)
    with pytest.raises(
        ConfigError,
        match=r'val.json has categories the training annotations '
        r'have not \(star\)',
    ):
        use_own_data(load_config(DEMO), empty)


@pytest.fixture(scope='module')
def trained(coco, tmp_path_factory):
    """One epoch of the demo RetinaNet on two classes it was not written for, at the command
    line with --data-root and nothing else about the data."""
    work = str(tmp_path_factory.mktemp('own_work'))
    _, log = run_script_here(
        'tools/train.py',
        DEMO,
        '--data-root',
        coco,
        '--work-dir',
        work,
        '--cfg-options',
        'train_cfg.max_epochs=1',
        'train_cfg.val_interval=1',
        'train_dataloader.batch_size=4',
        'model.test_cfg.score_thr=0.0',
        *NO_WORKERS,
    )  # (an untrained detector's scores are low)
    return work, log


def test_train_and_test_on_own_coco_data(coco, trained, tmp_path):
    work, log = trained
    assert f'--data-root {coco}: 2 classes (disc, square)' in log
    assert 'coco/bbox_mAP: ' in log  # the validation after the epoch
    metrics, show, out = (str(tmp_path / n) for n in ('metrics.json', 'show', 'results.pkl'))
    run_script_here(
        'tools/test.py',
        DEMO,
        osp.join(work, 'epoch_1.pth'),
        '--data-root',
        coco,
        '--work-dir',
        work,
        '--dump-metrics',
        metrics,
        '--show-dir',
        show,
        '--out',
        out,
        '--cfg-options',
        'model.test_cfg.score_thr=0.0',
        *NO_WORKERS,
    )
    with open(metrics) as f:
        assert 'coco/bbox_mAP' in json.load(f)
    # --show-dir: every test image drawn, under its own name; --out: every prediction
    assert sorted(os.listdir(show)) == sorted(os.listdir(osp.join(coco, 'val')))
    with open(out, 'rb') as f:
        results = pickle.load(f)
    assert len(results) == 4
    assert all(int(r['pred_instances']['labels'].max()) <= 1 for r in results)


def test_image_demo_draws_a_folder_with_the_work_dirs_config(coco, trained, tmp_path):
    """The runner writes the rewritten config into the work dir: with it the checkpoint loads
    in tools/image_demo.py, which draws every image of a folder."""
    work, _ = trained
    out = tmp_path / 'drawn'
    _, log = run_script_here(
        'tools/image_demo.py',
        osp.join(work, 'retinanet_repa_swin_shapes.py'),
        osp.join(work, 'epoch_1.pth'),
        osp.join(coco, 'val'),
        '--out-dir',
        str(out),
    )
    assert sorted(os.listdir(out)) == sorted(os.listdir(osp.join(coco, 'val')))
    assert log.count('wrote ') == 4
    _, log = run_script_here(
        'tools/image_demo.py',
        DEMO,
        osp.join(work, 'epoch_1.pth'),
        osp.join(coco, 'val'),
        '--out-file',
        str(tmp_path / 'x.png'),
        ok=False,
    )
    assert log.splitlines()[-1].endswith('is a folder: write its pictures with --out-dir')


def test_a_wrong_data_root_is_one_line(tmp_path):
    _, log = run_script_here(
        'tools/train.py', DEMO, '--data-root', str(tmp_path / 'none'), ok=False
    )
    assert (
        log.splitlines()[-1] == f'tools/train.py: --data-root {tmp_path / "none"}: no such '
        'directory'
    )


# ----------------------------------------------------------------------------------- mmseg


@pytest.fixture(scope='module')
def ade(tmp_path_factory):
    """The shapes set in ADE20K's layout: label 0 ignored, 1 background, 2..4 the shapes."""
    return make_shapes_ade20k(str(tmp_path_factory.mktemp('own') / 'ade'), num_train=2, num_val=2)


def test_segmentation_classes_from_classes_txt(ade):
    with open(osp.join(ade, 'classes.txt'), 'w') as f:
        f.write('ground\nround\nbox\nwedge\n')
    cfg = load_config(
        osp.join(ROOT, 'configs', 'repa_swin', 'upernet_repa_swin_t_512x512_160k_ade20k.py')
    )
    use_own_data(cfg, ade)
    assert cfg.model.decode_head.num_classes == 4
    assert cfg.model.auxiliary_head.num_classes == 4
    from mmseg.registry import DATASETS

    init_default_scope('mmseg')
    for loader, n in (('train_dataloader', 2), ('test_dataloader', 2)):
        dataset = DATASETS.build(cfg[loader].dataset)
        assert len(dataset) == n
        assert dataset.metainfo['classes'] == ('ground', 'round', 'box', 'wedge')
        assert dataset.reduce_zero_label  # ADE20K's convention, as the config's data set
    # --classes instead of the file; more classes than the maps use are fine
    cfg = load_config(osp.join(ROOT, 'configs', 'demo', 'upernet_repa_convformer_shapes.py'))
    use_own_data(cfg, ade, classes=['a', 'b', 'c', 'd', 'e'])
    assert cfg.model.decode_head.num_classes == 5


def test_segmentation_without_enough_class_names_is_refused(ade, tmp_path):
    config = osp.join(ROOT, 'configs', 'demo', 'upernet_repa_convformer_shapes.py')
    with pytest.raises(ConfigError, match=r'label value 4 but 3 classes were given'):
        use_own_data(load_config(config), ade, classes=['a', 'b', 'c'])
    bare = str(tmp_path / 'bare')
    shutil.copytree(ade, bare, ignore=shutil.ignore_patterns('classes.txt'))
    with pytest.raises(ConfigError, match='pass --classes a,b,c or write .*classes.txt'):
        use_own_data(load_config(config), bare)


# ------------------------------------------------------------------------------ mmpretrain


def test_classification_classes_from_the_folders(tmp_path):
    root = make_shapes_classification(str(tmp_path / 'cls'), num_train=9, num_val=6)
    for split in ('train', 'val'):  # a class renamed, one added: 4 classes
        os.rename(osp.join(root, split, 'triangle'), osp.join(root, split, 'wedge'))
        os.makedirs(osp.join(root, split, 'blob'))
        first = sorted(os.listdir(osp.join(root, split, 'circle')))[0]
        shutil.copy(osp.join(root, split, 'circle', first), osp.join(root, split, 'blob'))
    imagenet = load_config(osp.join(ROOT, 'configs', 'repa_swin', 'repa_swin_t_32xb128_in1k.py'))
    use_own_data(imagenet, root)
    assert imagenet.model.head.num_classes == 4
    assert imagenet.data_preprocessor.num_classes == 4
    assert imagenet.val_evaluator.topk == (1,)  # top-5 of 4 classes cannot be computed
    from mmpretrain.registry import DATASETS

    init_default_scope('mmpretrain')
    dataset = DATASETS.build(imagenet.val_dataloader.dataset)
    assert dataset.metainfo['classes'] == ('blob', 'circle', 'square', 'wedge')
    assert len(dataset) == 7
    # the labels follow each split's sorted folders: a split without a class is refused
    shutil.rmtree(osp.join(root, 'val', 'blob'))
    with pytest.raises(
        ConfigError,
        match='other class folders than the first split '
        r'\(missing blob\)',
    ):
        use_own_data(
            load_config(osp.join(ROOT, 'configs', 'demo', 'classifier_repa_caformer_shapes.py')),
            root,
        )


# ------------------------------------------------------- every documented layout, every split

RETINANET = osp.join(ROOT, 'configs', 'repa_swin', 'retinanet_repa_swin_t_1x_coco.py')
LOADER_SPLITS = [(f'{split}_dataloader', split) for split in ('train', 'val', 'test')]

# docs/training.md's COCO layouts: (annotation file, image folder) of split {s}
COCO_LAYOUTS = {
    'split folders': ('annotations/{s}.json', '{s}'),
    'images/split': ('annotations/{s}.json', 'images/{s}'),
    'images flat': ('annotations/{s}.json', 'images'),
    'root flat': ('annotations/{s}.json', ''),
    "COCO's names": ('annotations/instances_{s}2017.json', '{s}2017'),
}


def arrange_coco(src, dst, layout, splits):
    """``src``'s train and val sets (val again as test) in ``layout``; every image renamed
    ``{split}_NAME`` so that the flat layouts hold each split's images apart."""
    ann_pattern, img_pattern = COCO_LAYOUTS[layout]
    for s in splits:
        source = 'val' if s == 'test' else s
        with open(osp.join(src, 'annotations', f'{source}.json')) as f:
            coco = json.load(f)
        folder = osp.join(dst, img_pattern.format(s=s))
        os.makedirs(folder, exist_ok=True)
        for image in coco['images']:
            name = f'{s}_{image["file_name"]}'
            shutil.copy(osp.join(src, source, image['file_name']), osp.join(folder, name))
            image['file_name'] = name
        ann_file = osp.join(dst, ann_pattern.format(s=s))
        os.makedirs(osp.dirname(ann_file), exist_ok=True)
        with open(ann_file, 'w') as f:
            json.dump(coco, f)
    return dst


def first_items(cfg, scope):
    """Each loader's data set as the runner builds it, and its first sample through the
    pipeline (which reads the image from where the data set says it is)."""
    registry = __import__(f'{scope}.registry', fromlist=['DATASETS']).DATASETS
    init_default_scope(scope)
    for loader, split in LOADER_SPLITS:
        dataset = registry.build(cfg[loader].dataset)
        yield split, dataset, dataset[0]


@pytest.mark.parametrize('with_test', [True, False], ids=['test split', 'test falls back to val'])
@pytest.mark.parametrize('layout', COCO_LAYOUTS)
def test_every_coco_layout_serves_every_split(coco, tmp_path, layout, with_test):
    splits = ('train', 'val', 'test') if with_test else ('train', 'val')
    root = arrange_coco(coco, str(tmp_path / 'data'), layout, splits)
    cfg = load_config(RETINANET)  # COCO's 80 classes; the data has 2 others
    line = use_own_data(cfg, root)
    assert line.startswith(f'--data-root {root}: 2 classes (disc, square)'), line
    assert cfg.model.bbox_head.num_classes == 2
    for split, dataset, item in first_items(cfg, 'mmdet'):
        read = 'val' if split == 'test' and not with_test else split
        assert dataset.metainfo['classes'] == ('disc', 'square')
        folder = osp.join(root, COCO_LAYOUTS[layout][1].format(s=read), f'{read}_')
        paths = [dataset.get_data_info(i)['img_path'] for i in range(len(dataset))]
        assert paths and all(p.startswith(folder) and osp.isfile(p) for p in paths), paths
        assert item['data_samples'].img_path == paths[0]


@pytest.mark.parametrize('with_test', [True, False], ids=['test split', 'test falls back to val'])
def test_the_ade20k_layout_serves_every_split(ade, tmp_path, with_test):
    root = str(tmp_path / 'ade')
    shutil.copytree(ade, root)
    if with_test:  # ADE20K's test images are 'testing'
        for kind in ('images', 'annotations'):
            shutil.copytree(osp.join(root, kind, 'validation'), osp.join(root, kind, 'testing'))
    with open(osp.join(root, 'classes.txt'), 'w') as f:
        f.write('ground\nround\nbox\nwedge\n')
    cfg = load_config(
        osp.join(ROOT, 'configs', 'repa_swin', 'upernet_repa_swin_t_512x512_160k_ade20k.py')
    )
    use_own_data(cfg, root)
    assert cfg.model.decode_head.num_classes == 4
    for split, dataset, item in first_items(cfg, 'mmseg'):
        read = dict(train='training', val='validation').get(split, 'testing')
        read = 'validation' if split == 'test' and not with_test else read
        assert dataset.metainfo['classes'] == ('ground', 'round', 'box', 'wedge')
        assert osp.dirname(item['data_samples'].img_path) == osp.join(root, 'images', read)
        assert osp.dirname(item['data_samples'].seg_map_path) == osp.join(root, 'annotations', read)


@pytest.mark.parametrize('with_test', [True, False], ids=['test split', 'test falls back to val'])
def test_the_folder_per_class_layout_serves_every_split(tmp_path, with_test):
    root = make_shapes_classification(str(tmp_path / 'cls'), num_train=6, num_val=3)
    for split in ('train', 'val'):  # names the ImageNet config does not have
        os.rename(osp.join(root, split, 'triangle'), osp.join(root, split, 'wedge'))
    if with_test:
        shutil.copytree(osp.join(root, 'val'), osp.join(root, 'test'))
    cfg = load_config(osp.join(ROOT, 'configs', 'repa_swin', 'repa_swin_t_32xb128_in1k.py'))
    use_own_data(cfg, root)
    assert cfg.model.head.num_classes == 3
    for split, dataset, item in first_items(cfg, 'mmpretrain'):
        read = 'val' if split == 'test' and not with_test else split
        assert dataset.metainfo['classes'] == ('circle', 'square', 'wedge')
        assert item['data_samples'].img_path.startswith(osp.join(root, read, ''))


def test_self_supervised_pretraining_reads_the_images_without_labels(tmp_path):
    """D-MAE's pre-training config (a model without classes): the class folders' images, no
    labels, the model untouched (it has no num_classes to set)."""
    root = make_shapes_classification(str(tmp_path / 'cls'), num_train=6, num_val=3)
    config = 'dmae_depthrep_vit_tiny_d6_8xb128_pretrain_in1k.py'
    cfg = load_config(osp.join(ROOT, 'configs', 'depth_rep_vit', config))
    model = cfg.model.to_dict()
    line = use_own_data(cfg, root)
    assert '\n' not in line and 'without labels' in line and 'train: train/' in line, line
    assert cfg.model.to_dict() == model
    init_default_scope('mmpretrain')
    dataset = __import__('mmpretrain.registry', fromlist=['DATASETS']).DATASETS.build(
        cfg.train_dataloader.dataset
    )
    images = [f for _, _, files in os.walk(osp.join(root, 'train')) for f in files]
    assert len(dataset) == len(images) > 0
    item = dataset[0]
    assert item['data_samples'].img_path.startswith(osp.join(root, 'train', ''))
    assert 'gt_label' not in item['data_samples']
