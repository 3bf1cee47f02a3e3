"""Layer 0: the NumPy reference of everything the GPU computes.

This module is the test oracle and the no-GPU fallback.  It is written for
clarity and exactness, vectorised with NumPy, and defines the tiled format's
arrays bit for bit: the Numba SGT kernels must produce identical arrays.

Tiled format (window height ``H``, block width ``W``; defaults 16 and 8)
----------------------------------------------------------------------
Rows are cut into ``n_windows = ceil(n_rows / H)`` row windows.  The distinct
column ids that occur in a window, in ascending order, are *condensed*: the
``k``-th distinct column of a window goes to the window's block ``k // W``,
slot ``k % W``.  Each block is one ``H x W`` tensor-core tile of A.

``win_ptr``    int32 ``(n_windows + 1,)``: blocks of window ``w`` are
               ``win_ptr[w]:win_ptr[w + 1]``.
``block_cols`` int32 ``(n_blocks, W)``: original column id of each slot, ``-1``
               for padding (only the last block of a window is padded).
``block_ptr``  int32 ``(n_blocks + 1,)``: stored entries of block ``b`` are
               ``block_ptr[b]:block_ptr[b + 1]``.
``tile_pos``   uint8 (uint16 if ``H * W > 256``) ``(nnz,)``: local position
               ``row_in_window * W + slot`` of each entry; strictly increasing
               within a block, so each block's entries are in row-major order.
``values``     ``(nnz,)``: the entry values, in tiled order.
``perm``       int32 ``(nnz,)``: for each tiled entry, its index in the canonical
               CSR (rows in order, column indices sorted, duplicates summed,
               explicit zeros kept).  ``tocsr()`` and ``with_values`` use it.

Every stored entry appears exactly once, so a kernel touches it once; no window's
edges are rescanned per block.
"""

import numpy as np

from ._device import array_module

__all__ = [
    "canonicalize_csr",
    "sum_runs",
    "translate",
    "tiled_to_csr",
    "tiled_rows_cols",
    "entry_blocks",
    "edge_rows",
    "spmm",
    "sddmm",
    "tile_pos_dtype",
]


def tile_pos_dtype(window, block):
    """dtype of ``tile_pos`` for an ``window x block`` tile."""
    return np.dtype(np.uint8) if window * block <= 256 else np.dtype(np.uint16)


def sum_runs(data, starts):
    """Sum ``data`` over runs beginning at ``starts``, left to right.

    The order is fixed (sequential within a run) so that the GPU and the
    reference give bitwise-identical sums of duplicate entries.
    """
    n = data.shape[0]
    ends = np.append(starts[1:], n)
    lengths = ends - starts
    out = data[starts].copy()
    if n == 0:
        return out
    for d in range(1, int(lengths.max(initial=1))):
        live = lengths > d
        out[live] = out[live] + data[starts[live] + d]
    return out


def canonicalize_csr(data, indices, indptr, shape):
    """Return ``(data, indices, indptr)`` with sorted indices and duplicates summed.

    Duplicates are summed in their input order (stable sort), explicit zeros are
    kept.  Inputs are validated arrays (see ``_validation``).
    """
    n_rows, n_cols = shape
    nnz = indices.shape[0]
    rows = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(indptr))
    if nnz < 2 or not np.any((rows[1:] == rows[:-1]) & (indices[1:] <= indices[:-1])):
        return data, indices, indptr
    key = rows * n_cols + indices
    order = np.argsort(key, kind="stable")
    key = key[order]
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    new_data = sum_runs(data[order], starts)
    new_rows = key[starts] // n_cols
    new_indices = (key[starts] % n_cols).astype(np.int32)
    new_indptr = np.searchsorted(new_rows, np.arange(n_rows + 1), side="left").astype(np.int32)
    return new_data, new_indices, new_indptr


def translate(data, indices, indptr, shape, window=16, block=8):
    """Sparse Graph Translation of a canonical CSR matrix into the tiled format.

    Returns a dict with the arrays documented in the module docstring.
    """
    n_rows, n_cols = shape
    H, W = window, block
    n_windows = -(-n_rows // H)
    rows = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(indptr))
    win = rows // H
    # Distinct (window, column) pairs in ascending order give the condensed ids.
    key = win * max(n_cols, 1) + indices
    uniq, inverse = np.unique(key, return_inverse=True)
    uniq_win = uniq // max(n_cols, 1)
    distinct = np.bincount(uniq_win, minlength=n_windows)
    first_of_win = np.concatenate(([0], np.cumsum(distinct)))
    k = inverse - first_of_win[win]  # condensed index within the window
    blocks_per_win = -(-distinct // W)
    win_ptr = np.concatenate(([0], np.cumsum(blocks_per_win))).astype(np.int32)
    n_blocks = int(win_ptr[-1])
    b = win_ptr[win].astype(np.int64) + k // W
    slot = k % W
    pos = (rows - win * H) * W + slot

    block_cols = np.full(n_blocks * W, -1, dtype=np.int32)
    block_cols[b * W + slot] = indices
    order = np.lexsort((pos, b))
    block_ptr = np.concatenate(([0], np.cumsum(np.bincount(b, minlength=n_blocks)))).astype(np.int32)
    return {
        "win_ptr": win_ptr,
        "block_cols": block_cols.reshape(n_blocks, W),
        "block_ptr": block_ptr,
        "tile_pos": pos[order].astype(tile_pos_dtype(H, W)),
        "values": data[order],
        "perm": order.astype(np.int32),
    }


def edge_rows(indptr, nnz):
    """Row of every stored entry of a CSR matrix (int32; any device)."""
    xp = array_module(indptr)
    rows = xp.searchsorted(indptr, xp.arange(nnz, dtype=np.int32), side="right") - 1
    return rows.astype(np.int32)


def entry_blocks(block_ptr, nnz):
    """Block of every tiled entry (any device)."""
    xp = array_module(block_ptr)
    return xp.searchsorted(block_ptr, xp.arange(nnz), side="right") - 1


def tiled_rows_cols(win_ptr, block_cols, block_ptr, tile_pos, window):
    """Global (row, column) of every tiled entry, in tiled order (int64; any device)."""
    xp = array_module(tile_pos)
    n_blocks, W = block_cols.shape
    block_win = xp.searchsorted(win_ptr, xp.arange(n_blocks), side="right") - 1
    entry_block = entry_blocks(block_ptr, tile_pos.shape[0])
    pos = tile_pos.astype(np.int64)
    rows = block_win[entry_block].astype(np.int64) * window + pos // W
    cols = block_cols.reshape(-1)[entry_block * W + pos % W].astype(np.int64)
    return rows, cols


def tiled_to_csr(tiles, shape, window):
    """Rebuild the canonical CSR ``(data, indices, indptr)`` from the tiled arrays (any device)."""
    xp = array_module(tiles["perm"])
    rows, cols = tiled_rows_cols(
        tiles["win_ptr"], tiles["block_cols"], tiles["block_ptr"], tiles["tile_pos"], window
    )
    perm = tiles["perm"]
    nnz = perm.shape[0]
    data = xp.empty(nnz, dtype=tiles["values"].dtype)
    indices = xp.empty(nnz, dtype=np.int32)
    data[perm] = tiles["values"]
    indices[perm] = cols
    counts = xp.bincount(rows, minlength=shape[0]) if nnz else xp.zeros(shape[0], np.int64)
    indptr = xp.concatenate((xp.zeros(1, np.int64), xp.cumsum(counts))).astype(np.int32)
    return data, indices, indptr


def spmm(tiles, shape, window, X, out_dtype):
    """Reference ``A @ X`` over the tiled format, X of shape ``(n_cols, D)``."""
    import scipy.sparse as sp

    rows, cols = tiled_rows_cols(
        tiles["win_ptr"], tiles["block_cols"], tiles["block_ptr"], tiles["tile_pos"], window
    )
    A = sp.csr_array((tiles["values"].astype(out_dtype), (rows, cols)), shape=shape)
    return np.asarray(A @ X.astype(out_dtype, copy=False), dtype=out_dtype)


def sddmm(tiles, shape, window, Xa, Xb, out_dtype, multiply_values):
    """Reference ``e = <Xa[i], Xb[j]>`` for every stored (i, j), in tiled order."""
    rows, cols = tiled_rows_cols(
        tiles["win_ptr"], tiles["block_cols"], tiles["block_ptr"], tiles["tile_pos"], window
    )
    e = np.einsum(
        "ij,ij->i", Xa[rows].astype(out_dtype, copy=False), Xb[cols].astype(out_dtype, copy=False)
    )
    if multiply_values:
        e = e * tiles["values"].astype(out_dtype, copy=False)
    return e.astype(out_dtype, copy=False)
