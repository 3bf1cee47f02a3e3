"""Layer 1: Numba CUDA kernels of Sparse Graph Translation (SGT).

The translation is three passes over the edges and one over the blocks, each
fully parallel (no per-window loop, so hub windows do not serialise):

1. :func:`rank_edges` -- a group of ``H`` lanes per edge; lane ``t`` binary-
   searches row ``t`` of the edge's window for the edge's column.  The sum of
   the counts (``shfl_xor`` tree) is the edge's rank in the window's
   (column, row)-sorted order -- a 16-way merge by search -- and a ``ballot``
   tells whether an earlier row of the window holds the same column, i.e.
   whether this edge is its column's first occurrence.
2. (CuPy) an inclusive scan of the first-occurrence flags, in merged order,
   numbers each window's distinct columns.
3. :func:`condense_edges` -- per edge: its condensed column id; first
   occurrences write ``block_cols``.
4. :func:`count_block_rows` -- a group of ``H`` lanes per block; lane ``t``
   counts row ``t``'s entries in the block (two binary searches), and a
   ``shfl_up`` scan gives each row's offset inside the block.
5. :func:`scatter_edges` -- per edge: its slot in the tiled arrays.

Kernels take ``window`` (``H``) and ``block`` (``W``) as arguments: powers of
two, ``H <= 32``, so a lane group never straddles a warp.  Every lane of a
warp reaches every collective (out-of-range lanes carry neutral values), which
is what ``FULL_MASK`` promises.
"""

import numpy as np
from numba import cuda

from .warp import FULL_MASK, lower_bound

__all__ = [
    "rank_edges",
    "condense_edges",
    "count_block_rows",
    "scatter_edges",
    "sum_runs",
    "KERNELS",
]




@cuda.jit(cache=True)
def rank_edges(indptr, indices, edge_row, n_rows, window, rank, first_flag):
    """Rank of each edge in its window's merged order, and first-occurrence flags.

    ``rank[e]``: number of window entries before edge ``e`` in (column, row)
    order.  ``first_flag[indptr[w*H] + rank[e]]``: 1 when no earlier row of
    the window holds ``e``'s column.
    """
    tid = cuda.grid(1)
    e = tid // window
    lane = tid % window
    nnz = indices.shape[0]
    valid = e < nnz
    cnt = 0
    found_before = False
    r = 0
    win_first_edge = 0
    if valid:
        r = edge_row[e]
        c = indices[e]
        w0 = (r // window) * window
        rr = w0 + lane
        win_first_edge = indptr[w0]
        if rr < n_rows:
            rs = indptr[rr]
            lb = lower_bound(indices, rs, indptr[rr + 1], c)
            cnt = lb - rs
            if rr < r and lb < indptr[rr + 1] and indices[lb] == c:
                cnt += 1  # ties go to the earlier row
                found_before = True
    # Sum of the group's counts: xor butterfly inside the aligned lane group.
    off = window >> 1
    while off > 0:
        cnt += cuda.shfl_xor_sync(FULL_MASK, cnt, off)
        off >>= 1
    votes = cuda.ballot_sync(FULL_MASK, found_before)
    if valid and lane == 0:
        # ballot gives int32: widen before shifting so bit 31 is not a sign.
        group_bits = ((np.int64(votes) & FULL_MASK) >> (cuda.laneid - lane)) & ((1 << window) - 1)
        rank[e] = cnt
        first_flag[win_first_edge + cnt] = 1 if group_bits == 0 else 0


@cuda.jit(cache=True)
def condense_edges(
    indptr, indices, edge_row, window, block, win_ptr, scan, first_flag, kidx, block_cols, block_win
):
    """Condensed column id of each edge; first occurrences fill ``block_cols``.

    ``scan`` is the inclusive scan of ``first_flag`` with a leading 0, so that
    ``scan[p + 1] - scan[window start]`` counts distinct columns up to merged
    position ``p``.  On entry ``kidx`` holds the ranks; on exit the condensed ids.
    """
    e = cuda.grid(1)
    if e >= indices.shape[0]:
        return
    w = edge_row[e] // window
    ws = indptr[w * window]
    p = ws + kidx[e]
    k = scan[p + 1] - scan[ws] - 1
    kidx[e] = k
    if first_flag[p] != 0:
        b = win_ptr[w] + k // block
        block_cols[b * block + k % block] = indices[e]
        if k % block == 0:
            block_win[b] = w


@cuda.jit(cache=True)
def count_block_rows(indptr, indices, n_rows, window, block, block_cols, block_win, row_off, block_nnz):
    """Per block: each row's entry offset inside the block, and the block's entry count."""
    tid = cuda.grid(1)
    b = tid // window
    lane = tid % window
    valid = b < block_win.shape[0]
    cnt = 0
    if valid:
        rr = block_win[b] * window + lane
        if rr < n_rows:
            lo = block_cols[b * block]
            hi = lo
            for s in range(block):
                v = block_cols[b * block + s]
                if v >= 0:
                    hi = v
            rs = indptr[rr]
            re = indptr[rr + 1]
            a = lower_bound(indices, rs, re, lo)
            cnt = lower_bound(indices, a, re, hi + 1) - a
    # Inclusive scan over the group with shfl_up (Hillis-Steele).
    incl = cnt
    off = 1
    while off < window:
        v = cuda.shfl_up_sync(FULL_MASK, incl, off)
        if lane >= off:
            incl += v
        off <<= 1
    if valid:
        row_off[b * window + lane] = incl - cnt
        if lane == window - 1:
            block_nnz[b] = incl


@cuda.jit(cache=True)
def scatter_edges(
    indptr, edge_row, data, window, block, win_ptr, kidx, block_ptr, row_off, tile_pos, values, perm
):
    """Write each edge to its tiled slot: blocks in order, row-major inside a block."""
    e = cuda.grid(1)
    if e >= edge_row.shape[0]:
        return
    r = edge_row[e]
    w = r // window
    lr = r - w * window
    k = kidx[e]
    kb = k // block
    b = win_ptr[w] + kb
    # Entries of this row in this block are consecutive in CSR: count the
    # earlier ones (at most block - 1 steps back).
    before = 0
    j = e - 1
    rs = indptr[r]
    while j >= rs and kidx[j] // block == kb:
        before += 1
        j -= 1
    out = block_ptr[b] + row_off[b * window + lr] + before
    tile_pos[out] = lr * block + k % block
    values[out] = data[e]
    perm[out] = e


@cuda.jit(cache=True)
def sum_runs(starts, data, out):
    """Sum ``data`` over each run ``starts[i]:starts[i+1]``, left to right."""
    i = cuda.grid(1)
    n_runs = out.shape[0]
    if i >= n_runs:
        return
    a = starts[i]
    z = data.shape[0] if i + 1 == n_runs else starts[i + 1]
    acc = data[a]
    for j in range(a + 1, z):
        acc += data[j]
    out[i] = acc


#: Every kernel with example argument types, for ``compile_ptx`` checks in CI.
KERNELS = {
    "rank_edges": (rank_edges, "(int32[::1], int32[::1], int32[::1], int64, int64, int32[::1], int32[::1])"),
    "condense_edges": (
        condense_edges,
        "(int32[::1], int32[::1], int32[::1], int64, int64, int32[::1], int32[::1], int32[::1],"
        " int32[::1], int32[::1], int32[::1])",
    ),
    "count_block_rows": (
        count_block_rows,
        "(int32[::1], int32[::1], int64, int64, int64, int32[::1], int32[::1], int32[::1], int32[::1])",
    ),
    "scatter_edges": (
        scatter_edges,
        "(int32[::1], int32[::1], float32[::1], int64, int64, int32[::1], int32[::1], int32[::1],"
        " int32[::1], uint8[::1], float32[::1], int32[::1])",
    ),
    "sum_runs": (sum_runs, "(int32[::1], float32[::1], float32[::1])"),
}
