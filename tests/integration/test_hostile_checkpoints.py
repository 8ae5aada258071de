"""Hostile checkpoints, through every way mmrepa reads one: nothing the file says runs, nothing in
the process changes, each stops with one line (or loads as inert data); the release layouts and
mmengine's own checkpoints still load, and resume still works.

The files are made here, at test time: payloads through ``__reduce__`` (what ``torch.save``
writes for any object) and gadgets as raw protocol-2 opcodes (:class:`Raw`), in torch's zip and
legacy formats. A payload that ran would only create a marker file in a temporary folder.
"""

import argparse
import ast
import copy
import functools
import io
import os
import os.path as osp
import pickle
import struct
import subprocess
import sys
import tarfile
import types
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import checkpoint as mm_checkpoint
from mmengine.runner import load_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader
from torch import _weights_only_unpickler

import mmrepa  # noqa: F401  installs the loader
from mmrepa.apis import init_model
from mmrepa.backbones import RePaSwin, RepOptVGG
from mmrepa.checkpoint import CheckpointError, ForeignConfig, ForeignNamespace, load_checkpoint_file
from mmrepa.checkpoint.restricted_load import OUR_GLOBALS, _entry_name, our_allow_list
from mmrepa.checkpoint.schemes import SCHEMES
from tests.helpers import DEMO, ROOT, TINY_ARCH, run_script_here

TINY_VGG = dict(depths=(2, 2, 2, 1), widths=(8, 16, 16, 32), stem_width=8)


def weights(scale=1.0):
    torch.manual_seed(0)
    model = RePaSwin(TINY_ARCH, window_size=3)
    return {k: v * scale if v.is_floating_point() else v for k, v in model.state_dict().items()}


# ------------------------------------------------------------------ writing pickles by hand


class Raw:
    """Pickled as these protocol-2 opcodes, verbatim; they leave one object on the stack."""

    def __init__(self, ops: bytes):
        self.ops = ops


class _RawPickler(pickle._Pickler):  # the Python pickler: its save() can be extended
    def save(self, obj, save_persistent_id=True):
        if type(obj) is Raw:
            self.write(obj.ops)
            return
        super().save(obj, save_persistent_id)


RAW_PICKLE = types.ModuleType('raw_pickle')
RAW_PICKLE.Pickler, RAW_PICKLE.dump = _RawPickler, pickle.dump


def g(module, name):  # GLOBAL
    return b'c' + module.encode() + b'\n' + name.encode() + b'\n'


def s(text):  # BINUNICODE
    data = text.encode()
    return b'X' + struct.pack('<I', len(data)) + data


def i(n):  # BININT
    return b'J' + struct.pack('<i', n)


NONE, TRUE, FALSE = b'N', b'\x88', b'\x89'


def tup(*items):
    return b'(' + b''.join(items) + b't'


def call(func, *args):  # REDUCE
    return func + tup(*args) + b'R'


def new(cls, *args):  # NEWOBJ
    return cls + tup(*args) + b'\x81'


def build(obj, state):  # BUILD
    return obj + state + b'b'


def dct(*pairs):
    return b'}' + (b'(' + b''.join(k + v for k, v in pairs) + b'u' if pairs else b'')


def lst(*items):
    return b']' + (b'(' + b''.join(items) + b'e' if items else b'')


def raw_bytes(data):  # protocol 2 writes bytes as _codecs.encode(str, 'latin1')
    return call(g('_codecs', 'encode'), s(data.decode('latin1')), s('latin1'))


def put(n):
    return b'r' + struct.pack('<I', n)


def get(n):
    return b'j' + struct.pack('<I', n)


HB = g('mmengine.logging.history_buffer', 'HistoryBuffer')
GETATTR = g('__builtin__', 'getattr')
NP_DTYPE = g('numpy', 'dtype')
F8 = build(
    call(NP_DTYPE, s('f8'), FALSE, TRUE), tup(i(3), s('<'), NONE, NONE, NONE, i(-1), i(-1), i(0))
)


def np_array(values, dtype_ops=F8):
    data = np.asarray(values, np.float64).tobytes()
    empty = call(
        g('numpy.core.multiarray', '_reconstruct'),
        g('numpy', 'ndarray'),
        tup(i(0)),
        raw_bytes(b'b'),
    )
    return build(empty, tup(i(1), tup(i(len(values))), dtype_ops, FALSE, raw_bytes(data)))


def history_buffer(statistics):
    state = dct(
        (s('max_length'), i(1000)),
        (s('_log_history'), np_array([1.0, 2.0])),
        (s('_count_history'), np_array([1.0, 1.0])),
        (s('statistics_methods'), dct(*statistics)),
    )
    return build(new(HB), state)


class Calls:
    """Pickled as ``fn(*args)`` (what a ``__reduce__`` payload looks like)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def legacy_tar(marker):
    """torch's pre-1.0 tar format: torch would unpack 'storages' into a temporary directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode='w', format=tarfile.PAX_FORMAT) as tar:
        for name, data in (
            ('sys_info', pickle.dumps({'protocol_version': 1000}, 2)),
            ('pickle', pickle.dumps(Calls(os.system, f'touch {marker}'), 2)),
            ('tensors', pickle.dumps(0, 2)),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo('storages')
        link.type, link.linkname = tarfile.SYMTYPE, str(marker)
        tar.addfile(link)
    return buf.getvalue()


# name -> (what the file holds besides the weights, given the marker path; outcome).
# 'refused': every entry point raises CheckpointError naming the file. 'inert': it loads, and
# the check of the same name in INERT_CHECKS holds.
HOSTILE = {
    'os_system': (lambda m: Calls(os.system, f'touch {m}'), 'refused'),
    'exec': (lambda m: Calls(exec, f'open({str(m)!r}, "w").close()'), 'refused'),
    'subprocess': (lambda m: Calls(subprocess.check_call, ['touch', str(m)]), 'refused'),
    'eval_nested': (lambda m: [{'deep': (1, Calls(eval, f'open({str(m)!r}, "w")'))}], 'refused'),
    # getattr(getattr(HistoryBuffer.__init__, '__builtins__'), 'get')('exec')(code)
    'getattr_chain': (
        lambda m: Raw(
            call(
                call(
                    call(
                        GETATTR,
                        call(GETATTR, call(GETATTR, HB, s('__init__')), s('__builtins__')),
                        s('get'),
                    ),
                    s('exec'),
                ),
                s(f'open({str(m)!r}, "w").close()'),
            )
        ),
        'refused',
    ),
    # getattr reaching a dict shared by the process, then SETITEM into it: HistoryBuffer's
    # statistics registry, and the module globals of torch's tensor rebuilding (every later
    # load, even a plain torch.load, would build tensors with another function)
    'getattr_shared_dict': (
        lambda m: Raw(
            call(GETATTR, HB, s('_statistics_methods'))
            + s('mean')
            + g('torch._utils', '_rebuild_tensor')
            + b's'
        ),
        'refused',
    ),
    'getattr_module_globals': (
        lambda m: Raw(
            call(GETATTR, g('torch._utils', '_rebuild_tensor_v2'), s('__globals__'))
            + s('_rebuild_tensor')
            + g('torch._utils', '_rebuild_meta_tensor_no_storage')
            + b's'
        ),
        'refused',
    ),
    # the name getattr gives for a statistics method, called
    'statistics_name_called': (
        lambda m: Raw(call(call(GETATTR, HB, s('mean')), s(str(m)))),
        'refused',
    ),
    # mmengine's HistoryBuffer.__setstate__ would merge these into the registry of all buffers
    'statistics_injection': (
        lambda m: {
            'log_scalars': {
                'loss': Raw(
                    history_buffer(
                        [
                            (s('mean'), call(GETATTR, HB, s('max'))),
                            (s('evil'), g('torch._utils', '_rebuild_tensor')),
                        ]
                    )
                )
            }
        },
        'inert',
    ),
    'build_on_class': (
        lambda m: Raw(build(HB, dct((s('mean'), g('torch._utils', '_rebuild_tensor'))))),
        'refused',
    ),
    'build_on_class_slots': (
        lambda m: Raw(build(HB, tup(NONE, dct((s('_statistics_methods'), dct()))))),
        'refused',
    ),
    'build_on_function': (
        lambda m: Raw(
            build(
                g('torch._utils', '_rebuild_tensor_v2'),
                tup(NONE, dct((s('__defaults__'), tup(NONE)))),
            )
        ),
        'refused',
    ),
    'build_on_tensor_class': (
        lambda m: Raw(
            build(
                g('torch', 'Tensor'),
                tup(NONE, dct((s('__add__'), g('torch._utils', '_rebuild_tensor')))),
            )
        ),
        'refused',
    ),
    'build_on_getattr': (
        lambda m: Raw(build(GETATTR, tup(NONE, dct((s('__doc__'), s('changed')))))),
        'refused',
    ),
    # an attribute on a tensor instance (torch's _rebuild_from_type_v2), as a weight
    'tensor_attribute': (
        lambda m: InStateDict(
            w=Raw(
                call(
                    g('torch._tensor', '_rebuild_from_type_v2'),
                    g('torch', 'Tensor'),
                    g('torch', 'Tensor'),
                    tup(),
                    dct((s('__add__'), g('torch._utils', '_rebuild_tensor'))),
                )
            )
        ),
        'refused',
    ),
    'history_buffer_init': (lambda m: Raw(call(HB, lst(i(1)), lst(i(1)))), 'refused'),
    'rebuild_from_type_init': (
        lambda m: Raw(call(g('torch._tensor', '_rebuild_from_type_v2'), HB, HB, tup(), dct())),
        'refused',
    ),
    # numpy.dtype(copy=False) is numpy's shared float64 dtype: BUILD would rewrite it
    'numpy_shared_dtype': (
        lambda m: Raw(
            build(
                call(NP_DTYPE, s('f8'), FALSE, FALSE),
                tup(
                    i(3), s('|'), NONE, tup(s('a')), dct((s('a'), tup(F8, i(0)))), i(8), i(1), i(0)
                ),
            )
        ),
        'refused',
    ),
    'numpy_object_dtype': (lambda m: Raw(call(NP_DTYPE, s('O'), FALSE, TRUE)), 'refused'),
    # a tensor sharing an array's memory, then the array rebuilt: use after free
    'numpy_shared_memory': (
        lambda m: Raw(
            tup(
                np_array([1.0, 2.0]) + put(900),
                call(
                    g('torch._utils', '_rebuild_device_tensor_from_numpy'),
                    get(900),
                    g('torch', 'float64'),
                    s('cpu'),
                    FALSE,
                ),
            )
        ),
        'refused',
    ),
    'numpy_state_twice': (
        lambda m: Raw(
            build(np_array([1.0]), tup(i(1), tup(i(1000)), F8, FALSE, raw_bytes(b'\0' * 8000)))
        ),
        'refused',
    ),
    'config_node_arguments': (
        lambda m: Raw(call(g('yacs.config', 'CfgNode'), dct((s('a'), i(1))))),
        'refused',
    ),
    'namespace_slot_state': (
        lambda m: Raw(
            build(
                new(g('argparse', 'Namespace')),
                tup(NONE, dct((s('__class__'), g('collections', 'OrderedDict')))),
            )
        ),
        'refused',
    ),
    'namespace_new_arguments': (lambda m: Raw(new(g('argparse', 'Namespace'), s('x'))), 'refused'),
    # special names in a Namespace's state: stored as data, the type keeps its methods
    'namespace_dunders': (
        lambda m: {
            'args': Raw(
                build(
                    new(g('argparse', 'Namespace')),
                    dct(
                        (s('__class__'), g('collections', 'OrderedDict')),
                        (s('__getattr__'), g('torch._utils', '_rebuild_tensor')),
                    ),
                )
            )
        },
        'inert',
    ),
    'parameter_attribute': (lambda m: InStateDict(w=_parameter_with_attribute()), 'refused'),
    'deep_nesting': (lambda m: Raw(b'](' * 30000 + b']' + b'e' * 30000), 'refused'),
}
LEGACY = (
    'os_system',
    'exec',
    'getattr_chain',
    'getattr_module_globals',
    'statistics_injection',
    'build_on_class',
    'build_on_tensor_class',
    'numpy_shared_dtype',
    'numpy_shared_memory',
)
FILES = (
    [(name, 'zip') for name in HOSTILE]
    + [(name, 'legacy') for name in LEGACY]
    + [('legacy_tar', 'tar')]
)


class InStateDict(dict):
    """Entries written into the file's state dict (where the weights checks look), not
    under 'x'."""


def _parameter_with_attribute():
    p = torch.nn.Parameter(torch.ones(2))
    p.note = 'attributes are restored by _rebuild_parameter_with_state'
    return p


def _inert_statistics_injection(ckpt):
    buffer = ckpt['x']['log_scalars']['loss']
    assert type(buffer) is HistoryBuffer and buffer.mean() == 1.5
    assert 'statistics_methods' not in vars(buffer) and 'evil' not in buffer._statistics_methods


def _inert_namespace_dunders(ckpt):
    args = ckpt['x']['args']
    assert type(args) is ForeignNamespace and type(vars(args)['__class__']) is type
    assert not hasattr(ForeignNamespace, '__getattr__')


INERT_CHECKS = {
    'statistics_injection': _inert_statistics_injection,
    'namespace_dunders': _inert_namespace_dunders,
}


_DETECTOR = {}


def detector_weights():
    """The demo detector's weights: a file holding them loads through every entry point
    that takes a detector (init_model, the tool)."""
    if not _DETECTOR:
        _DETECTOR.update(init_model(DEMO).state_dict())
    return dict(_DETECTOR)


def write(path, payload, fmt, state_dict=None):
    if fmt == 'tar':
        path.write_bytes(payload)
        return
    state_dict = weights() if state_dict is None else state_dict
    if isinstance(payload, InStateDict):
        state_dict, payload = {**state_dict, **payload}, None
    torch.save(
        dict(state_dict=state_dict, meta=dict(epoch=1), x=payload),
        path,
        pickle_module=RAW_PICKLE,
        _use_new_zipfile_serialization=fmt == 'zip',
    )


@pytest.fixture(scope='module')
def hostile(tmp_path_factory):
    """{(name, format): path}, and the folder their payloads would write markers into."""
    root = tmp_path_factory.mktemp('hostile')
    markers = root / 'markers'
    markers.mkdir()
    paths = {}
    for name, fmt in FILES:
        marker = markers / f'{name}_{fmt}.MARKER'
        payload = legacy_tar(marker) if fmt == 'tar' else HOSTILE[name][0](marker)
        paths[name, fmt] = root / f'{name}_{fmt}.pth'
        inert = fmt != 'tar' and HOSTILE[name][1] == 'inert'
        write(paths[name, fmt], payload, fmt, detector_weights() if inert else None)
    return paths, markers


# ------------------------------------------------------------- what must not change: a snapshot


def allow_listed():
    """Every object torch's weights_only unpickler may reach by name during our loads."""
    objects = list(_weights_only_unpickler._get_allowed_globals().values())
    for entry in torch.serialization.get_safe_globals() + list(OUR_GLOBALS):
        objects.append(entry[0] if isinstance(entry, tuple) else entry)
    objects += [
        HistoryBuffer,
        torch.Tensor,
        torch.nn.Parameter,
        np.ndarray,
        np.dtype,
        getattr,
        exec,
        eval,
        os.system,
    ]
    return list({id(o): o for o in objects}.values())


def _attributes(obj):
    try:
        attrs = dict(vars(obj))
    except TypeError:
        attrs = {}
    if callable(obj) and not isinstance(obj, type):
        for name in ('__defaults__', '__kwdefaults__', '__code__', '__doc__'):
            attrs[name] = getattr(obj, name, None)
    return {
        k: (v, copy.copy(v) if type(v) in (dict, list, set, OrderedDict) else None)
        for k, v in attrs.items()
    }


def snapshot():
    torch.serialization._get_layout('torch.strided')  # fills torch's own cache once
    f8 = np.dtype('float64')
    return dict(
        attributes={id(o): (o, _attributes(o)) for o in allow_listed()},
        safe_globals=set(map(repr, torch.serialization.get_safe_globals())),
        schemes=dict(CheckpointLoader._schemes),
        statistics=dict(HistoryBuffer._statistics_methods),
        float64=(f8.str, f8.byteorder, f8.fields, f8.names, f8.itemsize),
        default_dtype=torch.get_default_dtype(),
        cwd=os.getcwd(),
    )


def assert_unchanged(before, after):
    for key in ('safe_globals', 'schemes', 'statistics', 'float64', 'default_dtype', 'cwd'):
        assert before[key] == after[key], key
    for key, (obj, attrs) in before['attributes'].items():
        now = after['attributes'][key][1]
        assert attrs.keys() == now.keys(), (obj, attrs.keys() ^ now.keys())
        for name, (value, contents) in attrs.items():
            same = now[name][0] is value or type(value) is str and now[name][0] == value
            assert same and now[name][1] == contents, (obj, name)  # (builtins' __doc__ is new)


@pytest.fixture(scope='module')
def benign(tmp_path_factory):
    """A plain weights file and what a plain torch.load gives for it now. Every entry point
    has read it once: what they import on first use (torch._dynamo registers a safe global)
    is not the doing of a later file."""
    path = tmp_path_factory.mktemp('benign') / 'plain.pth'
    torch.save(dict(state_dict=detector_weights()), path)
    through_every_entry_point(path, refused=False)
    return path, torch.load(path, weights_only=True)


def assert_plain_loads_unchanged(benign):
    path, expected = benign
    got, expected = torch.load(path, weights_only=True)['state_dict'], expected['state_dict']
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    one = torch.ones(2)
    assert torch.equal(one + one, torch.full((2,), 2.0))


# ----------------------------------------------------------------------------- entry points


@functools.cache
def _detector():
    """One demo detector for the module: loading into it is what the entry point does (a
    refused file changes nothing; an inert one loads weights the next file replaces)."""
    return init_model(DEMO)


def _init_cfg(path):
    model = RePaSwin(
        TINY_ARCH, window_size=3, init_cfg=dict(type='Pretrained', checkpoint=str(path))
    )
    model.init_weights()
    return model


def _tool(path, ok):
    """tools/reparameterize.py CONFIG PATH OUT, in this process; its one-line stop raised as
    a CheckpointError."""
    out = osp.join(osp.dirname(str(path)), 'folded_out.pth')
    _, log = run_script_here('tools/reparameterize.py', DEMO, path, out, '--force', ok=ok)
    assert 'Traceback' not in log, log[-2000:]
    if ok:
        os.remove(out)
        return
    assert not osp.exists(out)
    last = log.strip().splitlines()[-1]
    assert last.startswith('tools/reparameterize.py: '), log[-2000:]
    raise CheckpointError(last[len('tools/reparameterize.py: ') :])


ENTRY_POINTS = {
    'load_checkpoint_file': lambda p: load_checkpoint_file(p),
    'CheckpointLoader (init_cfg, load_from, resume)': lambda p: CheckpointLoader.load_checkpoint(
        str(p), map_location='cpu'
    ),
    'mmengine load_checkpoint (load_from)': lambda p: load_checkpoint(
        _detector(), str(p), map_location='cpu'
    ),
    'mmrepa.apis.init_model': lambda p: init_model(DEMO, str(p)),
    'init_cfg Pretrained': _init_cfg,
    'RepOptVGG(scales=)': lambda p: RepOptVGG(TINY_VGG, scales=str(p)),
    'tools/reparameterize.py': _tool,
}


def through_every_entry_point(path, refused: bool):
    """Each entry point raises a one-line CheckpointError (naming the file if ``refused``) or,
    for an inert file, may return."""
    for entry, read in ENTRY_POINTS.items():
        try:
            if read is _tool:
                _tool(path, ok=not refused)
            else:
                read(path)
        except CheckpointError as err:
            message = str(err)
            assert '\n' not in message, (entry, message)
            if refused:
                assert osp.basename(str(path)) in message, (entry, message)
        else:
            assert not refused, f'{entry} loaded {path}'


@pytest.mark.parametrize('name, fmt', FILES, ids=[f'{n}-{f}' for n, f in FILES])
def test_a_hostile_file_runs_nothing_and_changes_nothing(hostile, benign, name, fmt):
    paths, markers = hostile
    path = paths[name, fmt]
    refused = fmt == 'tar' or HOSTILE[name][1] == 'refused'
    before = snapshot()
    if refused:
        with pytest.raises(CheckpointError, match=rf'^{path}'):
            load_checkpoint_file(path)
    else:
        INERT_CHECKS[name](load_checkpoint_file(path))
    through_every_entry_point(path, refused)
    assert not list(markers.iterdir()) and not osp.exists(osp.join(ROOT, 'MARKER'))
    assert_unchanged(before, snapshot())
    assert_plain_loads_unchanged(benign)


def test_other_registrations_of_our_names_are_set_aside_for_the_load(hostile, monkeypatch):
    """Someone registers the real HistoryBuffer (torch's error message suggests it): torch
    would pick it or our stand-in at random; our loads use the stand-in, and the registration
    is back afterwards."""
    paths, _ = hostile
    monkeypatch.setattr(
        _weights_only_unpickler,
        '_marked_safe_globals_set',
        set(_weights_only_unpickler._marked_safe_globals_set),
    )
    torch.serialization.add_safe_globals([HistoryBuffer])
    registry = dict(HistoryBuffer._statistics_methods)
    for fmt in ('zip', 'legacy'):
        ckpt = load_checkpoint_file(paths['statistics_injection', fmt])
        assert type(ckpt['x']['log_scalars']['loss']) is HistoryBuffer
        assert HistoryBuffer._statistics_methods == registry
    with our_allow_list():  # during a load, our names mean our stand-ins only
        during = torch.serialization.get_safe_globals()
    ours = {name for _, name in OUR_GLOBALS}
    assert [e for e in during if _entry_name(e) in ours and e not in OUR_GLOBALS] == []
    assert set(OUR_GLOBALS) <= set(during)
    assert HistoryBuffer in torch.serialization.get_safe_globals()


def test_the_messages_say_what_was_refused(hostile):
    paths, _ = hostile
    cases = {
        ('os_system', 'zip'): r'contains posix\.system, which mmrepa does not load',
        ('exec', 'legacy'): r'contains builtins\.exec, which mmrepa does not load',
        ('getattr_chain', 'zip'): r'refused by the restricted loader \(getattr\(type object, '
        r"'__init__'\)",
        ('build_on_class', 'zip'): r'refused by the restricted loader \(Can only build',
        ('numpy_shared_dtype', 'zip'): r'not that of a numeric dtype',
        ('numpy_shared_memory', 'zip'): r'refused by the restricted loader \(TypeError: '
        r'expected np\.ndarray \(got NumpyArray\)',
        ('parameter_attribute', 'zip'): r"state_dict key 'w' is a tensor carrying hooks or "
        'attributes',
        ('deep_nesting', 'zip'): 'nests its data deeper than any checkpoint',
        ('legacy_tar', 'tar'): r'legacy \.tar format',
    }
    for key, pattern in cases.items():
        with pytest.raises(CheckpointError, match=pattern) as err:
            load_checkpoint_file(paths[key])
        assert str(err.value).startswith(str(paths[key])) and '\n' not in str(err.value)


# --------------------------------------------------------------------------- malformed files

BAD = {
    'integer_key': (
        lambda: dict(state_dict={0: torch.ones(1)}),
        r'state_dict key int 0 is not a parameter name',
    ),
    'string_value': (
        lambda: dict(state_dict=dict(weights(), extra='not a tensor')),
        r"state_dict key 'extra' holds a str, not a tensor",
    ),
    'top_level_list': (lambda: [torch.ones(1)], r'holds a list, not a checkpoint dict'),
    'class_names': (
        lambda: dict(state_dict=weights(), meta=dict(dataset_meta=dict(classes=('cat', 7)))),
        r"'meta\.dataset_meta\.classes' holds a int among its class",
    ),
    'nan_weight': (
        lambda: dict(
            state_dict={
                k: v.clone().fill_(float('nan')) if k == 'norm1.weight' else v
                for k, v in weights().items()
            }
        ),
        r"state_dict key 'norm1\.weight' holds 32 NaN or infinite value",
    ),
    'inf_in_model': (
        lambda: dict(model={'w': torch.tensor([1.0, float('inf')])}),
        r"model key 'w' holds 1 NaN or infinite value",
    ),
    'nine_dims': (
        lambda: dict(state_dict={'w': torch.zeros([1] * 9)}),
        r"state_dict key 'w' has 9 dimensions",
    ),
    'sparse': (
        lambda: dict(state_dict={'w': torch.eye(2).to_sparse()}),
        r"state_dict key 'w' is a torch\.sparse_coo tensor",
    ),
    'metadata': (
        lambda: dict(state_dict=_with_metadata(weights(), {'': {'version': 'x'}})),
        r'the _metadata of state_dict is not a dict of module names',
    ),
}


def _with_metadata(state, metadata):
    state = OrderedDict(state)
    state._metadata = metadata
    return state


@pytest.mark.parametrize('name', BAD)
def test_a_malformed_file_stops_with_one_line_naming_file_and_key(tmp_path, name):
    make, pattern = BAD[name]
    path = tmp_path / f'{name}.pth'
    torch.save(make(), path)
    with pytest.raises(CheckpointError, match=pattern) as err:
        load_checkpoint_file(path)
    assert str(err.value).startswith(str(path))
    through_every_entry_point(path, refused=True)


def test_nan_weights_never_reach_a_model_through_init_cfg(tmp_path):
    state = weights()
    state['stages.0.blocks.0.ffn.fc1.weight'][0, 0] = float('nan')
    path = tmp_path / 'nan.pth'
    torch.save(dict(state_dict=state), path)
    with pytest.raises(
        CheckpointError,
        match=r'nan\.pth: state_dict key '
        r"'stages\.0\.blocks\.0\.ffn\.fc1\.weight' holds 1 NaN",
    ):
        _init_cfg(path)


def test_state_dicts_built_in_memory_are_checked_too():
    with pytest.raises(CheckpointError, match=r'key int 3 is not a parameter name'):
        RepOptVGG(TINY_VGG, scales={3: torch.ones(1)})


# ------------------------------------------------------------------------ URLs: torch.hub cache


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """torch.hub's cache in tmp_path; any download attempt fails the test."""
    monkeypatch.setattr(torch.hub, '_hub_dir', str(tmp_path / 'hub'))
    monkeypatch.setenv('MMENGINE_HOME', str(tmp_path / 'mmengine'))

    def no_download(url, *args, **kwargs):
        raise AssertionError(f'download of {url} attempted')

    monkeypatch.setattr(torch.hub, 'download_url_to_file', no_download)
    return tmp_path / 'hub' / 'checkpoints'


def url_examples():
    """(URL as a config gives it, the file torch.hub caches it as)."""
    http = 'https://example.com/weights/plain-0123.pth'
    torchvision = mm_checkpoint.get_torchvision_models()['resnet18']
    openmmlab = mm_checkpoint.get_external_models()['detectron2/resnet50_caffe']
    renamed = mm_checkpoint.get_deprecated_model_names()['resnet50_caffe']  # mmengine renames
    renamed_url = mm_checkpoint.get_external_models()[renamed]
    mmcls_name = sorted(mm_checkpoint.get_mmcls_models())[0]
    mmcls = mm_checkpoint.get_mmcls_models()[mmcls_name]
    return [
        (http, http),
        ('torchvision://resnet18', torchvision),
        ('modelzoo://resnet18', torchvision),
        ('open-mmlab://detectron2/resnet50_caffe', openmmlab),
        ('openmmlab://resnet50_caffe', renamed_url),
        (f'mmcls://{mmcls_name}', mmcls),
    ]


URL_ENTRY_POINTS = {
    'load_checkpoint_file': load_checkpoint_file,
    'CheckpointLoader (init_cfg, load_from, resume)': lambda u: CheckpointLoader.load_checkpoint(
        u, map_location='cpu'
    ),
    'mmengine load_checkpoint (load_from)': lambda u: load_checkpoint(
        _detector(), u, map_location='cpu'
    ),
    'init_cfg Pretrained': _init_cfg,
    'mmrepa.apis.init_model': lambda u: init_model(DEMO, u),
}


@pytest.mark.parametrize('fmt', ['zip', 'legacy'])
def test_a_hostile_file_in_the_hub_cache_is_refused_for_every_scheme(hub, tmp_path, benign, fmt):
    marker = tmp_path / 'MARKER'
    before = snapshot()
    for url, cached_url in url_examples():
        cached = hub / osp.basename(cached_url)
        cached.parent.mkdir(parents=True, exist_ok=True)
        write(cached, Calls(os.system, f'touch {marker}'), fmt)
        for entry, read in URL_ENTRY_POINTS.items():
            with pytest.raises(CheckpointError, match='contains posix.system') as err:
                read(url)
            assert str(cached) in str(err.value) and '\n' not in str(err.value), entry
        cached.unlink()
    assert not marker.exists()
    assert_unchanged(before, snapshot())
    assert_plain_loads_unchanged(benign)


def test_a_cached_url_loads_through_the_same_loader(hub):
    url = 'https://example.com/weights/plain-0123.pth'
    hub.mkdir(parents=True)
    torch.save(
        dict(state_dict=weights(2.0), args=argparse.Namespace(lr=0.1)), hub / 'plain-0123.pth'
    )
    model = _init_cfg(url)
    expected = weights(2.0)
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    assert type(load_checkpoint_file(url)['args']) is ForeignNamespace


def test_a_zip_in_the_hub_cache_is_not_unpacked(hub):
    """torch.hub unpacks a one-member zip it finds in its cache (torch < 1.6's format) into the
    cache directory, under the member's name: the file would choose a file name and text."""
    hub.mkdir(parents=True)
    with zipfile.ZipFile(hub / 'zipped-0123.pth', 'w') as zf:
        zf.writestr('chosen_by_the_file.py', 'import os\n')
    with pytest.raises(CheckpointError, match=r'zipped-0123\.pth.* not a readable'):
        load_checkpoint_file('https://example.com/zipped-0123.pth')
    assert sorted(os.listdir(hub)) == ['zipped-0123.pth']


def test_every_scheme_mmengine_knows_is_read_by_mmrepa():
    import mmdet.models  # noqa: F401  register whatever schemes the downstream libraries add
    import mmpretrain.models  # noqa: F401
    import mmseg.models  # noqa: F401

    ours = set(SCHEMES.values())
    theirs = {
        prefix: loader for prefix, loader in CheckpointLoader._schemes.items() if loader not in ours
    }
    assert not theirs, f"schemes read without mmrepa's loader: {theirs}"


# ----------------------------------------------------------- no other deserialization anywhere

UNSAFE_CALLS = {
    'torch.load',
    'pickle.load',
    'pickle.loads',
    'pickle.Unpickler',
    '_pickle.load',
    '_pickle.loads',
    'load_state_dict_from_url',
    'load_url',
    'load_from_local',
    'load_from_http',
    'load_from_pavi',
    'load_from_ceph',
    'load_from_torchvision',
    'load_from_openmmlab',
    'load_from_mmcls',
}
LOADER = osp.join('mmrepa', 'checkpoint', 'restricted_load.py')


def _dotted(node):
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f'{inner}.{node.attr}' if inner else node.attr
    return node.id if isinstance(node, ast.Name) else ''


def unsafe_uses(path):
    """Calls of a deserializer or of mmengine's loaders (attributes: ours are plain names),
    their imports by name, and weights_only=False, with line numbers."""
    tree = ast.parse(open(path).read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if isinstance(node.func, ast.Attribute) and (
                name in UNSAFE_CALLS or node.func.attr in UNSAFE_CALLS - {'load'}
            ):
                found.append((node.lineno, name))
            if any(
                k.arg == 'weights_only' and getattr(k.value, 'value', None) is False
                for k in node.keywords
            ):
                found.append((node.lineno, 'weights_only=False'))
        elif isinstance(node, ast.ImportFrom) and node.module in (
            'torch',
            'pickle',
            '_pickle',
            'torch.hub',
            'dill',
        ):
            bad = {a.name for a in node.names} & {
                'load',
                'loads',
                'Unpickler',
                'load_state_dict_from_url',
            }
            found += [(node.lineno, f'from {node.module} import {b}') for b in bad]
    return found


def test_no_other_module_deserializes_a_file():
    found = {}
    for top in ('mmrepa', 'tools', 'benchmarks'):
        for folder, _, files in os.walk(osp.join(ROOT, top)):
            for name in files:
                path = osp.join(folder, name)
                rel = osp.relpath(path, ROOT)
                if name.endswith('.py') and rel != LOADER and unsafe_uses(path):
                    found[rel] = unsafe_uses(path)
    assert not found, found
    # the check sees what it looks for
    assert [u[1] for u in unsafe_uses(osp.join(ROOT, LOADER))] == ['torch.load']


def test_the_source_check_catches_each_form(tmp_path):
    path = tmp_path / 'x.py'
    path.write_text(
        'import torch, pickle\nfrom torch.hub import load_state_dict_from_url\n'
        'torch.load(f)\npickle.loads(b)\nx = torch.load(f, weights_only=False)\n'
        'mm_checkpoint.load_from_http(u)\n'
    )
    assert [u[0] for u in unsafe_uses(str(path))] == [2, 3, 4, 5, 5, 6]


# ------------------------------------------------- the release layouts and mmengine's own files


def _yacs_config():
    from yacs.config import CfgNode

    cfg = CfgNode()
    cfg.MODEL = CfgNode(dict(TYPE='swin', DROP_PATH_RATE=0.1))
    cfg.freeze()
    return cfg


class _EasyDict(dict):
    """easydict.EasyDict as the package writes it (easydict is not installed here): items
    mirrored as attributes, nested dicts converted."""

    def __init__(self, d=None, **kwargs):
        super().__init__()
        for k, v in dict(d or {}, **kwargs).items():
            setattr(self, k, v)

    def __setattr__(self, name, value):
        value = _EasyDict(value) if isinstance(value, dict) else value
        super().__setattr__(name, value)
        super().__setitem__(name, value)


_EasyDict.__module__, _EasyDict.__name__, _EasyDict.__qualname__ = (
    'easydict',
    'EasyDict',
    'EasyDict',
)


def test_release_layouts_still_load_as_plain_data(tmp_path, monkeypatch, benign):
    monkeypatch.setitem(sys.modules, 'easydict', types.SimpleNamespace(EasyDict=_EasyDict))
    path = tmp_path / 'release.pth'
    torch.save(
        dict(
            model=weights(),
            args=argparse.Namespace(lr=4e-3, epochs=300),
            config=_yacs_config(),
            cfg=_EasyDict(lr=0.1, sched=dict(name='cos')),
        ),
        path,
    )
    monkeypatch.delitem(sys.modules, 'easydict')
    before = snapshot()
    ckpt = load_checkpoint_file(path)
    assert type(ckpt['args']) is ForeignNamespace and ckpt['args'].epochs == 300
    assert type(ckpt['config']) is ForeignConfig and ckpt['config'].MODEL.TYPE == 'swin'
    assert type(ckpt['config'].MODEL) is ForeignConfig
    assert type(ckpt['cfg']) is ForeignConfig and ckpt['cfg'].sched.name == 'cos'
    model = _init_cfg(path)
    assert all(torch.equal(v, weights()[k]) for k, v in model.state_dict().items())
    assert_unchanged(before, snapshot())
    assert_plain_loads_unchanged(benign)
    # outside mmrepa's loader torch still refuses the foreign classes
    with pytest.raises(pickle.UnpicklingError, match='argparse.Namespace'):
        torch.load(path, weights_only=True)


def _toy_runner(work_dir, max_iters, **kwargs):
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    class Toy(BaseModel):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, inputs, labels=None, mode='tensor'):
            out = self.linear(inputs)
            return {'loss': ((out - labels) ** 2).mean()} if mode == 'loss' else out

    data = [dict(inputs=torch.randn(2), labels=torch.randn(1)) for _ in range(4)]
    return Runner(
        model=Toy(),
        work_dir=str(work_dir),
        experiment_name=f'toy_{max_iters}',
        train_dataloader=dict(
            dataset=data,
            batch_size=2,
            num_workers=0,
            # mmengine's iteration loop sleeps 2 s at the end of another sampler's epoch
            sampler=dict(type='InfiniteSampler', shuffle=False),
            collate_fn=dict(type='default_collate'),
        ),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        default_hooks=dict(
            checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False),
            logger=dict(type='LoggerHook', interval=1),
        ),
        default_scope='mmengine',
        **kwargs,
    )


def test_an_mmengine_checkpoint_loads_and_resume_continues(tmp_path, benign):
    runner = _toy_runner(tmp_path / 'train', 2)
    runner.train()
    ckpt_path = tmp_path / 'train' / 'iter_2.pth'
    saved_loss = runner.message_hub.get_scalar('train/loss').data[0].copy()
    before = snapshot()
    ckpt = load_checkpoint_file(ckpt_path)
    buffer = ckpt['message_hub']['log_scalars']['train/loss']
    assert type(buffer) is HistoryBuffer and np.array_equal(buffer.data[0], saved_loss)
    assert buffer.statistics('mean') == saved_loss.mean()
    assert isinstance(ckpt['message_hub']['runtime_info']['eta'], np.floating)
    assert_unchanged(before, snapshot())
    assert_plain_loads_unchanged(benign)

    resumed = _toy_runner(tmp_path / 'resume', 4, load_from=str(ckpt_path), resume=True)
    resumed.train()
    assert resumed.iter == 4
    losses = resumed.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == 4 and np.array_equal(losses[:2], saved_loss)
