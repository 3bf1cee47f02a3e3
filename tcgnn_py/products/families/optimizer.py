"""Layer 2: the optimizer family on the GPU -- Adam over many tensors in one launch per eight, its step
count and bias corrections advanced on the device (:mod:`tcgnn_py.nn`'s ``Adam`` keeps the state).
"""

import numpy as np

from ..._device import get_cupy
from ...kernels import nn as kn
from ...kernels.driver import slot_value
from .. import _small as sk

__all__ = ["ADAM_MULTI", "adam_tick", "adam_table", "adam_multi"]

ADAM_MULTI = kn.ADAM_MULTI


def adam_tick(t, coef, lr, b1, b2):
    """Advance the device step count ``t`` and write the bias corrections ``coef`` (one thread)."""
    sk.planned(("adam_tick", float(lr), float(b1), float(b2)), lambda: sk.launch(
        kn.TICK, 1, 1, ("t", "coef"), lr=lr, b1=b1, b2=b2)).run(t, coef)


def adam_table(params, moments, decays):
    """The device table of :func:`adam_multi`: per parameter its address, its moments' addresses, its size and its
    weight decay (made once per set of arrays; a host-to-device copy, so not under a capture)."""
    rows = [(p.data.ptr, m.data.ptr, v.data.ptr, p.size, slot_value(float(wd)))
            for p, (m, v), wd in zip(params, moments, decays)]
    return get_cupy().asarray(np.array(rows, dtype=np.int64).reshape(len(rows), kn.ADAM_SLOTS))


def adam_multi(table, sizes, grads, coef, b1, b2, eps, tick=None):
    """One Adam step of the tensors in ``table`` (:func:`adam_table`; ``sizes`` their element counts) with
    ``grads`` (C-contiguous, of the parameters' dtype, in the table's order): one launch per 8 tensors, each bound
    once per table and kept (a step's gradients are new arrays, its table and coefficients are not).

    ``tick``: ``(t, lr)`` for the step's first call, whose first launch also advances the step count ``t`` (int64
    ``[count, 0]``: its second element counts the launch's finished blocks) and writes ``coef`` as
    :func:`adam_tick` does, a launch less per step; else ``coef`` is read as a tick left it."""
    dtype = grads[0].dtype
    for start in range(0, len(grads), ADAM_MULTI):
        chunk = grads[start:start + ADAM_MULTI]
        blocks = sk.grid(max(sizes[start:start + ADAM_MULTI]))
        address = table.data.ptr + kn.ADAM_SLOTS * 8 * start
        t, lr = (None, 0.0) if tick is None or start else tick
        key = ("adam_multi", dtype, address, len(chunk), blocks, coef.data.ptr, float(b1), float(b2), float(eps),
               None if t is None else (t.data.ptr, float(lr)))
        sk.bound_once(key, _adam_bind, dtype, address, len(chunk), blocks, coef, b1, b2, eps, t, lr)(*chunk)


def _adam_bind(dtype, address, count, blocks, coef, b1, b2, eps, t, lr):
    """The launch of :func:`adam_multi` for ``count`` tensors of the table at ``address``, their gradients its
    operands (the other slots null); ticking where ``t`` is given."""
    v = dtype.type
    unused = {f"g{i}": None for i in range(count, ADAM_MULTI)}
    return sk.launch(sk.name(kn.adam_multi_name, dtype), (blocks, count), sk.THREADS,
                     tuple(f"g{i}" for i in range(count)), table=address, coef=coef, b1=v(b1), b2=v(b2), eps=v(eps),
                     t=t, lr=float(lr), b1d=float(b1), b2d=float(b2), **unused).bind()
