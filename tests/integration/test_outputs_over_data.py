"""No tool writes over a file of its data: an output naming an existing image inside a data
folder the config reads is refused before anything runs (issue 39, finding 7), as outputs
over the folders themselves were."""

import os.path as osp

from mmrepa.datasets import make_shapes_coco
from tests.helpers import DEMO, run_script_here, shapes_cfg_options


def test_test_py_will_not_dump_its_metrics_over_a_test_image(tmp_path):
    data = make_shapes_coco(str(tmp_path / 'data'), num_train=1, num_val=1, size=32) + '/'
    image = osp.join(data, 'val', '00000.png')
    before = open(image, 'rb').read()
    checkpoint = tmp_path / 'x.pth'
    checkpoint.write_bytes(b'')
    for option in ('--dump-metrics', '--out'):
        target = image if option == '--dump-metrics' else osp.join(data, 'val', '00000.pkl')
        if option == '--out':  # an existing file of the data that is not an image
            open(target, 'wb').close()
        _, log = run_script_here(
            'tools/test.py',
            DEMO,
            str(checkpoint),
            option,
            target,
            '--work-dir',
            str(tmp_path / 'work'),
            '--cfg-options',
            *shapes_cfg_options(data),
            ok=False,
        )
        assert log.strip() == (
            f'tools/test.py: {option} {target} is a file of the input test image directory '
            f'{data}val/: an output never replaces an input; write it elsewhere'
        ), log
    assert open(image, 'rb').read() == before
    # a new file in the data folder replaces nothing: not refused for that
    _, log = run_script_here(
        'tools/test.py',
        DEMO,
        str(checkpoint),
        '--dump-metrics',
        osp.join(data, 'new.json'),
        '--cfg-options',
        *shapes_cfg_options(data),
        ok=False,
    )
    assert 'an output never replaces an input' not in log


def test_image_demo_refuses_two_images_drawn_to_one_picture(tmp_path):
    data = make_shapes_coco(str(tmp_path / 'data'), num_train=1, num_val=1, size=32)
    folder = tmp_path / 'images'
    folder.mkdir()
    png = open(osp.join(data, 'val', '00000.png'), 'rb').read()
    for name in ('a.jpg', 'a.png', 'a.jpg.png'):  # a.jpg -> a.jpg.png, a.png -> a.png.png
        (folder / name).write_bytes(png)
    checkpoint = tmp_path / 'x.pth'
    checkpoint.write_bytes(b'')
    out = tmp_path / 'drawn'
    _, log = run_script_here(
        'tools/image_demo.py', DEMO, str(checkpoint), str(folder), '--out-dir', str(out), ok=False
    )
    assert log.strip() == (
        f'image_demo.py: {folder}/a.jpg and {folder}/a.jpg.png would both be drawn to '
        f'{out}/a.jpg.png; rename one of them or draw them apart'
    ), log
    assert not out.exists()


def test_show_dir_refuses_test_images_of_one_name(tmp_path):
    import json
    import shutil

    import torch

    from mmrepa.apis import init_model

    data = make_shapes_coco(str(tmp_path / 'data'), num_train=1, num_val=2, size=32)
    path = osp.join(data, 'annotations', 'val.json')
    with open(path) as f:
        coco = json.load(f)
    for folder, image in zip(('a', 'b'), coco['images']):  # a/0.png and b/0.png
        os_folder = osp.join(data, 'val', folder)
        shutil.os.makedirs(os_folder)
        shutil.copy(osp.join(data, 'val', image['file_name']), osp.join(os_folder, '0.png'))
        image['file_name'] = f'{folder}/0.png'
    with open(path, 'w') as f:
        json.dump(coco, f)
    checkpoint = str(tmp_path / 'model.pth')
    torch.save(dict(state_dict=init_model(DEMO).state_dict()), checkpoint)
    show = tmp_path / 'show'
    _, log = run_script_here(
        'tools/test.py',
        DEMO,
        checkpoint,
        '--show-dir',
        str(show),
        '--work-dir',
        str(tmp_path / 'work'),
        '--cfg-options',
        *shapes_cfg_options(data + '/'),
        ok=False,
    )
    val = osp.join(data, 'val')
    assert log.strip().splitlines()[-1] == (
        f'tools/test.py: --show-dir: the test images {val}/a/0.png and {val}/b/0.png would both '
        f"be drawn to {show}/0.png (mmdet's hook names a picture by its image's file name): "
        'rename one of them'
    ), log[-2000:]
    assert not show.exists()


def test_the_own_data_roots_images_are_inputs_too(tmp_path):
    data = make_shapes_coco(str(tmp_path / 'data'), num_train=1, num_val=1, size=32)
    image = osp.join(data, 'val', '00000.png')
    checkpoint = tmp_path / 'x.pth'
    checkpoint.write_bytes(b'')
    _, log = run_script_here(
        'tools/test.py',
        DEMO,
        str(checkpoint),
        '--data-root',
        data,
        '--dump-metrics',
        image,
        '--work-dir',
        str(tmp_path / 'work'),
        ok=False,
    )  # the command: a test image replaced by JSON, exit 0
    assert (
        log.strip()
        .splitlines()[-1]
        .startswith(
            f'tools/test.py: --dump-metrics {image} is a file of the input test image directory'
        )
    ), log
