"""Layer 2: the N:M window grouping (issue 19) on the GPU, beside its NumPy reference.

``group(rows, cols, shape, window, pattern, xp)`` returns what
:func:`tcgnn_py._nm_windows.nm_groups` returns for ``slot_ptr`` and
``slot_cols`` (the same arrays, slot for slot), computed by the Numba kernel
:func:`tcgnn_py.kernels.nm_windows.group_windows` -- on the GPU with CuPy
arrays, in the CUDA simulator with NumPy arrays.  Each window's columns and
row masks come from the reference (host) for now; the products that will
consume the grouping (``mma.sp`` kernels) are not written yet.
"""

import numpy as np

from . import _nm_windows as ref
from .kernels.launch import launch_numba

__all__ = ["group"]

_WARPS_PER_BLOCK = 4


def group(rows, cols, shape, window=16, pattern=(2, 4), xp=np):
    """``(slot_ptr, slot_cols)`` of the N:M grouping of every row window (arrays of ``xp``)."""
    from .kernels.nm_windows import MAX_M, group_windows

    n, m = pattern
    if n not in (1, 2) or not n < m <= MAX_M:
        raise ValueError(f"the grouping kernel handles 1:M and 2:M patterns with M <= {MAX_M}, got {n}:{m}")
    win_ptr, columns, masks = ref.window_columns(rows, cols, shape[1], window)
    n_windows = win_ptr.shape[0] - 1
    d_ptr, d_cols, d_masks = (xp.asarray(a) for a in (win_ptr, columns, masks))
    counts = xp.zeros(max(n_windows, 1), np.int64)
    empty = xp.zeros(1, np.int64)
    grid, block = max(1, -(-n_windows // _WARPS_PER_BLOCK)), 32 * _WARPS_PER_BLOCK
    launch_numba(group_windows, grid, block, d_ptr, d_cols, d_masks, n, m, 0, counts, counts, empty)
    slot_ptr = xp.zeros(n_windows + 1, np.int64)
    slot_ptr[1:] = xp.cumsum(counts[:n_windows])
    total = int(slot_ptr[-1])  # synchronize!
    slot_cols = xp.empty(max(total, 1), np.int64)
    launch_numba(group_windows, grid, block, d_ptr, d_cols, d_masks, n, m, 1, slot_ptr, counts, slot_cols)
    return slot_ptr, slot_cols[:total]
