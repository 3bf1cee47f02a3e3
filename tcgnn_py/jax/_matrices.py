"""Layer 4: the matrices jitted programs refer to, by an integer a program carries as an FFI attribute.

A :class:`~tcgnn_py.TiledMatrix` is static in a jitted function (its structure decides the launches, as a shape
does), so a program holds it as a number: the key it was given here when traced.  The registry keeps each matrix
alive (a compiled program may run it at any later time) until :func:`release`; a released key gives a clear error.
A matrix's copy on the other side (the CPU backend's of a GPU matrix, the GPU backend's of a host one) is made on
its first call there and kept beside it.
"""

import itertools
import threading

import numpy as np

from .._tiled import TiledMatrix

__all__ = ["key_of", "matrix", "host_matrix", "device_matrix", "entries", "release", "registered"]

_KEYS = {}  # id(T) -> key
_MATRICES = {}  # key -> [T, host copy or None, device copy or None(, entries once asked)]
_COUNTER = itertools.count(1)
_LOCK = threading.Lock()


def key_of(T):
    """The key of ``T`` (registered now if it was not)."""
    if not isinstance(T, TiledMatrix):
        raise TypeError(f"T must be a tcgnn_py.TiledMatrix, got {type(T).__name__}")
    with _LOCK:
        key = _KEYS.get(id(T))
        if key is None or _MATRICES.get(key, (None,))[0] is not T:
            key = next(_COUNTER)
            _KEYS[id(T)] = key
            _MATRICES[key] = [T, None, None]
        return key


def _entry(key):
    entry = _MATRICES.get(key)
    if entry is None:
        raise LookupError(f"matrix {key} was released (tcgnn_py.jax.release): a program that uses it must be "
                          "traced again with a registered matrix")
    return entry


def matrix(key):
    """The matrix of ``key``."""
    return _entry(key)[0]


def host_matrix(key):
    """The matrix of ``key`` on the host (itself there, else a host copy made once)."""
    return _on(key, 1, "cpu")


def device_matrix(key):
    """The matrix of ``key`` on the GPU (itself there, else a device copy made once): a program on JAX's GPU
    backend may close over a matrix built on the host.  Its first call here waits for the device once, as XLA's
    stream is not ordered after the streams the matrix (or its copy) was built on: without the wait a program's
    first product may read a matrix still being written."""
    entry = _MATRICES.get(key)
    if entry is not None and entry[2] is not None:  # (a call's first step: one lookup)
        return entry[2]
    return _on(key, 2, "cuda", _synchronize)


def _synchronize():
    import cupy

    cupy.cuda.runtime.deviceSynchronize()  # synchronize! (once per matrix: what built it is complete)


def _on(key, slot, device, ready=None):
    entry = _entry(key)
    if entry[slot] is None:
        T = entry[0]
        copy = T if T.device == device else TiledMatrix(T, dtype=T.dtype, layout=T.layout.name, device=device)
        if ready is not None:
            ready()
        entry[slot] = copy
    return entry[slot]


def entries(key):
    """``(rows, cols, src)`` of the matrix of ``key``, NumPy int32 in its stored (tiled) order: each entry's row
    and column, and where the transpose's entries come from (``values_t = values[src]``), worked out once on the
    host (the translation is the same there as on the GPU)."""
    entry = _entry(key)
    if len(entry) == 3:
        tiling = host_matrix(key).tiling
        rows, cols = tiling.rows_cols()
        entry.append((rows.astype(np.int32), cols.astype(np.int32), tiling.transpose()[1].astype(np.int32)))
    return entry[3]


def release(T):
    """Forget ``T``: programs traced with it raise an error when run after this (they hold its key, not it)."""
    with _LOCK:
        key = _KEYS.pop(id(T), None)
        if key is not None and _MATRICES.get(key, (None,))[0] is T:
            del _MATRICES[key]


def registered():
    """How many matrices the registry holds."""
    return len(_MATRICES)
