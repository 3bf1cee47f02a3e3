"""Layer 2: the N:M window grouping on the GPU, beside its NumPy reference, and the N:M layouts.

``group_slots(rows, cols, shape, window, pattern, xp)`` returns what
:func:`tcgnn_py.tiles._nm_windows.nm_groups` returns for ``slot_ptr`` and
``slot_cols`` (the same arrays, slot for slot), computed by the Numba kernel
:func:`tcgnn_py.kernels.nm_windows.group_windows` -- on the GPU with CuPy
arrays, in the CUDA simulator with NumPy arrays.  Each window's columns and
row masks come from the reference (host) for now.

:func:`regroup` turns SGT's tiled arrays (each window's columns ascending)
into those of an N:M layout (``"2:4"``, ``"1:2"``): the same entries, each
window's column slots in the grouping's order, every group of M slots holding
at most N entries of each row, padded to whole blocks.
"""

import numpy as np

from . import _nm_windows as ref
from .. import _reference
from .._device import array_module, to_host
from ..kernels.launch import launch_numba

__all__ = ["group_slots", "regroup"]


def regroup(arrays, shape, layout):
    """The tiled arrays of ``layout`` (an N:M :class:`~tcgnn_py.Layout`) from SGT's arrays of its tile shape.

    Lossless for every matrix: columns that cannot share a group get padding
    slots (column -1).  ``values`` and ``perm`` follow their entries.  The
    grouping runs on the arrays' device (CPU: the NumPy reference).
    """
    xp = array_module(arrays["tile_pos"])
    H, W = layout.tile_shape
    n, m = layout.pattern
    n_windows = arrays["win_ptr"].shape[0] - 1
    nnz = arrays["tile_pos"].shape[0]
    if nnz == 0:
        return dict(arrays)
    rows, cols = _reference.tiled_rows_cols(arrays["win_ptr"], arrays["block_cols"], arrays["block_ptr"],
                                            arrays["tile_pos"], H)
    if xp is np:
        g = ref.nm_groups(rows, cols, shape, H, (n, m))
        slot_ptr, slot_cols = g["slot_ptr"], g["slot_cols"]
    else:
        slot_ptr, slot_cols = group_slots(to_host(rows), to_host(cols), shape, H, (n, m), xp)  # synchronize!
    if slot_ptr.shape[0] < n_windows + 1:  # trailing empty windows
        slot_ptr = xp.concatenate((slot_ptr, xp.full(n_windows + 1 - slot_ptr.shape[0], slot_ptr[-1], np.int64)))
    n_cols = max(int(shape[1]), 1)
    n_slots = slot_cols.shape[0]
    blocks_w = -(-xp.diff(slot_ptr) // W)
    win_ptr = xp.concatenate((xp.zeros(1, np.int64), xp.cumsum(blocks_w)))
    n_blocks = int(win_ptr[-1])  # synchronize!
    sid = xp.arange(n_slots, dtype=np.int64)
    sw = xp.searchsorted(slot_ptr, sid, side="right") - 1
    padpos = win_ptr[sw] * W + (sid - slot_ptr[sw])  # slot -> position in the block-padded window
    block_cols = xp.full(n_blocks * W, -1, np.int32)
    block_cols[padpos] = slot_cols.astype(np.int32)
    real = slot_cols >= 0
    skey = sw[real] * n_cols + slot_cols[real]
    o = xp.argsort(skey)
    skey, spos = skey[o], padpos[real][o]
    epos = spos[xp.searchsorted(skey, (rows // H) * n_cols + cols)]  # entry -> its column's slot
    b = epos // W
    pos = (rows % H) * W + epos % W
    order = xp.argsort(b * (H * W) + pos)  # distinct keys
    block_ptr = xp.concatenate((xp.zeros(1, np.int64), xp.cumsum(xp.bincount(b, minlength=n_blocks))))
    return {
        "win_ptr": win_ptr.astype(np.int32),
        "block_cols": block_cols.reshape(n_blocks, W),
        "block_ptr": block_ptr.astype(np.int32),
        "tile_pos": pos[order].astype(_reference.tile_pos_dtype(H, W)),
        "values": arrays["values"][order],
        "perm": arrays["perm"][order].astype(np.int32),
    }

_WARPS_PER_BLOCK = 4


def group_slots(rows, cols, shape, window=16, pattern=(2, 4), xp=np):
    """``(slot_ptr, slot_cols)`` of the N:M grouping of every row window (arrays of ``xp``)."""
    from ..kernels.nm_windows import MAX_M, group_windows

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
