"""Layer 2: the forms a matrix's values take for the kernels: cast, dense per block, 16-bit (or (hi, lo) pairs).

Each is made once per values array and kept (per matrix in its cache of casts, or per tiling for the
latest arrays), so that a repeated product reads them without converting again.
"""

import functools

import numpy as np

from .. import _reference as ref
from .._cache import keep
from .._device import get_cupy, publish, to_host
from .._tuning import options
from ..tiles import HOST_PLAN_MAX

__all__ = ["DEVICE_VALUES", "VEC_DENSE_BYTES_MAX", "VEC_DENSE_KEEP", "half_key", "half_values", "values_as",
           "values_form", "vec_dense_values"]


def values_as(values, dtype, cache):
    """``values`` as ``dtype``, the cast made once and kept in the matrix's ``cache`` of casts."""
    if values.dtype == dtype:
        return values
    key = ("values", dtype.str)
    if key not in cache:
        cast = values.astype(dtype)
        if not isinstance(cast, np.ndarray):
            publish()  # complete before another stream uses it
        cache[key] = cast
    return cache[key]


#: The dense values of a vector tiling (32 floats per block) are a candidate while they take at most this much.
VEC_DENSE_BYTES_MAX = 1 << 30
#: Dense values kept per tiling, for the latest distinct value arrays (matrices sharing the tiling).
VEC_DENSE_KEEP = 4


def values_form(tiling, kind, values, build, limit):
    """``build(values)``, a form of a matrix's values (another order or layout), made once per values array and
    kept on the tiling under ``kind`` for the last ``limit`` arrays, each held with its values (so that the memory
    of an array in use is never another's; values are read-only by contract).  Not kept when made under a
    capture: the graph holds the scatter, and its arrays must not outlive it in a cache."""
    lru = tiling.peek(kind)
    if lru is None:
        lru = tiling.put(kind, {})
    hit = lru.get(id(values))
    if hit is not None and hit[0] is values:
        return hit[1]
    form = build(values)
    if tiling.xp is not np and tiling.xp.cuda.get_current_stream().is_capturing():
        return form
    return keep(lru, id(values), (values, form), limit)[1]


def vec_dense_values(tiling, values):
    """``(n_blocks * 32,)`` float32: ``values`` at ``32 * block + tile position``, zeros elsewhere, for the last
    :data:`VEC_DENSE_KEEP` values arrays (:func:`values_form`)."""
    def build(values):
        xp = tiling.xp
        dense = xp.zeros(tiling.n_blocks * 32, np.float32)
        eb = tiling.peek("vec_dense_blocks")
        if eb is None:
            eb = ref.entry_blocks(tiling.block_ptr, tiling.nnz).astype(np.int64)
            if not xp.cuda.get_current_stream().is_capturing():
                tiling.put("vec_dense_blocks", eb)
        dense[eb * 32 + tiling.tile_pos.astype(np.int64)] = values
        return dense

    return values_form(tiling, "vec_dense", values, build, VEC_DENSE_KEEP)


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
