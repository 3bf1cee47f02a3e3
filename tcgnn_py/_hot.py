"""Layer 2: hot paths of repeated products: a closure per operand signature that only allocates and launches.

A product's slow path validates, resolves the precision, finds the launch and its scratch; its result
depends only on the operands' signatures (shapes, strides, dtypes, 16-byte alignment), the stream, the
device and the tuning, so the first call of a signature caches a closure (:func:`spmm_bind`) that later
calls with the same signature go straight to.
"""

import sys

import numpy as np

from ._device import get_cupy
from ._tuning import overrides_key
from ._validation import is_half
from ._plans import aligned16, spmm_plan, vec_dense_values
from ._launches import TF32SpmmLaunch, VecSpmmLaunch, half_launch_key, launch_key
from ._half import half_key, half_values
from ._ops import F32, HALF_MODES, SDDMM_BLOCKS_PER_WARP, VEC_TILE, nm_products, resolve_precision, result_dtype, spmm_raw

__all__ = [
    "HOT_PRECISIONS",
    "HOT_SDDMM_PRECISIONS",
    "cast_closure",
    "hot_key",
    "sddmm_bind",
    "spmm_bind",
]


# --- hot paths: repeated products with operands of one signature -----------------------
#
# A product's slow path validates, resolves the precision, finds the launch and its scratch.  Its result
# depends only on the operands' signatures (shapes, strides, dtypes, 16-byte alignment), the stream, the
# device and the tuning, so the first call of a signature caches a closure that only allocates the result
# and launches; later calls with the same signature go straight to it.  The cache lives on the tiling
# (matrices from ``with_values`` share it: a product's closure takes the matrix, for its values and casts).


#: Precisions the SpMM hot paths serve: the default, and the explicit precision the default resolves to for
#: the operands ("tf32" for float32 X, "fp16" / "bf16" for 16-bit X on the vector layout).
HOT_PRECISIONS = (None, "tf32", "fp16", "bf16")
#: Precisions the SDDMM hot path serves (float32 operands).
HOT_SDDMM_PRECISIONS = (None, "tf32")


def hot_key(values, X, out, precision=None):
    """The signature a cached product depends on (``out`` may be None)."""
    cp = sys.modules["cupy"]
    key = (values.dtype.char, X.shape, X.strides, X.dtype.char, X.data.ptr & 15,
           cp.cuda.get_current_stream().ptr, cp.cuda.runtime.getDevice(), overrides_key(), precision)
    if out is None:
        return key
    return key + (out.shape, out.strides, out.dtype.char, out.data.ptr & 15)


def spmm_bind(tiling, values, X, out, precision=None, casts=None):
    """``f(T, X, out) -> Y`` for ``T @ X`` with operands like these, or None when not cacheable.

    ``T`` is a matrix on ``tiling`` whose values have ``values``' dtype (its values and casts are read
    per call).  Cacheable, with a C-contiguous 2-D X and ``out`` and one launch (or two with a fixup):
    a float32 product on TF32 tensor cores (float32 X and values), a 16-bit X on the vector layout's
    16-bit MMAs whose result the kernel writes itself (see :func:`_half_bind`), and the N:M layouts'
    ``mma.sp`` products (``_sparse_tc.sp_bind``).
    Call it after the slow path ran once (the launch is then cached); ``casts`` is the matrix's cache of
    cast values that call filled (the 16-bit and N:M products launch for the values' form found there).
    """
    if X.ndim != 2 or not X.flags.c_contiguous:
        return None
    if out is not None and (not out.flags.c_contiguous or out.ndim != 2):
        return None
    if tiling.layout.pattern is not None:  # the N:M layouts' mma.sp kernels
        return nm_products()[1](tiling, values, X, out, precision, casts)
    if is_half(X.dtype):
        return _half_bind(tiling, values, X, out, precision, casts)
    if X.dtype != F32 or values.dtype != F32 or (out is not None and out.dtype != F32):
        return None
    M, D = tiling.shape[0], X.shape[1]
    if M == 0 or D == 0 or resolve_precision(precision, F32, tiling.tile_shape, X.dtype) != "tf32":
        return None
    cp = get_cupy()
    vec = D % 4 == 0 and X.data.ptr % 16 == 0 and (out is None or out.data.ptr % 16 == 0)
    launch = tiling.peek(launch_key("tf32", F32, D, vec))
    if not isinstance(launch, (TF32SpmmLaunch, VecSpmmLaunch)):
        return None
    run = launch.bind(tiling, F32, M, D)
    if isinstance(launch, VecSpmmLaunch) and launch.dense:
        bound = run

        def run(values, X, Y):
            bound(vec_dense_values(tiling, values), X, Y)

    shape, ndarray = (M, D), cp.ndarray
    if launch.fixup is None:
        def f(T, X, out):
            Y = ndarray(shape, F32) if out is None else out  # cupy.empty without its wrapper
            run(T._values, X, Y)
            return Y

        return f
    fixup = launch.fixup.bind(launch.partial(F32, D), M, D, tiling.layout.window)

    def f2(T, X, out):
        Y = ndarray(shape, F32) if out is None else out
        run(T._values, X, Y)
        fixup(Y)
        return Y

    return f2


def _half_bind(tiling, values, X, out, precision, casts=None):
    """:func:`spmm_bind` for a 16-bit X: the vector layout's 16-bit SpMM, or None.

    Cacheable where the slow path makes no copy: the product runs on the 16-bit MMAs
    (not the N:M layouts', nor TF32 on widened X) and its kernel writes the result's dtype
    (float32, or X's type).  Per call the closure takes the matrix's 16-bit values
    (:func:`half_values`, cached on the matrix) and launches.
    """
    xdt = X.dtype
    dtype = result_dtype(values.dtype, xdt) if out is None else out.dtype
    M, D = tiling.shape[0], X.shape[1]
    if M == 0 or D == 0 or tiling.tile_shape != VEC_TILE or tiling.layout.pattern is not None:
        return None
    if resolve_precision(precision, dtype, tiling.tile_shape, xdt) not in HALF_MODES:
        return None
    if dtype not in (F32, xdt):  # the slow path computes in float32 and rounds into a copy
        return None
    # A new result comes from the memory pool, 256-byte aligned, as the slow path's did.
    aligned = D % 8 == 0 and X.data.ptr % 16 == 0 and (out is None or out.data.ptr % 16 == 0)
    hv = (casts or {}).get(half_key(xdt))
    if hv is None:
        return None
    split = hv[0]
    launch = tiling.peek(half_launch_key(xdt, split, dtype, D, aligned))
    if not isinstance(launch, VecSpmmLaunch):
        return None
    run = launch.bind(tiling, F32, M, D, n_extra=1)  # float32 partial tiles; the values' unscale per call
    fixup = launch.fixup.bind(launch.partial(F32, D), M, D, tiling.layout.window) if launch.fixup else None
    return cast_closure(run, fixup, (M, D), dtype, half_key(xdt), lambda T: half_values(T._values, xdt, T._casts),
                        split, precision)


def cast_closure(run, fixup, shape, dtype, key, make, split, precision):
    """``f(T, X, out) -> Y``: a bound launch fed, per call, the matrix's cast values.

    ``T._casts[key]`` (made by ``make(T)`` on a miss, cached on the matrix) is ``(split, values, unscale)``;
    ``run(values, X, Y, unscale or values)`` launches, then the bound ``fixup(Y)`` if any.  The 16-bit and N:M
    hot paths: matrices sharing a tiling (``with_values``) each bring their own values, and one whose values
    take the other form than ``split`` (the launch bound) goes the slow way (:func:`spmm_raw`).
    """
    ndarray = get_cupy().ndarray

    def f(T, X, out):
        form, vals, unscale = T._casts.get(key) or make(T)
        if form != split:  # (hi, lo) pairs against values exact in X's type: another kernel
            return spmm_raw(T._tiling, T._values, X, dtype, precision, out=out, casts=T._casts)
        Y = ndarray(shape, dtype) if out is None else out
        run(vals, X, Y, vals if unscale is None else unscale)
        if fixup is not None:
            fixup(Y)
        return Y

    return f


def sddmm_bind(tiling, values, Xa, Xb, multiply_values, precision=None):
    """``f(values, Xa, Xb) -> e`` for SDDMM with operands like these, or None (as :func:`spmm_bind`)."""
    from .kernels import products as kp
    from .kernels.registry import get_kernel

    if values.dtype != F32 or tiling.nnz == 0:
        return None
    for X in (Xa, Xb):
        if X.ndim != 2 or X.dtype != F32 or not X.flags.c_contiguous:
            return None
    D = Xa.shape[1]
    if D == 0 or resolve_precision(precision, F32, tiling.tile_shape, F32) != "tf32":
        return None
    cp = get_cupy()
    nnz, aligned = tiling.nnz, aligned16(D, Xa, Xb)
    mv = np.int32(multiply_values)
    if tiling.tile_shape == VEC_TILE:
        units = spmm_plan(tiling, kp.VEC_SDDMM_BLOCKS, np.iinfo(np.int32).max)["units"]
        kernel = get_kernel("vec", kp.sddmm_vec_name(aligned))
        grid, block, smem = (-(-units.shape[0] // kp.VEC_WARPS),), (32 * kp.VEC_WARPS,), 0
        head = (units, np.int32(units.shape[0]), tiling.block_ptr, tiling.block_cols, tiling.tile_pos)
        tail = (np.int32(tiling.shape[0]), np.int32(D), mv)
    elif tiling.tile_shape == (16, 8):
        bpw, warps = SDDMM_BLOCKS_PER_WARP, kp.SDDMM_WARPS
        kernel = get_kernel("tf32", kp.sddmm_tf32_name(aligned))
        grid, block = (-(-tiling.n_blocks // (bpw * warps)),), (32 * warps,)
        smem = warps * kp.SDDMM_TF32_SMEM_PER_WARP
        head = (tiling.win_ptr, np.int32(tiling.n_windows), tiling.block_ptr, tiling.block_cols, tiling.tile_pos)
        tail = (np.int32(tiling.shape[0]), np.int32(tiling.n_blocks), np.int32(D), mv, np.int32(bpw))
    else:
        return None

    from .kernels.driver import BoundLaunch

    n = len(head)
    run = BoundLaunch(kernel.kernel.ptr, grid, block, head + (None,) * 4 + tail, range(n, n + 4),
                      cp.cuda.get_current_stream().ptr, smem)

    def f(values, Xa, Xb):
        out = cp.empty(nnz, F32)
        run(values, Xa, Xb, out)
        return out

    return f
