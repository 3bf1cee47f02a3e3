"""Layer 1: what the Numba kernels share -- the full warp mask, a binary search, a lane-group scan.

Importing this module imports Numba; it also applies the NumPy alias that
numba-cuda 0.30 needs on NumPy 2.5.
"""

from .._device import patch_numpy_for_numba

patch_numpy_for_numba()

from numba import cuda  # noqa: E402

__all__ = ["FULL_MASK", "lower_bound", "inclusive_scan"]

#: Every lane of the warp takes part (kernels keep out-of-range lanes in the collectives).
FULL_MASK = 0xFFFFFFFF


@cuda.jit(device=True, inline=True)
def lower_bound(indices, lo, hi, value):
    """First position in ``indices[lo:hi]`` (sorted) whose value is >= ``value``."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if indices[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@cuda.jit(device=True, inline=True)
def inclusive_scan(x, lane, width):
    """Sum of ``x`` over lanes ``0..lane`` of an aligned group of ``width`` lanes (``shfl_up``, Hillis-Steele).

    Every lane of the warp must call it (``FULL_MASK``); ``lane`` is the lane's index in its group.
    """
    off = 1
    while off < width:
        v = cuda.shfl_up_sync(FULL_MASK, x, off)
        if lane >= off:
            x += v
        off <<= 1
    return x
