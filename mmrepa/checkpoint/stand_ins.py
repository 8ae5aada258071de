"""Inert stand-ins for the non-tensor objects that checkpoints hold.

torch's ``weights_only`` unpickler resolves a GLOBAL only from its allow-list, and on an object of
an allow-listed class it runs that class's own code: NEWOBJ calls ``cls.__new__``, REDUCE calls
the class or function, BUILD calls ``__setstate__`` (or updates ``__dict__``). Allow-listing the
real classes would therefore run their code with data the file chose: mmengine's
``HistoryBuffer.__setstate__`` merges the file's ``statistics_methods`` into a dictionary shared
by the whole process, ``numpy.dtype(..., copy=False)`` hands out numpy's canonical dtype objects
for BUILD to rewrite, and BUILD on an ndarray that a tensor already shares frees the tensor's
memory. So under those names torch finds the classes and functions below instead. Each one
checks that it is given plain data of the expected form and keeps it, and nothing else: no
attribute of any class or function is set, nothing outside the new object changes, nothing the
file names is called.

What they become: mmengine ``HistoryBuffer``s are real ``HistoryBuffer``s (resume restores the
message hub with them); numpy arrays, dtypes and scalars real numpy objects;
``argparse.Namespace`` a :class:`ForeignNamespace`; a yacs ``CfgNode`` or an ``EasyDict`` a
:class:`ForeignConfig` (a plain dict). The last two, and numpy arrays outside a
``HistoryBuffer``, are finished by :func:`finish` after the load, which
:func:`mmrepa.checkpoint.load_checkpoint_file` calls.
"""

import contextvars
import math
import pickle
from collections import Counter, OrderedDict
from typing import Any, Dict, List, Optional

import numpy as np
from mmengine.logging.history_buffer import HistoryBuffer


def refuse(message: str):
    """Stop the load. torch turns an ``UnpicklingError`` into its 'Weights only load failed'
    message and the loader into one line naming the file."""
    raise pickle.UnpicklingError(message)


def _attributes(state: Any, what: str) -> Dict[str, Any]:
    """The state BUILD gives a plain object: a dict of attribute names. A (dict, slots) pair
    would set attributes through ``setattr``; it is refused."""
    if type(state) is not dict or not all(type(k) is str for k in state):
        refuse(f'the state of {what} is a {type(state).__name__}, not a dict of attribute names')
    return dict(state)


# --------------------------------------------------------------------- foreign release layouts


class ForeignNamespace:
    """What an ``argparse.Namespace`` in a checkpoint is rebuilt as: its attributes, as data.

    pickle writes a Namespace as NEWOBJ (no arguments) then BUILD with its ``__dict__``."""

    def __setstate__(self, state: Any) -> None:
        # Straight into the instance's own __dict__: no setattr, so no descriptor runs, and an
        # instance entry never overrides a special method (those are looked up on the type).
        self.__dict__.update(_attributes(state, 'an argparse.Namespace'))

    def __repr__(self) -> str:
        return f'ForeignNamespace({vars(self)})'


class ForeignConfig(dict):
    """What a yacs ``CfgNode`` or an ``EasyDict`` in a checkpoint is rebuilt as: a dict (keys
    also readable as attributes) without the original class's behaviour."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


# The OrderedDicts that stand for config nodes in the load under way (see ConfigNodeStandIn).
_CONFIG_NODES: contextvars.ContextVar[Optional[List[OrderedDict]]] = contextvars.ContextVar(
    'mmrepa_config_nodes', default=None
)


class ConfigNodeStandIn:
    """Found under ``yacs.config.CfgNode`` and ``easydict.EasyDict``: both are dict subclasses,
    which pickle writes as NEWOBJ, SETITEMS of their items, then BUILD of their ``__dict__``.
    torch's unpickler fills only exact ``dict``/``OrderedDict``/``Counter`` objects, so NEWOBJ
    here gives a fresh ``OrderedDict`` (BUILD then updates that new object's ``__dict__`` only)
    and notes it for :func:`finish`, which turns it into a :class:`ForeignConfig`."""

    def __new__(cls, *args):
        nodes = _CONFIG_NODES.get()
        if nodes is None:
            refuse(
                'a yacs CfgNode or EasyDict is read only by mmrepa.checkpoint.load_checkpoint_file'
            )
        if args:
            refuse('a yacs CfgNode or EasyDict is rebuilt from its items only')
        node = OrderedDict()
        nodes.append(node)
        return node


class collect_config_nodes:
    """Context of one load: the config nodes its stand-ins create (a list, for :func:`finish`)."""

    def __enter__(self) -> List[OrderedDict]:
        self.nodes: List[OrderedDict] = []
        self.token = _CONFIG_NODES.set(self.nodes)
        return self.nodes

    def __exit__(self, *exc) -> None:
        _CONFIG_NODES.reset(self.token)


# ----------------------------------------------------------------------------------- numpy

_NUMERIC_KINDS = 'biufc'  # bool, int, uint, float, complex: no objects, strings or records


class NumpyDType:
    """Found under ``numpy.dtype``. pickle writes a dtype as ``numpy.dtype(spec, align, copy)``
    then BUILD with its state; here the spec must name a numeric type, the object made is our
    own (never numpy's shared canonical dtype), and BUILD may only set the byte order."""

    def __init__(self, spec: Any = None, align: Any = False, copy: Any = True) -> None:
        if type(spec) is not str or len(spec) > 8:
            refuse(f'numpy.dtype of a {type(spec).__name__}: mmrepa reads numeric dtypes only')
        dtype = np.dtype(spec)
        if dtype.kind not in _NUMERIC_KINDS or dtype.subdtype is not None:
            refuse(f'numpy.dtype {spec!r}: mmrepa reads numeric dtypes only')
        self.dtype = dtype

    def __setstate__(self, state: Any) -> None:
        # numpy's state: (version, byte order, subarray, names, fields, elsize, alignment,
        # flags[, metadata]); a numeric dtype has no subarray, names or fields
        if (
            getattr(self, 'dtype', None) is None
            or type(state) is not tuple
            or len(state) not in (8, 9)
            or state[1] not in ('<', '>', '|', '=')
            or state[2:5] != (None, None, None)
        ):
            refuse('the state of a numpy dtype is not that of a numeric dtype')
        self.dtype = self.dtype.newbyteorder(state[1])


def _numpy_dtype(value: Any) -> np.dtype:
    if type(value) is not NumpyDType or getattr(value, 'dtype', None) is None:
        refuse(f'a numpy dtype was expected, not a {type(value).__name__}')
    return value.dtype


class NumpyArray:
    """Found under ``numpy.ndarray``; :func:`numpy_reconstruct` returns one. pickle writes an
    array as ``_reconstruct(ndarray, (0,), b'b')`` then BUILD with (version, shape, dtype,
    Fortran order, raw bytes). BUILD here makes a new array from those bytes, once: numpy's own
    ``ndarray.__setstate__`` would free the memory of an array a tensor already shares."""

    array: Optional[np.ndarray] = None

    def __init__(self, *args) -> None:
        if args:
            refuse('a numpy array is rebuilt from its saved state only')

    def __setstate__(self, state: Any) -> None:
        if self.array is not None:
            refuse('a numpy array is given its state twice')
        if type(state) is not tuple or len(state) != 5:
            refuse('the state of a numpy array is not (version, shape, dtype, order, data)')
        _, shape, dtype, fortran, raw = state
        dtype = _numpy_dtype(dtype)
        if (
            type(shape) is not tuple
            or len(shape) > 32
            or not all(type(n) is int and n >= 0 for n in shape)
        ):
            refuse('the shape of a numpy array is not a tuple of sizes')
        if type(raw) is not bytes or len(raw) != math.prod(shape) * dtype.itemsize:
            refuse('the data of a numpy array do not match its shape and dtype')
        order = 'F' if fortran is True else 'C'
        self.array = np.frombuffer(raw, dtype).reshape(shape, order=order).copy()

    def __array__(self, dtype=None, copy=None):  # a plain torch.load leaves these outside
        return np.asarray(self.array, dtype)  # HistoryBuffers: np.asarray still works

    def __repr__(self) -> str:
        return f'NumpyArray({self.array!r})'


def numpy_reconstruct(subtype: Any, shape: Any = (0,), typecode: Any = b'b') -> NumpyArray:
    """Found under ``numpy.core.multiarray._reconstruct``: a new, empty :class:`NumpyArray`."""
    if subtype is not NumpyArray:  # i.e. the file said numpy.ndarray, not a subclass
        refuse('numpy arrays are read as numpy.ndarray only')
    return NumpyArray()


def numpy_scalar(dtype: Any, raw: Any = None) -> np.generic:
    """Found under ``numpy.core.multiarray.scalar``: a numeric numpy scalar from its bytes."""
    dtype = _numpy_dtype(dtype)
    if type(raw) is not bytes or len(raw) != dtype.itemsize:
        refuse('the data of a numpy scalar do not match its dtype')
    return np.frombuffer(raw, dtype)[0]


# -------------------------------------------------------------------------------- mmengine

_STATISTICS = ('min', 'max', 'current', 'mean')  # what HistoryBuffer registers by default

# The buffers below are made without HistoryBuffer.__init__, which registers those four in the
# registry all HistoryBuffers share; one buffer made now does it before any load, so that
# `statistics('mean')` works on a resumed buffer and loading itself changes nothing.
HistoryBuffer()


class HistoryBufferStandIn(HistoryBuffer):
    """Found under ``mmengine.logging.history_buffer.HistoryBuffer``: its BUILD keeps the
    logged values (two numeric vectors and ``max_length``) and drops ``statistics_methods``,
    which mmengine's ``__setstate__`` would merge into the dictionary all HistoryBuffers share.
    The object then becomes a plain ``HistoryBuffer``: the message hub takes it on resume, a new
    checkpoint saves it under mmengine's name, and BUILD cannot reach it a second time."""

    def __init__(self, *args, **kwargs) -> None:  # REDUCE would run HistoryBuffer.__init__
        refuse('a HistoryBuffer is rebuilt from its saved state only')

    def __setstate__(self, state: Any) -> None:
        state = _attributes(state, 'a HistoryBuffer')
        unknown = set(state) - {
            'max_length',
            '_log_history',
            '_count_history',
            'statistics_methods',
        }
        if unknown:
            refuse(f'a HistoryBuffer has no attribute {sorted(unknown)[0]!r}')
        max_length = state.get('max_length', 1000000)
        if type(max_length) is not int or max_length < 1:
            refuse('the max_length of a HistoryBuffer is not a positive int')
        log, count = (_vector(state.get(k)) for k in ('_log_history', '_count_history'))
        if len(log) != len(count):
            refuse('a HistoryBuffer has as many values as counts')
        self.__dict__.update(max_length=max_length, _log_history=log, _count_history=count)
        self.__class__ = HistoryBuffer


def _vector(value: Any) -> np.ndarray:
    if type(value) is not NumpyArray or value.array is None or value.array.ndim != 1:
        refuse('the values of a HistoryBuffer are not a numeric numpy vector')
    return value.array


def statistics_method_name(owner: Any, name: Any) -> str:
    """Found under ``builtins.getattr``. mmengine checkpoints hold the HistoryBuffer statistics
    methods, which protocol-2 pickles write as ``getattr(HistoryBuffer, 'mean')``; the stand-in
    above drops them. So this never returns an attribute: only the name, as a string."""
    if owner is HistoryBufferStandIn and name in _STATISTICS:
        return f'HistoryBuffer.{name}'
    refuse(
        f'getattr({type(owner).__name__} object, {str(name)[:40]!r}): mmrepa reads only '
        'the HistoryBuffer statistics names mmengine checkpoints hold (as names)'
    )


# Under these names torch finds the stand-ins. Protocol-2 pickles name the module of the numpy
# that wrote them (numpy.core before numpy 2, numpy._core since) and __builtin__ for builtins.
MMENGINE_GLOBALS = (
    (HistoryBufferStandIn, 'mmengine.logging.history_buffer.HistoryBuffer'),
    (statistics_method_name, 'builtins.getattr'),
    (statistics_method_name, '__builtin__.getattr'),
    (NumpyArray, 'numpy.ndarray'),
    (NumpyDType, 'numpy.dtype'),
    (numpy_reconstruct, 'numpy.core.multiarray._reconstruct'),
    (numpy_reconstruct, 'numpy._core.multiarray._reconstruct'),
    (numpy_scalar, 'numpy.core.multiarray.scalar'),
    (numpy_scalar, 'numpy._core.multiarray.scalar'),
)
FOREIGN_GLOBALS = (
    (ForeignNamespace, 'argparse.Namespace'),
    (ConfigNodeStandIn, 'yacs.config.CfgNode'),
    (ConfigNodeStandIn, 'easydict.EasyDict'),
)


# ------------------------------------------------------------------------ after the load


def finish(obj: Any, config_nodes: List[OrderedDict]) -> Any:
    """Replace, through ``obj``'s containers, the config-node OrderedDicts by
    :class:`ForeignConfig` and the numpy stand-ins by numpy objects. Refuses a stand-in left
    without its state. Shared objects stay shared; a cycle through a tuple keeps the old
    tuple there (pickle cannot build such a cycle from plain data anyway)."""
    nodes = {id(node) for node in config_nodes}
    done: Dict[int, Any] = {}

    def visit(x: Any) -> Any:
        key, kind = id(x), type(x)
        if key in done:
            return done[key]
        done[key] = x  # provisional: a cycle back to x finds x
        if kind in (NumpyArray, NumpyDType, HistoryBufferStandIn):
            done[key] = _restored(x)
        elif key in nodes:
            done[key] = ForeignConfig()
            for k, v in x.items():
                done[key][_plain_key(k)] = visit(v)
        else:
            new = _visit_items(x, visit)
            if new is not None:
                done[key] = new
        return done[key]

    return visit(obj)


def _restored(x: Any) -> Any:
    """The numpy object a numpy stand-in stands for; a stand-in without its state is refused."""
    if type(x) is HistoryBufferStandIn:
        refuse('a HistoryBuffer without its state')
    if type(x) is NumpyDType:
        return _numpy_dtype(x)
    if x.array is None:
        refuse('a numpy array without its data')
    return x.array


def _visit_items(x: Any, visit) -> Optional[tuple]:
    """``visit`` every item of the container ``x``, replacing them in place; a tuple whose
    items changed comes back as a new tuple (None otherwise, and for anything else)."""
    kind = type(x)
    if kind in (dict, OrderedDict, Counter, ForeignConfig):
        for k in list(x):
            x[_plain_key(k)] = visit(x[k])
    elif kind is list:
        for i, v in enumerate(x):
            x[i] = visit(v)
    elif kind is tuple:
        items = tuple(visit(v) for v in x)
        if any(a is not b for a, b in zip(items, x)):
            return items
    elif kind is ForeignNamespace:
        for k, v in list(vars(x).items()):
            vars(x)[k] = visit(v)
    elif kind in (set, frozenset):
        for v in x:
            _plain_key(v)
    return None


def _plain_key(key: Any) -> Any:
    """Dict keys and set items hold no stand-in (they would have to be replaced while hashed)."""
    if type(key) in (NumpyArray, NumpyDType, HistoryBufferStandIn, ForeignNamespace):
        refuse(f'a {type(key).__name__} as a dict key or set item')
    return key
