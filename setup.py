import os
import os.path as osp
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = osp.dirname(osp.abspath(__file__))
# What OpenMMLab's mim looks for in <package>/.mim: the configs (found by name), the tools it
# runs (`mim train mmrepa ...` runs .mim/tools/train.py) and the model index (`mim search`).
MIM_FILES = ('configs', 'tools', 'model-index.yml')


def read_version():
    scope = {}
    with open(osp.join(ROOT, 'mmrepa', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


def _remove(path):
    if osp.islink(path) or osp.isfile(path):
        os.remove(path)
    elif osp.isdir(path):
        shutil.rmtree(path)


def link_mim_files(mim_dir=osp.join(ROOT, 'mmrepa', '.mim')):
    """Symlink ``MIM_FILES`` into ``mmrepa/.mim`` of the source tree (relative links, so the
    checkout can move): an editable install then serves the live configs and tools, and the
    model index once ``tools/misc/gen_metafiles.py`` has written it. Where symlinks are not
    allowed, copies what exists instead."""
    os.makedirs(mim_dir, exist_ok=True)
    for name in MIM_FILES:
        src, dst = osp.join(ROOT, name), osp.join(mim_dir, name)
        _remove(dst)
        try:
            os.symlink(osp.relpath(src, mim_dir), dst)
        except OSError:
            if osp.exists(src):
                _copy(src, dst)


def _copy(src, dst):
    if osp.isdir(src):
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
    else:
        shutil.copyfile(src, dst)


class BuildPyWithMim(build_py):
    """``build_py`` that also provides ``mmrepa/.mim``: copies in the build directory for a
    wheel, symlinks in the source tree for an editable install (setuptools runs build_py in
    editable mode then, and the package is imported from the source tree)."""

    def run(self):
        super().run()
        if getattr(self, 'editable_mode', False):
            link_mim_files()
            return
        mim_dir = osp.join(self.build_lib, 'mmrepa', '.mim')
        os.makedirs(mim_dir, exist_ok=True)
        for name in MIM_FILES:
            src, dst = osp.join(ROOT, name), osp.join(mim_dir, name)
            if osp.exists(src):
                _remove(dst)
                _copy(src, dst)


setup(
    name='mmrepa',
    version=read_version(),
    description='Reparameterizable vision backbones for OpenMMLab detection and segmentation',
    long_description=(
        open(osp.join(ROOT, 'README.md')).read() if osp.exists(osp.join(ROOT, 'README.md')) else ''
    ),
    long_description_content_type='text/markdown',
    packages=find_packages(exclude=('configs', 'tools', 'tests')),
    python_requires='>=3.9',
    # What `import mmrepa` imports. tools/install_deps.sh installs the tested versions (mmcv
    # compiled against the installed torch) and then this package with --no-deps.
    install_requires=['torch>=2.0', 'mmengine>=0.10,<1.0', 'mmcv>=2.0,<2.2', 'numpy'],
    # Each imported only where it is used (tests/integration/test_requirements.py holds this
    # list to the imports of mmrepa/). mmdeploy is not here: its protobuf pin breaks onnx, so
    # tools/install_deps.sh installs it without dependencies (requirements/deploy.txt).
    extras_require={
        # loading released checkpoints by timm's conversions (the MetaFormer releases' names,
        # Swin position tables of another size)
        'timm': ['timm>=1.0'],
        'mmdet': ['mmdet>=3.0,<4.0'],
        # mmseg 1.2.2 imports ftfy and regex without declaring them
        'mmseg': ['mmsegmentation>=1.0,<2.0', 'ftfy', 'regex'],
        # the token-labelling data set imports torchvision, which mmpretrain does not declare
        'mmpretrain': ['mmpretrain>=1.0,<2.0', 'torchvision'],
        'onnx': ['onnx>=1.16', 'onnxruntime>=1.18'],
        'openvino': ['openvino>=2026.4', 'nncf>=3.4'],
    },
    license='Apache-2.0',
    zip_safe=False,
    cmdclass={'build_py': BuildPyWithMim},
)
