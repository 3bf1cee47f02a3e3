"""Layer 2: Sparse Graph Translation, on the GPU or through the reference.

:func:`translate` takes validated CSR arrays (NumPy or CuPy) and returns the
tiled arrays documented in :mod:`tcgnn_py._reference`, on the same device as
its input.  The GPU path runs the Numba kernels of :mod:`tcgnn_py.kernels.sgt`
and CuPy scans; it produces arrays identical to the reference.
"""

import numpy as np

from . import _reference as ref
from ._device import array_module
from ._validation import INDEX_MAX
from .kernels.launch import THREADS_PER_BLOCK as _TPB
from .kernels.launch import grid as _grid

__all__ = ["tile", "translate", "translate_kernels", "canonicalize_kernels", "coo_to_csr", "coo_to_csr_order"]

def tile(data, indices, indptr, shape, window=16, block=8):
    """Canonicalize, then translate: the whole SGT of validated CSR arrays, on their device."""
    if isinstance(indices, np.ndarray):
        csr = ref.canonicalize_csr(data, indices, indptr, shape)
        return ref.translate(*csr, shape, window, block)
    import cupy

    *csr, rows = _canonical_with_rows(cupy, data, indices, indptr, shape)
    return translate_kernels(cupy, *csr, shape, window, block, edge_row=rows)


def canonicalize_kernels(xp, data, indices, indptr, shape):
    """Sorted indices, duplicates summed in input order, through the Numba kernels; ``xp`` is CuPy, or NumPy in the simulator."""
    return _canonical_with_rows(xp, data, indices, indptr, shape)[:3]


def _canonical_with_rows(xp, data, indices, indptr, shape):
    """Canonical ``(data, indices, indptr)`` and the row of each entry, computed once."""
    from .kernels import sgt as k

    cp = xp
    n_rows, n_cols = shape
    nnz = indices.shape[0]
    rows = ref.edge_rows(indptr, nnz)
    if nnz < 2:
        return data, indices, indptr, rows
    unsorted = (rows[1:] == rows[:-1]) & (indices[1:] <= indices[:-1])
    if not bool(unsorted.any()):  # synchronize!
        return data, indices, indptr, rows
    key = rows.astype(np.int64) * n_cols + indices
    order = cp.argsort(key, kind="stable")
    key = key[order]
    is_start = cp.empty(nnz, dtype=np.bool_)
    is_start[0] = True
    cp.not_equal(key[1:], key[:-1], out=is_start[1:])
    starts = cp.flatnonzero(is_start).astype(np.int32)
    new_data = cp.empty(starts.shape[0], dtype=data.dtype)
    k.sum_runs[_grid(starts.shape[0]), _TPB](starts, data[order], new_data)
    ukey = key[starts]
    new_rows = (ukey // n_cols).astype(np.int32)
    new_indices = (ukey % n_cols).astype(np.int32)
    new_indptr = cp.searchsorted(new_rows, cp.arange(n_rows + 1), side="left").astype(np.int32)
    return new_data, new_indices, new_indptr, new_rows


def translate(data, indices, indptr, shape, window=16, block=8):
    """Tiled arrays of a canonical CSR matrix (see :mod:`tcgnn_py._reference`)."""
    if isinstance(indices, np.ndarray):
        return ref.translate(data, indices, indptr, shape, window, block)
    import cupy

    return translate_kernels(cupy, data, indices, indptr, shape, window, block)


def translate_kernels(xp, data, indices, indptr, shape, H=16, W=8, edge_row=None):
    """:func:`translate` through the Numba kernels; ``xp`` is CuPy, or NumPy in the simulator.

    ``edge_row`` (the row of each entry) is derived from ``indptr`` unless given.
    """
    from .kernels import sgt as k

    cp = xp
    n_rows, _ = shape
    nnz = indices.shape[0]
    n_windows = -(-n_rows // H)
    if nnz == 0:
        return {
            "win_ptr": cp.zeros(n_windows + 1, np.int32),
            "block_cols": cp.zeros((0, W), np.int32),
            "block_ptr": cp.zeros(1, np.int32),
            "tile_pos": cp.zeros(0, ref.tile_pos_dtype(H, W)),
            "values": cp.zeros(0, data.dtype),
            "perm": cp.zeros(0, np.int32),
        }
    if nnz * H > INDEX_MAX:
        # rank_edges runs H threads per entry with int32 thread ids.
        raise ValueError(
            f"{nnz} stored entries x window {H} exceed the {INDEX_MAX} threads one translation launches"
        )

    if edge_row is None:
        edge_row = ref.edge_rows(indptr, nnz)
    kidx = cp.empty(nnz, np.int32)
    first_flag = cp.empty(nnz, np.int32)  # every merged position is written once
    k.rank_edges[_grid(nnz * H), _TPB](indptr, indices, edge_row, n_rows, H, kidx, first_flag)

    scan = cp.empty(nnz + 1, np.int32)
    scan[0] = 0
    cp.cumsum(first_flag, dtype=np.int32, out=scan[1:])
    bounds = indptr[cp.minimum(cp.arange(n_windows + 1, dtype=np.int64) * H, n_rows)]
    distinct = scan[bounds[1:]] - scan[bounds[:-1]]
    win_ptr = cp.empty(n_windows + 1, np.int32)
    win_ptr[0] = 0
    cp.cumsum((distinct + (W - 1)) // W, dtype=np.int32, out=win_ptr[1:])
    n_blocks = int(win_ptr[-1])  # synchronize!
    if n_blocks * max(H, W) > INDEX_MAX:
        raise ValueError(f"{n_blocks} tensor-core blocks do not fit the int32 tiled format")

    block_cols = cp.full(n_blocks * W, -1, np.int32)
    block_win = cp.empty(n_blocks, np.int32)
    k.condense_edges[_grid(nnz), _TPB](
        indptr, indices, edge_row, H, W, win_ptr, scan, first_flag, kidx, block_cols, block_win
    )
    row_off = cp.empty(n_blocks * H, np.int32)
    block_ptr = cp.empty(n_blocks + 1, np.int32)
    block_ptr[0] = 0
    block_nnz = cp.empty(n_blocks, np.int32)
    k.count_block_rows[_grid(n_blocks * H), _TPB](
        indptr, indices, n_rows, H, W, block_cols, block_win, row_off, block_nnz
    )
    cp.cumsum(block_nnz, dtype=np.int32, out=block_ptr[1:])

    tile_pos = cp.empty(nnz, ref.tile_pos_dtype(H, W))
    values = cp.empty(nnz, data.dtype)
    perm = cp.empty(nnz, np.int32)
    k.scatter_edges[_grid(nnz), _TPB](
        indptr, edge_row, data, H, W, win_ptr, kidx, block_ptr, row_off, tile_pos, values, perm
    )
    return {
        "win_ptr": win_ptr,
        "block_cols": block_cols.reshape(n_blocks, W),
        "block_ptr": block_ptr,
        "tile_pos": tile_pos,
        "values": values,
        "perm": perm,
    }


def coo_to_csr(data, rows, cols, shape):
    """Canonical CSR of COO entries with distinct (row, col) pairs, on their device."""
    order, indices, indptr = coo_to_csr_order(rows, cols, shape)
    return data[order], indices, indptr


def coo_to_csr_order(rows, cols, shape):
    """``(order, indices, indptr)``: CSR of distinct COO pairs, ``data[order]`` its values."""
    xp = array_module(rows)
    n_rows, n_cols = shape
    order = xp.argsort(rows.astype(np.int64) * n_cols + cols, kind="stable")
    rows_s = rows[order]
    indptr = xp.searchsorted(rows_s, xp.arange(n_rows + 1), side="left").astype(np.int32)
    return order, cols[order].astype(np.int32), indptr
