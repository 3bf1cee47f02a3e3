"""Layer 2: the training family on the GPU -- a layer's elementwise tail (bias, activation, dropout) and its vjp,
the softmax cross-entropy, and Adam over many tensors in one launch.

The one place the ``"nn"`` kernels' arguments are written (:mod:`tcgnn_py.kernels.nn`); launches go straight
through the driver (:func:`tcgnn_py.kernels.driver.launch`), since a training step makes dozens of small ones
and CuPy's argument handling would cost more than the kernels.  :mod:`tcgnn_py.nn` validates, keeps the host
path and writes the vjps.
"""

import numpy as np

from ..._device import get_cupy
from ...kernels import nn as kn
from ...kernels.driver import launch
from ...kernels.registry import get_kernel

__all__ = ["TAIL_TYPES", "ACTIVATIONS", "ADAM_MULTI", "tail", "tail_grad", "cross_entropy", "adam_tick",
           "adam_table", "adam_multi"]

TAIL_TYPES = kn.TAIL_TYPES
ACTIVATIONS = kn.ACTIVATIONS
ADAM_MULTI = kn.ADAM_MULTI
#: Threads per block of the grid-stride kernels, and the most blocks (enough to fill any GPU; more only loop).
THREADS = 256
MAX_BLOCKS = 4096


def _grid(n):
    return min(max(1, -(-n // THREADS)), MAX_BLOCKS)


def _f32(x):
    return int(np.float32(x).view(np.int32))


def _f64(x):
    return int(np.float64(x).view(np.int64))


def _function(name):
    """The loaded ``CUfunction`` of the ``"nn"`` kernel ``name`` on the current device (compiled on first use)."""
    return get_kernel("nn", name).kernel.ptr


def _run(name, n, values, grid=None):
    launch(_function(name), grid or _grid(n), THREADS, values, get_cupy().cuda.get_current_stream().ptr)


def _ptr(a):
    return 0 if a is None else a.data.ptr


def tail(x, b, act, p, seed):
    """``dropout(act(x + b))`` in one pass, a new array of x's dtype: ``b`` one value per column of x or None,
    ``act`` a key of :data:`ACTIVATIONS`, ``seed`` (a float64 device draw) None for no dropout.  Arrays
    C-contiguous, of one dtype in :data:`TAIL_TYPES`."""
    out = get_cupy().empty_like(x)
    if x.size:
        _run(kn.tail_name(x.dtype.name), x.size,
             (x.data.ptr, _ptr(b), out.data.ptr, x.size, x.shape[-1] if x.ndim else 1, ACTIVATIONS[act], _f32(p),
              _f64(1 / (1 - p)), _ptr(seed)))
    return out


def tail_grad(g, x, b, act, p, seed):
    """The vjp of :func:`tail`: ``g`` times the recomputed mask and ``act'(x + b)`` (``x`` None without ``act``)."""
    dz = get_cupy().empty_like(g)
    if g.size:
        _run(kn.tail_grad_name(g.dtype.name), g.size,
             (g.data.ptr, _ptr(x), _ptr(b), dz.data.ptr, g.size, g.shape[-1] if g.ndim else 1, ACTIVATIONS[act],
              _f32(p), _f64(1 / (1 - p)), _ptr(seed)))
    return dz


def cross_entropy(logits, labels, w, w0):
    """``(loss per row, dlogits)`` of the weighted softmax cross-entropy: ``labels`` int64 (n,), ``w`` one weight
    per row (of logits' dtype) or None for ``w0`` on every row; logits C-contiguous (n, k), k >= 1."""
    cp = get_cupy()
    n, k = logits.shape
    loss = cp.empty(n, logits.dtype)
    grad = cp.empty_like(logits)
    if n:
        _run(kn.cross_entropy_name(logits.dtype.name), n,
             (logits.data.ptr, labels.data.ptr, _ptr(w), _f64(w0), loss.data.ptr, grad.data.ptr, n, k))
    return loss, grad


def adam_tick(t, coef, lr, b1, b2):
    """Advance the device step count ``t`` and write the bias corrections ``coef`` (one thread)."""
    launch(_function(kn.TICK), 1, 1, (t.data.ptr, coef.data.ptr, _f64(lr), _f64(b1), _f64(b2)),
           get_cupy().cuda.get_current_stream().ptr)


def adam_table(params, moments, decays):
    """The device table of :func:`adam_multi`: per parameter its address, its moments' addresses, its size and its
    weight decay (made once per set of arrays; a host-to-device copy, so not under a capture)."""
    rows = [(p.data.ptr, m.data.ptr, v.data.ptr, p.size, _f64(wd))
            for p, (m, v), wd in zip(params, moments, decays)]
    return get_cupy().asarray(np.array(rows, dtype=np.int64).reshape(len(rows), kn.ADAM_SLOTS))


def adam_multi(table, sizes, grads, coef, b1, b2, eps):
    """One Adam step of the tensors in ``table`` (:func:`adam_table`; ``sizes`` their element counts) with
    ``grads`` (C-contiguous, of the parameters' dtype, in the table's order): one launch per 8 tensors."""
    dtype = grads[0].dtype
    t = dtype.type
    bits = _f64 if dtype == np.float64 else _f32
    name = kn.adam_multi_name(dtype.name)
    row = kn.ADAM_SLOTS * 8
    for start in range(0, len(grads), ADAM_MULTI):
        chunk = grads[start:start + ADAM_MULTI]
        gs = [g.data.ptr for g in chunk] + [0] * (ADAM_MULTI - len(chunk))
        blocks = _grid(max(sizes[start:start + ADAM_MULTI]))
        _run(name, 0, (table.data.ptr + row * start, coef.data.ptr, bits(t(b1)), bits(t(b2)), bits(t(eps)), *gs),
             grid=(blocks, len(chunk)))
