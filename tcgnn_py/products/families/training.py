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
from ...kernels.driver import launch, slot_value
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


def _function(name):
    """The loaded ``CUfunction`` of the ``"nn"`` kernel ``name`` on the current device (compiled on first use)."""
    return get_kernel("nn", name).kernel.ptr


def _run(name, n, args, grid=None, block=THREADS):
    """Launch ``name`` with ``args`` (arrays, None for a null pointer, ints, NumPy float32 and Python floats, as
    :func:`~tcgnn_py.kernels.driver.slot_value` writes them) on the current stream."""
    launch(_function(name), grid or _grid(n), block, [slot_value(a) for a in args],
           get_cupy().cuda.get_current_stream().ptr)


def tail(x, b, act, p, seed):
    """``dropout(act(x + b))`` in one pass, a new array of x's dtype: ``b`` one value per column of x or None,
    ``act`` a key of :data:`ACTIVATIONS`, ``seed`` (a float64 device draw) None for no dropout.  Arrays
    C-contiguous, of one dtype in :data:`TAIL_TYPES`."""
    out = get_cupy().empty_like(x)
    if x.size:
        _run(kn.tail_name(x.dtype.name), x.size,
             (x, b, out, x.size, x.shape[-1] if x.ndim else 1, ACTIVATIONS[act], np.float32(p), 1 / (1 - p),
              seed))
    return out


def tail_grad(g, x, b, act, p, seed):
    """The vjp of :func:`tail`: ``g`` times the recomputed mask and ``act'(x + b)`` (``x`` None without ``act``)."""
    dz = get_cupy().empty_like(g)
    if g.size:
        _run(kn.tail_grad_name(g.dtype.name), g.size,
             (g, x, b, dz, g.size, g.shape[-1] if g.ndim else 1, ACTIVATIONS[act], np.float32(p), 1 / (1 - p),
              seed))
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
             (logits, labels, w, float(w0), loss, grad, n, k))
    return loss, grad


def adam_tick(t, coef, lr, b1, b2):
    """Advance the device step count ``t`` and write the bias corrections ``coef`` (one thread)."""
    _run(kn.TICK, 1, (t, coef, float(lr), float(b1), float(b2)), grid=1, block=1)


def adam_table(params, moments, decays):
    """The device table of :func:`adam_multi`: per parameter its address, its moments' addresses, its size and its
    weight decay (made once per set of arrays; a host-to-device copy, so not under a capture)."""
    rows = [(p.data.ptr, m.data.ptr, v.data.ptr, p.size, slot_value(float(wd)))
            for p, (m, v), wd in zip(params, moments, decays)]
    return get_cupy().asarray(np.array(rows, dtype=np.int64).reshape(len(rows), kn.ADAM_SLOTS))


def adam_multi(table, sizes, grads, coef, b1, b2, eps):
    """One Adam step of the tensors in ``table`` (:func:`adam_table`; ``sizes`` their element counts) with
    ``grads`` (C-contiguous, of the parameters' dtype, in the table's order): one launch per 8 tensors."""
    dtype = grads[0].dtype
    t = dtype.type
    name = kn.adam_multi_name(dtype.name)
    row = kn.ADAM_SLOTS * 8
    for start in range(0, len(grads), ADAM_MULTI):
        chunk = grads[start:start + ADAM_MULTI]
        gs = list(chunk) + [None] * (ADAM_MULTI - len(chunk))
        blocks = _grid(max(sizes[start:start + ADAM_MULTI]))
        _run(name, 0, (table.data.ptr + row * start, coef, t(b1), t(b2), t(eps), *gs),
             grid=(blocks, len(chunk)))
