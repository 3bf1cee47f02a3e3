"""Layer 2: 16-bit X products on the vector layout: the matrix's 16-bit values (one MMA, or (hi, lo) pairs),
the launch, and its binding for repeated calls.
"""

import functools

import numpy as np

from ._device import get_cupy, publish, to_host
from ._tuning import options
from ._plans import HOST_PLAN_MAX, aligned16
from ._launches import VecSpmmLaunch, cast_closure, half_launch_key, planned, run_half
from ._vec_choice import vec_launch, vec_timed

__all__ = [
    "DEVICE_VALUES",
    "bind_half",
    "half_key",
    "half_values",
    "result_and_operand",
    "spmm_half",
]


#: Marks a matrix's cache of casts when its values were made on the device (``with_values`` of a device array, as
#: in training steps): the 16-bit products then skip the exactness check of :func:`half_values` (a host read).
DEVICE_VALUES = "device_values"


def half_key(xdt):
    """The key of :func:`half_values`' result in a matrix's cache of casts."""
    return ("half_values", xdt.name, options()["half_exact_values"])


def half_values(values, xdt, cache):
    """``(split, values, unscale)`` for the 16-bit SpMM with operands of ``xdt``, cached per matrix.

    Values of X's type go as they are, and so do values that X's type holds
    exactly (``options()["half_exact_values"]``; unweighted graphs, small
    integers): one MMA per block pair, the same sums as the pairs below, whose
    ``lo`` parts would all be zero.  Finding that out reads one flag back from
    the device, once per matrix and type; it is skipped (pairs) under CUDA-graph
    capture and for values made on the device (:data:`DEVICE_VALUES`: a training
    step's new values would each cost a host read).  Other values (float32, or
    the other 16-bit type) become ``(hi, lo)`` pairs of ``xdt`` packed in a uint32 (hi in
    the low half): ``hi = xdt(v * scale)``, ``lo = xdt(v * scale - hi)``, the
    kernel sums both products and multiplies by ``unscale = 1 / scale``.
    ``scale`` is a power of two that keeps the largest finite float16 part below
    2**14 (1 for bfloat16); Inf and NaN values stay in ``hi`` (``lo = 0``), so
    they propagate as in float32.  ``unscale`` is a one-element device array,
    found without a host read.
    """
    key = half_key(xdt)
    hv = cache.get(key)
    if hv is not None:
        return hv
    cp = get_cupy()
    check = (options()["half_exact_values"] and not cache.get(DEVICE_VALUES)
             and not cp.cuda.get_current_stream().is_capturing())  # no host read under capture
    # The check reads the device anyway: small matrices are converted on the host, with NumPy (the same IEEE
    # roundings), so that a fresh process does not compile CuPy's kernels for each step below.
    xp = np if check and values.size <= HOST_PLAN_MAX else cp
    src = to_host(values) if xp is np else values  # synchronize!
    with np.errstate(over="ignore", invalid="ignore"):  # NumPy warns where CuPy is silent: out of range, Inf - Inf
        hv = _half_parts(cp, xp, values, src, xdt, check)
    cache[key] = publish(hv)  # complete before another stream uses it
    return hv


def _half_parts(cp, xp, values, src, xdt, check):
    """The ``(split, values, unscale)`` of :func:`half_values`, computed with ``xp`` from ``src`` (values there)."""
    v = None if values.dtype == xdt else src.astype(np.float32)
    bits = _round16(xp, v, xdt) if check and v is not None else None
    # synchronize! once per matrix and type; NaN compares unequal, so NaN values keep the pairs
    if bits is not None and not bool(xp.all(_widen16(xp, bits, xdt) == v)):
        bits = None
    if v is None:
        hv = (False, values, _device_one(cp))
    elif bits is not None:  # exact in xdt: one MMA on these values
        hv = (False, cp.asarray(bits), _device_one(cp))
    else:
        unscale = _device_one(cp)
        if xdt.name == "float16" and v.size:  # float16's range needs a scale (bfloat16 has float32's)
            a = xp.abs(v)
            amax = xp.where(xp.isfinite(a), a, np.float32(0)).max()
            e = xp.frexp(amax)[1]  # amax < 2**e
            scale = xp.where(amax > 0, xp.ldexp(np.float32(1), xp.clip(14 - e, -100, 100)), np.float32(1))
            v = v * scale.astype(np.float32)  # a power of two: exact
            unscale = cp.asarray((1 / scale).astype(np.float32).reshape(1))
        hi = _round16(xp, v, xdt)
        hf = _widen16(xp, hi, xdt)
        lo = _round16(xp, xp.where(xp.isfinite(hf), v - hf, np.float32(0)), xdt)  # Inf / NaN: all in hi
        hv = (True, cp.asarray(hi.astype(np.uint32) | (lo.astype(np.uint32) << 16)), unscale)
    return hv


@functools.lru_cache(maxsize=16)
def _device_one_on(device_id):
    return get_cupy().ones(1, np.float32)


def _device_one(cp):
    """A float32 1 on the current device (the unscale of unscaled values)."""
    return _device_one_on(cp.cuda.runtime.getDevice())


def _round16(cp, v, xdt):
    """float32 -> bits (uint16) of ``xdt``, round to nearest even."""
    if xdt.name == "float16":
        return v.astype(np.float16).view(np.uint16)
    u = v.view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def _widen16(cp, bits, xdt):
    """Bits (uint16) of ``xdt`` -> float32 (exact)."""
    if xdt.name == "float16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def result_and_operand(cp, tiling, X, dtype, out):
    """``(Y, X)``: the result (``out``, or a new array) and X C-contiguous; ``X`` None when there is nothing to do."""
    M, D = tiling.shape[0], X.shape[1]
    Y = cp.empty((M, D), dtype=dtype) if out is None else out
    if M == 0 or D == 0:
        return Y, None
    return Y, X if X.flags.c_contiguous else cp.ascontiguousarray(X)


def spmm_half(tiling, hv, X, dtype, out):
    """``A @ X`` for a 16-bit X on the vector layout: m16n8k16 MMAs, float32 accumulation, one rounding."""
    cp = get_cupy()
    split, vals, unscale = hv
    D = X.shape[1]
    Y, X = result_and_operand(cp, tiling, X, dtype, out)
    if X is None:
        return Y
    aligned = aligned16(D, X, Y, multiple=8)
    key = half_launch_key(X.dtype, split, dtype, D, aligned)
    launch = tiling.peek(key)
    if launch is None:
        half = (X.dtype.name, split, dtype.name)
        if options()["vec_timed_choice"]:
            plan = lambda: vec_timed(cp, tiling, dtype, D, aligned, vals, X, Y, half, unscale)  # noqa: E731
        else:
            plan = lambda: vec_launch(cp, tiling, dtype, D, aligned, half)  # noqa: E731
        launch = planned(tiling, key, plan)
    run_half(launch, tiling, vals, X, Y, unscale)
    return Y


def bind_half(tiling, xdt, dtype):
    """The binder of a 16-bit X's product on the vector layout whose kernel writes ``dtype`` (float32 or X's type).

    ``binder(values, casts, X, out, general)`` returns ``f(values, casts, X, out) -> Y`` once the launch for
    the form of the matrix's 16-bit values (:func:`half_values`, which the first call cached in ``casts``) is
    final, else None.  Per call ``f`` takes the matrix's 16-bit values and launches.
    """
    M = tiling.shape[0]

    def binder(values, casts, X, out, general):
        D = X.shape[1]
        key = half_key(xdt)
        hv = casts.get(key)
        if hv is None:
            return None
        split = hv[0]
        aligned = aligned16(D, X, out, multiple=8)  # out None: a new result, as the general path's was
        launch = tiling.peek(half_launch_key(xdt, split, dtype, D, aligned))
        if not isinstance(launch, VecSpmmLaunch):
            return None
        run = launch.bind(tiling, np.float32, M, D, n_extra=1)  # float32 partial tiles; the values' unscale per call
        fixup = launch.fixup.bind(launch.partial(np.float32, D), M, D, 8) if launch.fixup else None
        return cast_closure(run, fixup, (M, D), dtype, key, lambda v, c: half_values(v, xdt, c), split, general)

    return binder
