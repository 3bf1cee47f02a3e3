"""Layer 2, the engine's front door: one :class:`Plan` per operand signature, the raw-buffer products that run
them, and the table of which family runs which product.

``spmm_raw`` and ``sddmm_raw`` are the private raw-buffer entry points: the public
:func:`tcgnn_py.spmm` / :func:`tcgnn_py.sddmm` and ``TiledMatrix.__matmul__`` check shapes with
scipy's wording, then land here.  On the host they run the NumPy/SciPy reference.  On the GPU a
product's result depends only on its operands' signature (:func:`signature`: shapes, strides,
dtypes, 16-byte alignment, the stream, the device, the tuning overrides and the precision asked
for), so the first call of a signature builds a :class:`Plan` -- precision resolved, kernel family
and result type fixed -- and the tiling keeps it under that signature.  Every call of the signature
runs that plan: its general form converts operands and plans its launch; once the launch is final
the plan binds it, and from then on a call allocates the result and launches.  The public entry
points look the signature up first and call a bound plan directly (:meth:`Plan.bound`), so a
repeated product skips validation that the signature already proves.
"""

import sys

import numpy as np

from .. import _reference as ref
from .._device import get_cupy
from .._tuning import overrides_key
from ._autotune import timed_choices
from ._modes import (F32, MISMATCH, PRECISIONS, TC_TILES, VEC_TILE, Mode, as_operand, check_out, compute_dtype,
                     resolve_precision, result_dtype)
from ._problem import Operand, Plan, Problem, aligned16
from ._values import DEVICE_VALUES, values_as
from .families import core, half, sparse, tf32, vec

# The engine's front door: what TiledMatrix needs from the engine comes through this module only.
__all__ = ["Plan", "sddmm_raw", "signature", "spmm_raw", "DEVICE_VALUES", "MISMATCH", "as_operand", "check_out",
           "result_dtype", "timed_choices"]

#: Which family plans ``A @ X`` (``plan(problem) -> Plan``), by :attr:`Problem.route`: (mode, tile shape, N:M
#: pattern), ``"half"`` for the 16-bit MMAs; the CUDA cores take every tiling in ``Mode.exact``.  A new family is
#: its module and a line here.
SPMM = {
    (Mode.tf32, (16, 8), None): tf32,  # TC-GNN's tiles
    (Mode.tf32, VEC_TILE, None): vec,  # the vector layout
    ("half", VEC_TILE, None): half,  # 16-bit X on the vector layout
    ("half", (16, 16), (2, 4)): sparse,  # mma.sp: 16-bit X on "2:4"
    (Mode.tf32, (16, 8), (1, 2)): sparse,  # ... TF32 on "1:2"
    (Mode.exact, None, None): core,
}
#: ... and its SDDMM launches (``sddmm_launch``), by mode and tile shape: TF32 on the tensor-core tiles, else CUDA
#: cores.
SDDMM = {(Mode.tf32, (16, 8)): tf32, (Mode.tf32, VEC_TILE): vec}


def signature(values, X, out=None, precision=None, op=None):
    """The one key of a product's plan: what its result and its launch depend on (``out`` may be None).

    ``op`` tells products apart that share operand shapes (SDDMM's ``("sddmm", multiply_values)``);
    for SDDMM ``out`` is ``Xb``.
    """
    cp = sys.modules["cupy"]
    key = (op, values.dtype.char, X.shape, X.strides, X.dtype.char, X.data.ptr & 15,
           cp.cuda.get_current_stream().ptr, cp.cuda.runtime.getDevice(), overrides_key(), precision)
    if out is None:
        return key
    return key + (out.shape, out.strides, out.dtype.char, out.data.ptr & 15)


def _plan(tiling, key, build):
    plans = tiling.plans()
    plan = plans.get(key)
    if plan is None:
        plan = plans[key] = build()
    return plan


# --- SpMM ------------------------------------------------------------------


def spmm_raw(tiling, values, X, dtype, precision=None, out=None, casts=None):
    """``A @ X`` for a 2-D X of shape ``(tiling.shape[1], D)`` already on the tiling's device.

    ``dtype`` is the result's: the promotion of the values' and X's types, or ``out``'s (a function
    of the signature, which the plan fixes).  ``out`` (optional) is a validated C-contiguous array
    of the result's shape and dtype on the same device; ``casts`` caches ``values`` cast to the
    product's dtype (per matrix).
    """
    dtype = np.dtype(dtype)
    if isinstance(X, np.ndarray):
        # Validated only: the host computes exactly in its dtype.
        resolve_precision(precision, dtype, tiling.tile_shape, X.dtype, tiling.layout.pattern)
        Y = ref.spmm(tiling.arrays(values), tiling.shape, tiling.layout.window, X, compute_dtype(dtype))
        Y = Y.astype(dtype, copy=False)
        if out is None:
            return Y
        out[...] = Y
        return out
    if precision not in PRECISIONS:  # unhashable or unknown: the error names it
        resolve_precision(precision, dtype, tiling.tile_shape, X.dtype)
    plan = _plan(tiling, signature(values, X, out, precision),
                 lambda: spmm_plan(tiling, values, X, dtype, precision, out))
    return plan(values, {} if casts is None else casts, X, out)


def spmm_plan(tiling, values, X, dtype, precision, out):
    """The :class:`Plan` of ``A @ X`` for operands of this signature (device arrays): its :class:`Problem`'s
    family's."""
    problem = Problem.spmm(tiling, values, X, dtype, precision, out)
    return SPMM[problem.route].plan(problem)


# --- SDDMM -----------------------------------------------------------------


def sddmm_gpu(tiling, values, Xa, Xb, dtype, multiply_values=False, precision=None, casts=None, out=None):
    """SDDMM values in tiled order on the GPU (see :func:`sddmm_raw`)."""
    dtype = np.dtype(dtype)
    cdt = compute_dtype(dtype)
    operand = Xa.dtype if Xa.dtype == Xb.dtype else None
    mode = resolve_precision(precision, dtype, tiling.tile_shape, operand, tiling.layout.pattern)
    if mode.half:
        # 16-bit inputs widen exactly to TF32: the same products, accumulated in float32 (CUDA cores on 2:4 tiles).
        mode = Mode.tf32 if tiling.tile_shape in TC_TILES else Mode.exact
    if cdt != dtype:
        e = sddmm_gpu(tiling, values, Xa, Xb, cdt, multiply_values, "tf32" if mode is Mode.tf32 else "fp32", casts)
        if out is None:
            return e.astype(dtype)
        out[...] = e
        return out
    cp = get_cupy()
    nnz = tiling.nnz
    if out is None:
        out = cp.empty(nnz, dtype=dtype)
    D = Xa.shape[1]
    if nnz == 0:
        return out
    if D == 0:
        out.fill(0)
        return out
    Xa = cp.ascontiguousarray(Xa, dtype=dtype)
    Xb = cp.ascontiguousarray(Xb, dtype=dtype)
    values = values_as(values, dtype, {} if casts is None else casts)
    aligned = aligned16(D, Operand.of(Xa), Operand.of(Xb))
    sddmm_launch(tiling, mode, dtype, D, aligned, multiply_values).run(values, Xa, Xb, out)
    return out


def sddmm_launch(tiling, mode, dtype, D, aligned, multiply_values):
    """The SDDMM's launch for ``mode`` on this tile shape: the family's (TF32 tensor cores on the tile shape's family,
    else CUDA cores), planned once, kept on the tiling."""
    family = SDDMM.get((mode, tiling.tile_shape), core)
    return tiling.cached(("sddmm_launch", mode, np.dtype(dtype).char, D, aligned, bool(multiply_values)),
                         lambda: family.sddmm_launch(tiling, dtype, D, aligned, multiply_values))


def bind_sddmm(tiling, multiply_values, aligned):
    """The binder of a float32 SDDMM on TF32 tensor cores: ``binder(values, casts, Xa, Xb, out, general)``
    returns ``f(values, casts, Xa, Xb, out) -> e`` (``out`` None) with the launch bound."""
    def binder(values, casts, Xa, Xb, out, general):
        D = Xa.shape[1]
        run = sddmm_launch(tiling, Mode.tf32, F32, D, aligned, multiply_values).bind()
        nnz, empty = tiling.nnz, get_cupy().empty

        def f(values, casts, Xa, Xb, out):
            e = empty(nnz, F32)
            run(values, Xa, Xb, e)
            return e

        return f

    return binder


def sddmm_raw(tiling, values, Xa, Xb, dtype, multiply_values=False, precision=None, casts=None, out=None):
    """Values ``<Xa[i], Xb[j]>`` (times the entry's value if ``multiply_values``) in tiled order.

    ``Xa`` is ``(shape[0], D)`` and ``Xb`` ``(shape[1], D)``, on the tiling's device; ``dtype``
    is the promotion of theirs (and the values' if ``multiply_values``); ``out`` (device only) is a
    C-contiguous ``(nnz,)`` array of ``dtype`` to write.
    """
    dtype = np.dtype(dtype)
    if isinstance(Xa, np.ndarray):
        operand = Xa.dtype if Xa.dtype == Xb.dtype else None
        resolve_precision(precision, dtype, tiling.tile_shape, operand, tiling.layout.pattern)
        e = ref.sddmm(tiling.arrays(values), tiling.shape, tiling.layout.window, Xa, Xb, compute_dtype(dtype),
                      multiply_values)
        return e.astype(dtype, copy=False)
    if precision not in PRECISIONS:
        resolve_precision(precision, dtype, tiling.tile_shape)
    mv = bool(multiply_values)
    plan = _plan(tiling, signature(values, Xa, Xb, precision, ("sddmm", mv, out is not None)),
                 lambda: sddmm_plan(tiling, values, Xa, Xb, dtype, mv, precision, out))
    return plan(values, {} if casts is None else casts, Xa, Xb, out)


def sddmm_plan(tiling, values, Xa, Xb, dtype, multiply_values, precision, out):
    """The :class:`Plan` of an SDDMM for operands of this signature (device arrays)."""
    operand = Xa.dtype if Xa.dtype == Xb.dtype else None
    resolve_precision(precision, dtype, tiling.tile_shape, operand, tiling.layout.pattern)  # errors at once

    def general(values, casts, Xa, Xb, out):
        return sddmm_gpu(tiling, values, Xa, Xb, dtype, multiply_values, precision, casts, out)

    bindable = (out is None and values.dtype == F32 and dtype == F32 and tiling.nnz and Xa.shape[1]
                and all(x.ndim == 2 and x.dtype == F32 and x.flags.c_contiguous for x in (Xa, Xb))
                and resolve_precision(precision, F32, tiling.tile_shape, F32) is Mode.tf32)
    if not bindable:
        return Plan(general)
    return Plan(general, bind_sddmm(tiling, multiply_values, aligned16(Xa.shape[1], Operand.of(Xa), Operand.of(Xb))))
