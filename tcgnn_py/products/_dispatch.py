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
from ._launch import Launch, launch_key, overlaps, planned, run_spmm
from ._modes import (F32, MISMATCH, PRECISIONS, TC_TILES, VEC_TILE, Mode, as_operand, check_out, compute_dtype,
                     resolve_precision, result_dtype)
from ._plans import aligned16
from ._values import DEVICE_VALUES, half_values, values_as, vec_dense_values
from .families import core, half, sparse, tf32, vec

# The engine's front door: what TiledMatrix needs from the engine comes through this module only.
__all__ = ["Plan", "sddmm_raw", "signature", "spmm_raw", "DEVICE_VALUES", "MISMATCH", "as_operand", "check_out",
           "result_dtype", "timed_choices"]

#: Which family plans the float32 products of a mode on a tile shape (``None``: any shape).  The 16-bit modes
#: go to ``half`` (vector layout) and the N:M layouts to ``sparse``, in :func:`spmm_plan`.
_FAMILIES = {(Mode.tf32, (16, 8)): tf32, (Mode.tf32, VEC_TILE): vec, (Mode.exact, None): core}


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


class Plan:
    """How every product of one signature runs.

    ``general(values, casts, *operands)`` is always right for the signature: it converts what
    needs converting and plans (or finds) its launch on the tiling.  ``binder`` (None where the
    signature can never take a bound launch: CUDA cores, a copy of X or of the result) returns,
    once the launch is final, ``f(values, casts, *operands)`` that only allocates and launches --
    None while it is not (the timed choice's candidates still compile): the next call tries again.
    """

    __slots__ = ("general", "binder", "bound")

    def __init__(self, general, binder=None):
        self.general = general
        self.binder = binder
        self.bound = None

    def __call__(self, values, casts, *operands):
        bound = self.bound
        if bound is not None:
            return bound(values, casts, *operands)
        Y = self.general(values, casts, *operands)
        if self.binder is not None:
            self.bound = self.binder(values, casts, *operands, general=self.general)
        return Y


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
    """The :class:`Plan` of ``A @ X`` for operands of this signature (device arrays)."""
    mode = resolve_precision(precision, dtype, tiling.tile_shape, X.dtype, tiling.layout.pattern)
    sp = tiling.layout.pattern is not None and mode is not Mode.exact  # sparse tensor cores (N:M layouts)
    # The kernels write ``kdt``: the result's dtype, or float32 rounded once into it afterwards (a 16-bit
    # result the kernel does not write, or one computed on widened X).
    if mode.half:
        kdt = dtype if dtype in (F32, X.dtype) else F32
    else:
        kdt = compute_dtype(dtype)

    def general(values, casts, X, out):
        # An out the kernel can write directly, unless it overlaps X (read while writing): then a temporary.
        direct = out if out is not None and kdt == dtype and not overlaps(out, X) else None
        if sp:  # 16-bit X on "2:4", TF32 on "1:2"
            Xs = X if mode.half else X.astype(F32, copy=False)
            Y = sparse.spmm_sp(tiling, values, Xs, kdt, direct, casts)
        elif mode.half:
            Y = half.spmm_half(tiling, half_values(values, X.dtype, casts), X, kdt, direct)
        else:
            Y = spmm_f32(tiling, values, X, kdt, mode, direct, casts)
        if out is None:
            return Y if kdt == dtype else Y.astype(dtype)
        if Y is not out:
            out[...] = Y
        return out

    M, D = tiling.shape[0], X.shape[1]
    # A bound launch takes X as it is and writes the result itself.
    bindable = (kdt == dtype and M and D and X.ndim == 2 and X.flags.c_contiguous
                and (out is None or out.ndim == 2 and out.flags.c_contiguous))
    binder = None
    if bindable and sp and (mode.half or X.dtype == F32):
        binder = sparse.bind_sp(tiling, X.dtype, dtype)
    elif bindable and not sp and mode.half:
        binder = half.bind_half(tiling, X.dtype, dtype)
    elif bindable and not sp and mode is Mode.tf32 and X.dtype == F32 and values.dtype == F32:
        binder = bind_f32(tiling)
    if binder is not None and out is not None:
        binder = _guard_overlap(binder)
    return Plan(general, binder)


def _guard_overlap(binder):
    """A binder whose launch goes the general way for an ``out`` that overlaps X (read while written)."""
    def bind(values, casts, X, out, general):
        f = binder(values, casts, X, out, general=general)
        if f is None:
            return None

        def guarded(values, casts, X, out):
            if overlaps(out, X):
                return general(values, casts, X, out)
            return f(values, casts, X, out)

        return guarded

    return bind


# --- the float32 products on TF32 tensor cores and CUDA cores -----------------


def spmm_f32(tiling, values, X, dtype, mode, out, casts):
    """``A @ X`` into ``out`` (or a new array) of ``dtype``: TF32 tensor cores (``Mode.tf32``) or CUDA cores.

    The launch is the family's for the mode and tile shape (:data:`_FAMILIES`), planned once per width and
    alignment and kept on the tiling.
    """
    cp = get_cupy()
    M = tiling.shape[0]
    D = X.shape[1]
    Y = cp.empty((M, D), dtype=dtype) if out is None else out
    if M == 0 or D == 0:
        return Y
    if X.dtype != dtype or not X.flags.c_contiguous:
        X = cp.ascontiguousarray(X, dtype=dtype)
    values = values_as(values, dtype, casts)
    vec = mode is Mode.tf32 and aligned16(D, X, Y)
    key = launch_key(mode, dtype, D, vec)
    launch = tiling.peek(key)  # planned once: no closure per call
    if launch is None:
        family = _FAMILIES[mode, tiling.tile_shape if mode is Mode.tf32 else None]
        launch = planned(tiling, key, lambda: family.spmm_launch(tiling, dtype, D, vec, (values, X, Y)))
    run_spmm(launch, tiling, values, X, Y)
    return Y


def bind_f32(tiling):
    """The binder of a float32 product on TF32 tensor cores (float32 X and values, result written directly).

    ``binder(values, casts, X, out, general)`` returns ``f(values, casts, X, out) -> Y`` with the
    tiling's final launch for X's width and alignment bound (one launch, or two with a fixup), or
    None while the launch is not final.
    """
    M = tiling.shape[0]

    def binder(values, casts, X, out, general):
        D = X.shape[1]
        vec = aligned16(D, X, out)  # out None: a new result, as the general path's was
        launch = tiling.peek(launch_key(Mode.tf32, F32, D, vec))
        if not isinstance(launch, Launch):
            return None
        run = launch.bind()
        if launch.dense:
            bound = run

            def run(values, X, Y):
                bound(vec_dense_values(tiling, values), X, Y)

        shape, ndarray = (M, D), get_cupy().ndarray

        def f(values, casts, X, out):
            Y = ndarray(shape, F32) if out is None else out  # cupy.empty without its wrapper
            run(values, X, Y)
            return Y

        return f

    return binder


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
    sddmm_launch(tiling, mode, dtype, D, aligned16(D, Xa, Xb), multiply_values).run(values, Xa, Xb, out)
    return out


def sddmm_launch(tiling, mode, dtype, D, aligned, multiply_values):
    """The SDDMM's :class:`Launch` for ``mode`` on this tile shape: the family's, planned once, kept on the tiling."""
    def plan():
        if mode is not Mode.tf32:
            return core.sddmm_launch(tiling, dtype, D, multiply_values)
        return _FAMILIES[mode, tiling.tile_shape].sddmm_launch(tiling, D, aligned, multiply_values)

    return tiling.cached(("sddmm_launch", mode, np.dtype(dtype).char, D, aligned, bool(multiply_values)), plan)


def bind_sddmm(tiling, multiply_values):
    """The binder of a float32 SDDMM on TF32 tensor cores: ``binder(values, casts, Xa, Xb, out, general)``
    returns ``f(values, casts, Xa, Xb, out) -> e`` (``out`` None) with the launch bound."""
    def binder(values, casts, Xa, Xb, out, general):
        D = Xa.shape[1]
        run = sddmm_launch(tiling, Mode.tf32, F32, D, aligned16(D, Xa, Xb), multiply_values).bind()
        nnz, empty = tiling.nnz, get_cupy().empty

        def f(values, casts, Xa, Xb, out):
            e = empty(nnz, F32)
            run(values, Xa, Xb, e)
            return e

        return f

    return binder

# --- SDDMM -----------------------------------------------------------------


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
    return Plan(general, bind_sddmm(tiling, multiply_values) if bindable else None)
