"""Check, without a GPU, that the wheel folder completes the GPU machine's image.

    .venv/bin/python tools/gpu/check_wheels.py [--wheels .whl] [--smoke]

1. Every requirement of every wheel in the folder (``Requires-Dist``, markers evaluated for
   Python 3.12 on Linux, extras left out) is met by another wheel of the folder or by a
   package of the image (``IMAGE_PACKAGES``: the device tool's KINDS.md, "Python packages
   already there", as read on 2026-11-17); every wheel is pure Python.
2. The image is imitated here: a folder of links to what this environment has of the image's
   packages and of everything they need (the closure of their requirements, e.g. torch's
   nvidia-* libraries), and nothing else: no mmengine, mmcv, mmpretrain, mmdet, mmseg. The
   wheels are installed into a temporary ``--target`` folder, as tools/gpu/run_tier.sh does
   there, and this interpreter is started with ``-S`` (no site-packages) on
   ``PYTHONPATH=<wheels>:<image>:<checkout>``: ``import mmrepa, mmrepa.backbones,
   mmpretrain.models``, mmcv and mmengine's versions, and that no module came from this
   environment's own site-packages.
3. With ``--smoke``: benchmarks/gpu_throughput.py's CPU smoke test in that environment.

What it cannot check here: Python 3.12 (this is 3.11; the wheels are pure Python, so only code
that breaks on 3.12 itself would differ), torch 2.11 (here 2.14), CUDA. Exit status 1 on any
failure.
"""

import argparse
import os
import os.path as osp
import re
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

# /work/.library/device/KINDS.md, "Python packages already there" (nvidia-h100-x1,
# nvidia-h200; read on a machine on 2026-11-17)
IMAGE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
xarray xxhash yarl zipp
""".split()
# a requirement met under another name: the image's OpenCV is the headless build (same cv2)
SAME_AS = {'opencv-python': 'opencv-python-headless'}
# what the GPU machine's interpreter evaluates markers as
TARGET_MARKERS = dict(
    default_environment(),
    python_version='3.12',
    python_full_version='3.12.3',
    sys_platform='linux',
    platform_system='Linux',
    platform_machine='x86_64',
    implementation_name='cpython',
)
IMPORTS = """
import os, sys
import torch, mmengine, mmcv, mmpretrain
import mmrepa, mmrepa.backbones, mmrepa.heads
import mmpretrain.models
from mmrepa.apis import init_model
site = {site!r}
own = [m.__name__ for m in list(sys.modules.values())
       if getattr(m, '__file__', None) and os.path.realpath(m.__file__).startswith(site)
       and m.__name__.split('.')[0] in {{'mmengine', 'mmcv', 'mmpretrain', 'mmdet', 'mmseg'}}]
assert not own, f'imported from this environment, not the wheels: {{own[:5]}}'
assert mmcv.__version__ == '2.1.0' and mmengine.__version__ == '0.10.7', (
    mmcv.__version__, mmengine.__version__)
assert mmpretrain.__version__ == '1.2.0', mmpretrain.__version__
for name in ('mmdet', 'mmseg'):
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise AssertionError(f'{{name}} imports: the imitated image is not bare')
print(f'imports ok: torch {{torch.__version__}}, mmengine {{mmengine.__version__}}, '
      f'mmcv {{mmcv.__version__}} (lite), mmpretrain {{mmpretrain.__version__}}, '
      f'mmrepa {{mmrepa.__version__}} from {{os.path.dirname(mmrepa.__file__)}}')
"""


def norm(name: str) -> str:
    return re.sub(r'[-_.]+', '-', name).lower()


def wheel_requirements(path: str):
    """(project name, [Requirement]) of a wheel file."""
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))
        text = z.read(name).decode()
    project = re.search(r'^Name: (.+)$', text, re.M).group(1).strip()
    reqs = [
        Requirement(line[len('Requires-Dist:') :].strip())
        for line in text.splitlines()
        if line.startswith('Requires-Dist:')
    ]
    return project, reqs


def needed(req: Requirement) -> bool:
    """Whether ``req`` applies on the GPU machine without extras."""
    if req.marker is None:
        return True
    return req.marker.evaluate(dict(TARGET_MARKERS, extra=''))


def check_requirements(wheels: list) -> list:
    """The unmet requirements (``'wheel: requirement'``) and impure wheels."""
    problems, projects, reqs = [], {}, []
    for path in wheels:
        base = osp.basename(path)
        if not (base.endswith('-py3-none-any.whl') or base.endswith('-py2.py3-none-any.whl')):
            problems.append(f'{base}: not pure Python (the GPU machine runs Python 3.12)')
        project, wheel_reqs = wheel_requirements(path)
        projects[norm(project)] = base
        reqs += [(base, r) for r in wheel_reqs if needed(r)]
    image = {norm(n) for n in IMAGE_PACKAGES}
    for base, req in reqs:
        name = norm(SAME_AS.get(norm(req.name), req.name))
        if name not in projects and name not in image:
            problems.append(f'{base}: needs {req}, neither in the folder nor in the image')
    return problems


def closure(names) -> list:
    """The installed distributions of ``names`` and everything they need, recursively."""
    seen, todo, found = set(), [norm(n) for n in names], []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:  # the image's headless OpenCV is this environment's opencv-python, say
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            alias = [k for k, v in SAME_AS.items() if v == name]
            if alias:
                todo += alias
            continue
        found.append(dist)
        for line in dist.requires or ():
            req = Requirement(line)
            if needed(req):
                todo.append(norm(req.name))
    return found


def imitate_image(folder: str) -> int:
    """Links in ``folder`` to the top-level entries of the image's packages as this
    environment has them; the number of distributions linked."""
    dists = closure(IMAGE_PACKAGES)
    for dist in dists:
        tops = {f.parts[0] for f in dist.files or () if f.parts and f.parts[0] != '..'}
        for top in tops:
            src = osp.join(str(dist.locate_file('')), top)
            dst = osp.join(folder, top)
            if osp.exists(src) and not osp.lexists(dst) and top not in ('bin', '__pycache__'):
                os.symlink(src, dst)
    return len(dists)


def run(what: str, cmd, env) -> int:
    print(f'{what}: {" ".join(c if len(c) < 80 else c[:40] + "..." for c in cmd)}', flush=True)
    return subprocess.run(cmd, env=env, cwd=ROOT).returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument('--wheels', default=osp.join(ROOT, '.whl'))
    parser.add_argument(
        '--smoke', action='store_true', help="also run gpu_throughput.py's CPU smoke test"
    )
    args = parser.parse_args(argv)
    wheels = sorted(osp.join(args.wheels, n) for n in os.listdir(args.wheels) if n.endswith('.whl'))
    if not wheels:
        print(f'no wheels in {args.wheels}: run tools/gpu/build_wheels.sh first')
        return 1
    problems = check_requirements(wheels)
    for p in problems:
        print('unmet:', p)
    if problems:
        return 1
    print(f'requirements: {len(wheels)} wheels, each need met by the folder or the image')

    with tempfile.TemporaryDirectory() as tmp:
        site, image = osp.join(tmp, 'site'), osp.join(tmp, 'image')
        os.makedirs(image)
        count = imitate_image(image)
        print(f'imitated image: {count} distributions of this environment linked into {image}')
        env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONHOME')}
        pip = [
            sys.executable,
            '-m',
            'pip',
            'install',
            '-q',
            '--no-index',
            '--no-deps',
            '--no-compile',
            '--no-cache-dir',
            '--upgrade',
            '--target',
            site,
            *wheels,
        ]
        rc = run('install', pip, env)
        if rc:
            return rc
        env['PYTHONPATH'] = os.pathsep.join([site, image, ROOT])
        own_site = next(p for p in sys.path if p.endswith('site-packages'))
        rc = run('imports', [sys.executable, '-S', '-c', IMPORTS.format(site=own_site)], env)
        if rc or not args.smoke:
            return rc
        out = osp.join(tmp, 'gpu_throughput.json')
        smoke = [
            sys.executable,
            '-S',
            'benchmarks/gpu_throughput.py',
            '--device',
            'cpu',
            '--tiny',
            '--batch',
            '2',
            '--repeat',
            '1',
            '--warmup',
            '0',
            '--out',
            out,
        ]
        return run('smoke test', smoke, dict(env, OMP_NUM_THREADS='1'))


if __name__ == '__main__':
    sys.exit(main())
