import os.path as osp

from setuptools import find_packages, setup


def read_version():
    scope = {}
    with open(osp.join(osp.dirname(__file__), 'mmrepa', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


setup(
    name='mmrepa',
    version=read_version(),
    description='Reparameterizable vision backbones for OpenMMLab detection and segmentation',
    long_description=open('README.md').read() if osp.exists('README.md') else '',
    long_description_content_type='text/markdown',
    packages=find_packages(exclude=('configs', 'tools', 'tests')),
    python_requires='>=3.9',
    # mmcv is not listed: it must be compiled against the installed torch (tools/install_deps.sh).
    install_requires=['torch>=2.0', 'mmengine>=0.10,<1.0', 'timm>=1.0'],
    license='Apache-2.0',
    zip_safe=False,
)
