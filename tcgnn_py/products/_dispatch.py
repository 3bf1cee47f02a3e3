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
from .._tuning import overrides_key
from ._autotune import timed_choices
from ._modes import (MISMATCH, PRECISIONS, VEC_TILE, Mode, as_operand, check_out, compute_dtype, resolve_precision,
                     result_dtype)
from ._problem import Plan, Problem
from ._values import DEVICE_VALUES
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
#: ... and its SDDMMs (``plan_sddmm(problem) -> Plan``): TF32 on the tensor-core tiles (16-bit operands widened),
#: else CUDA cores.
SDDMM = {
    (Mode.tf32, (16, 8), None): tf32,
    (Mode.tf32, VEC_TILE, None): vec,
    (Mode.exact, None, None): core,
}


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
    """The plan of signature ``key`` in the tiling's store of bound calls, built and kept on its first call (not
    under a capture)."""
    plans = tiling.bound()
    plan = plans.get(key)
    if plan is None:
        cp = sys.modules["cupy"]
        stream = cp.cuda.get_current_stream()
        plan = plans.put(key, build(), (cp.cuda.runtime.getDevice(), stream.ptr), stream.is_capturing())
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
    """The :class:`Plan` of an SDDMM for operands of this signature (device arrays): its :class:`Problem`'s
    family's."""
    problem = Problem.sddmm(tiling, values, Xa, Xb, dtype, precision, out, multiply_values)
    return SDDMM[problem.route].plan_sddmm(problem)
