"""Layer 2: what the small-kernel families (dense, pointwise, optimizer) share: the ``"nn"`` kernels'
launches by parameter name, their grids, and the two ways a signature's launch is kept in the store of bound
calls (:data:`tcgnn_py._cache.BOUND`): the :class:`~tcgnn_py.kernels.launches.Launch` itself (:func:`planned`),
or its bound form per device and stream (:func:`bound_once`).
"""

import functools

import numpy as np

from .._cache import BOUND, keep
from .._device import get_cupy
from ..kernels.launches import Scratch, make
from ..kernels.registry import get_kernel
from ._launch import made, recycled

__all__ = ["THREADS", "MAX_BLOCKS", "grid", "name", "function", "launch", "planned", "bound_once", "scratch",
           "SCRATCH_KEEP", "result", "results"]

#: Threads per block of the grid-stride kernels, and the most blocks (enough to fill any GPU; more only loop).
THREADS = 256
MAX_BLOCKS = 4096


def grid(n):
    """Blocks of :data:`THREADS` over ``n`` elements, at most :data:`MAX_BLOCKS` (grid-stride kernels)."""
    return min(max(1, -(-n // THREADS)), MAX_BLOCKS)


@functools.cache
def name(namer, dtype):
    """``namer(dtype's name)``, the kernel of a dtype: asked per call, so kept."""
    return namer(np.dtype(dtype).name)


def function(name):
    """The loaded ``CUfunction`` of the ``"nn"`` kernel ``name`` on the current device (compiled on first use)."""
    return get_kernel("nn", name).kernel.ptr


def launch(name, grid, block, operands, **fixed):
    """The :class:`~tcgnn_py.kernels.launches.Launch` of the ``"nn"`` kernel ``name``: ``operands`` what a call
    passes, ``fixed`` every other parameter by name."""
    return make("nn", name, grid, block, operands, fixed)


_SCRATCH = {}
#: Buffers :func:`scratch` keeps (each kind and shape on each device and stream), oldest dropped: a bound launch
#: holds the buffer it was bound with, so one dropped here is made anew only for launches bound after.
SCRATCH_KEEP = 256


def scratch(kind, shape, dtype, zeros=False):
    """A launch's partial sums or counters (``zeros``: made zero; each launch's last block resets what it counts) on
    the current stream: the graph's own under a capture, else made at the stream's first call and kept (calls on a
    stream run in order, so its launches share equal buffers)."""
    cp = get_cupy()
    stream = cp.cuda.get_current_stream()
    if stream.is_capturing():
        return (cp.zeros if zeros else cp.ndarray)(shape, dtype)
    buffer, place = Scratch(kind, tuple(shape), np.dtype(dtype), zeros), (cp.cuda.runtime.getDevice(), stream.ptr)
    buf = _SCRATCH.get((buffer, place))
    if buf is None:
        buf = keep(_SCRATCH, (buffer, place), buffer.new(), SCRATCH_KEEP)
    return buf


def planned(key, build):
    """``build()`` -- the :class:`~tcgnn_py.kernels.launches.Launch` of one signature ``key`` -- made once and
    kept in the store of bound calls (a launch holds no stream or device; its kernel is looked up per call)."""
    f = BOUND.get(key)
    if f is None:
        f = BOUND.put(key, build(), "nn launches")
    return f


def bound_once(key, bind, *sample):
    """``bind(*sample)`` -- a bound form of one signature ``key`` -- made once per device and stream and kept in
    the store of bound calls (not under a capture): the general functions launch through their bound forms, so
    each kernel's arguments are written in one place."""
    cp = get_cupy()
    stream = cp.cuda.get_current_stream()
    place = (cp.cuda.runtime.getDevice(), stream.ptr)
    key += place
    f = BOUND.get(key)
    if f is None:
        f = BOUND.put(key, bind(*sample), place, stream.is_capturing())
    return f


def result(shape, dtype, recycle):
    """The maker of a bound form's result, ``f(shape, dtype)`` in place of ``cupy.ndarray``: :func:`recycled` for a
    bound layer call's (``recycle``), else ``cupy.ndarray`` (the general functions launch through the same forms,
    under a capture too)."""
    return recycled(shape, dtype) if recycle else get_cupy().ndarray


def results(specs, recycle):
    """The maker of a bound form's several results (``(shape, dtype)`` each), in one call (:func:`made`): recycled
    for a bound layer call's, else new, as :func:`result`."""
    return made(specs, "recycle" if recycle else "new")
