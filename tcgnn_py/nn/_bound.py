"""Layer 4: bound layer calls -- a layer's launches for one operand signature, run without its checks.

On the GPU a layer call's work depends only on its operands' signature (shapes, strides, 16-byte alignment), the
graph's values, the layer's options, the stream, the device and the tuning overrides, as a product's does
(:func:`tcgnn_py.products.signature`).  The layer's general code validates, converts and plans; the second general
call of a signature binds what it ran (the first plans and compiles, and a timed launch choice may still be
compiling after it), and from then on a call of that signature allocates its results and launches, nothing else:
its checks are proved by the signature the general call passed.  Only float32 CuPy operands take bound calls (a
training step's); every other call, and every call under a CUDA-graph capture (whose scratch buffers are the
graph's own), runs the general code.

A bound call's intermediates (an array made and read within the call, never returned) are its own, made when it
binds and written anew by every call, where they are small (:data:`KEEP_BYTES`); its results are recycled
(:func:`tcgnn_py.products.recycled`): an array it returned serves again once nothing holds it.
"""

import math
import sys

import numpy as np

from .._cache import Store, keep
from .._tiled import TiledMatrix
from .._tuning import state
from ._edges import TiledEdges

__all__ = ["matrix", "lookup", "seen", "keeps", "Calls", "KEEP", "BIND_AFTER", "KEEP_BYTES"]

#: Signatures whose general calls are counted per graph, and bound backward calls kept per bound forward call
#: (each device and stream), oldest dropped: a model has a few layers, each a signature or two.  A graph's bound
#: forward calls are kept in its tiling's store of bound calls.
KEEP = 32
#: General calls of a signature before it binds: the first plans and compiles its launches (a timed choice among
#: launches may keep compiling after it), the second finds them final.
BIND_AFTER = 2
#: The largest intermediate a bound call keeps as its own (bytes): below it an allocation's host time is a visible
#: share of the call, above it the kernels outlast the host, and arrays kept per signature would add up over layers.
KEEP_BYTES = 1 << 24

_F32 = np.dtype(np.float32)


def matrix(A):
    """The :class:`~tcgnn_py.TiledMatrix` a layer runs on: A, or the matrix of A's edge view; None for others."""
    t = type(A)
    return A if t is TiledMatrix else A.matrix if t is TiledEdges else None


def lookup(A, arrays, options, store=None):
    """``(key, call)``: the key of a layer call on ``A`` (a :class:`~tcgnn_py.TiledMatrix` or its edge view, whose
    precision counts) with these operands (None entries stay None) and hashable ``options``, and its bound call in
    ``store`` (by default A's graph's store of bound calls) or None; ``(None, None)`` where no bound call may serve
    it: another A, an operand not a float32 CuPy array, or a capture in progress.

    One function, its reads written out (no property, no helper): a steady layer call is a few Python calls."""
    cp = sys.modules.get("cupy")
    t = type(A)
    T = A if t is TiledMatrix else A.matrix if t is TiledEdges else None
    if T is None or cp is None:
        return None, None
    precision = A is not T and A.precision  # (an edge view's products run at its own)
    if precision is not False and precision is not None and type(precision) is not str:
        return None, None
    nd = cp.ndarray
    key = ["layer", options, id(T._values), precision]  # (a bound call keeps its values alive: the id is theirs)
    for x in arrays:
        if x is None:
            key.append(None)
        elif type(x) is not nd or x.dtype is not _F32 and x.dtype != _F32:
            return None, None
        else:
            key += (x.shape, x.strides, x.data.ptr & 15)
    stream = cp.cuda.get_current_stream()
    ptr = stream.ptr
    if ptr and stream.is_capturing():  # (the legacy default stream, 0, is never captured)
        return None, None
    key += (ptr, cp.cuda.runtime.getDevice(), state()[1])
    key = tuple(key)
    return key, (T._tiling.bound() if store is None else store).get(key)


def keeps(*shapes):
    """Whether a bound call keeps float32 intermediates of these shapes as its own (each within :data:`KEEP_BYTES`)
    rather than allocating them per call."""
    return all(4 * math.prod(shape) <= KEEP_BYTES for shape in shapes)


def seen(A, key, binder):
    """Count a general call of ``key`` on A's graph (:meth:`Calls.seen`)."""
    tiling = matrix(A).tiling
    tiling.cached("layer calls", lambda: Calls(tiling.bound())).seen(key, binder)


class Calls:
    """Bound calls by signature in a :class:`~tcgnn_py._cache.Store` (a graph's forward calls in its tiling's, or
    one bound forward call's backward calls in its own), and the general calls seen of each signature not bound
    yet."""

    __slots__ = ("bound", "counts")

    def __init__(self, store=None):
        self.bound, self.counts = Store(KEEP) if store is None else store, {}

    def seen(self, key, binder):
        """Count a general call of ``key``; at the :data:`BIND_AFTER`-th, keep ``binder()`` as its bound call, or
        count it no further where that is None (the signature takes none)."""
        count = self.counts.get(key, 0) + 1
        if 0 < count < BIND_AFTER:
            keep(self.counts, key, count, KEEP)
            return
        if count <= 0:
            return
        call = binder()
        if call is None:
            keep(self.counts, key, -1, KEEP)
            return
        self.counts.pop(key, None)
        self.bound.put(key, call, key[-3:-1])  # (a signature ends with the stream, the device, the overrides)
