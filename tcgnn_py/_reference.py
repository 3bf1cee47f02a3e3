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
    "attention",
    "seed_stream",
    "hash_keeps",
    "canonicalize_csr",
    "sum_runs",
    "translate",
    "tiled_to_csr",
    "tiled_rows_cols",
    "entry_blocks",
    "block_meta",
    "window_stats",
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
    if nnz < 2:
        return data, indices, indptr
    # A column not above the one before it, within a row: the pairs that straddle two rows do not count (what a
    # row index per entry would tell, without making one for a matrix that is canonical already)
    out_of_order = indices[1:] <= indices[:-1]
    starts = np.asarray(indptr[1:-1])
    out_of_order[starts[(starts > 0) & (starts < nnz)] - 1] = False
    if not out_of_order.any():
        return data, indices, indptr
    rows = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(indptr))
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
    nnz = indices.shape[0]
    # Rows, windows, entry counts and positions in int32 where they fit, the (window, column) keys in int64: a host
    # translation's time goes into passes over arrays of nnz entries, so narrower ones cost less.
    small = np.int32 if max(n_rows, nnz) < 2**31 - 1 else np.int64
    rows = np.repeat(np.arange(n_rows, dtype=small), np.diff(indptr))
    win = rows // H
    # Distinct (window, column) pairs in ascending order give the condensed ids.
    key = win.astype(np.int64) * max(n_cols, 1) + indices
    # np.unique(key, return_inverse=True), by a stable sort: each row's keys are sorted runs, which it merges
    # instead of sorting from scratch
    by_key = np.argsort(key, kind="stable")
    sorted_key = key[by_key]
    del key
    new = np.empty(nnz, np.bool_)
    new[:1] = True
    np.not_equal(sorted_key[1:], sorted_key[:-1], out=new[1:])
    inverse = np.empty(nnz, small)
    inverse[by_key] = np.cumsum(new, dtype=small) - 1
    del by_key
    uniq = sorted_key[new]
    del sorted_key, new
    uniq_win = uniq // max(n_cols, 1)
    distinct = np.bincount(uniq_win, minlength=n_windows)
    first_of_win = np.concatenate(([0], np.cumsum(distinct))).astype(small)
    k = inverse - first_of_win[win]  # condensed index within the window
    del inverse
    blocks_per_win = -(-distinct // W)
    win_ptr = np.concatenate(([0], np.cumsum(blocks_per_win))).astype(np.int32)
    n_blocks = int(win_ptr[-1])
    b = win_ptr[win].astype(small) + k // W
    slot = k % W
    pos = (rows - win * H) * W + slot
    del rows, win, k
    flat = np.int32 if n_blocks * H * W < 2**31 else np.int64  # (a block's slots and tile positions, flattened)

    block_cols = np.full(n_blocks * W, -1, dtype=np.int32)
    bf = b.astype(flat)
    block_cols[bf * W + slot] = indices
    order = np.argsort(bf * (H * W) + pos, kind="stable")  # by block, then position (distinct keys)
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


def block_meta(block_ptr, tile_pos, words, columns):
    """``(n_blocks, columns)`` uint32: each block's occupancy words -- bit ``p % 32`` of word ``p // 32`` set when
    tile position ``p`` is stored -- then, where ``columns > words``, its first entry (any device).

    Positions within a block are distinct, so summing ``1 << bit`` per word is an OR; float64 holds those sums
    (< 2**32) exactly.
    """
    xp = array_module(block_ptr)
    n = block_ptr.shape[0] - 1
    pos = tile_pos.astype(np.int64)
    if xp is np:  # (each block's entries by repeat on the host, by search where repeat takes no device counts)
        blocks = np.repeat(np.arange(n, dtype=np.int64), np.diff(block_ptr))
    else:
        blocks = entry_blocks(block_ptr, pos.shape[0]).astype(np.int64)
    words_of = xp.bincount(blocks * words + (pos >> 5), weights=(1 << (pos & 31)).astype(np.float64),
                           minlength=n * words)
    meta = xp.zeros((n, columns), np.uint32)
    meta[:, :words] = words_of.astype(np.uint32).reshape(n, words)
    if columns > words:
        meta[:, words] = block_ptr[:-1]
    return meta


def window_stats(win_ptr, sizes, max_units):
    """What a translation counts of its windows for planning products, from their pointers (int64; the GPU
    translation's ``status[2:]``): the longest window's blocks, the empty windows, then per unit size of ``sizes``
    the units of ``ceil(nb / size)`` per window of ``nb`` blocks, those at least 1 and at most ``max_units`` per
    window, and the windows of more than ``size`` blocks."""
    nb = np.diff(np.asarray(win_ptr, np.int64))
    parts = [-(-nb // s) for s in sizes]
    return np.array([nb.max(initial=0), np.count_nonzero(nb == 0)] + [k.sum() for k in parts]
                    + [np.clip(k, 1, max_units).sum() for k in parts] + [np.count_nonzero(nb > s) for s in sizes],
                    np.int64)


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


def attention_scores(rows, cols, heads, kind, s_src=None, s_dst=None, Q=None, K=None, beta=None, slope=0.2):
    """``(z, pre)``: each entry's score per head, ``(nnz, heads)``, and (additive) the score before the LeakyReLU.

    ``"additive"`` (GAT): ``LeakyReLU(s_dst[i, h] + s_src[j, h])``; ``"cosine"`` (AGNN, one head):
    ``beta * <Q[i], K[j]>``.  Any device.
    """
    xp = array_module(rows)
    if kind == "additive":
        pre = s_dst[rows] + s_src[cols]
        return xp.where(pre > 0, pre, pre * slope), pre
    c = (Q[rows] * K[cols]).sum(axis=1)
    return (beta.reshape(()) * c)[:, None], c[:, None]


def seed_stream(key, count, words):
    """The seeds of a device seed stream (the ``tcgnn_draw`` kernel): for each draw ``c = 1 .. count``, the
    ``words`` (1 or 2) 32-bit halves, low first, of splitmix64 of ``key + c * 0x9E3779B97F4A7C15`` (uint64
    arithmetic) -- an array ``(count, words)`` of uint32."""
    M = (1 << 64) - 1
    out = np.empty((count, words), np.uint32)
    for c in range(1, count + 1):
        z = (int(key) + c * 0x9E3779B97F4A7C15) & M
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        z ^= z >> 31
        out[c - 1] = [z & 0xFFFFFFFF, z >> 32][:words]
    return out


def attention_keep(entries, heads, seed, p):
    """``(len(entries), heads)`` float32 factors of attention dropout: ``1 / (1 - p)`` where entry e (CSR order)
    of head h is kept, else 0; a hash of ``(e * heads + h, seed)`` (``seed`` a one-element uint32 array), the
    same bits as :mod:`tcgnn_py.kernels.attention`'s.  Any device."""
    xp = array_module(entries)
    x = entries.astype(np.uint32)[:, None] * np.uint32(heads) + xp.arange(heads, dtype=np.uint32)[None, :]
    keep = hash_keeps(x ^ (seed.astype(np.uint32).reshape(()) * np.uint32(0x9E3779B9)), p)
    return keep.astype(np.float32) * np.float32(1 / np.float32(1 - np.float32(p)))


def hash_keeps(x, p):
    """Whether each element is kept by the kernels' dropout at rate ``p``, ``x`` its index already mixed with the
    seed (uint32): the 24 high bits of the hash's finalizer against ``p * 2**24``, as every dropout kernel (feature
    and attention) computes it.  Operators only, so NumPy, CuPy and ``jax.numpy`` arrays all take it."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> np.uint32(13))
    x = x * np.uint32(0xC2B2AE35)
    x = x ^ (x >> np.uint32(16))
    return (x >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24) >= np.float32(p)


def attention(indptr, indices, weights, V, heads, kind, *, s_src=None, s_dst=None, Q=None, K=None, beta=None,
              slope=0.2, dtype=np.float32, dropout=0.0, seed=None):
    """``(out, lse)`` of graph attention over a CSR graph, unfused: scores, softmax and aggregation in turn.

    ``out[i, h] = sum_j P_ij,h V[j, h]``, ``P_ij,h = w_ij exp(z_ij,h) / sum_k w_ik exp(z_ik,h)`` over row i's
    entries (``weights`` non-negative, or None for all 1), ``lse[i, h] = log sum_j w_ij exp(z_ij,h)``: the
    oracle of :mod:`tcgnn_py.kernels.attention` and its no-GPU path, computed in ``dtype``.  ``V`` is
    ``(n_cols, heads * D)``; scores as :func:`attention_scores`.  Rows whose weights are all 0 (or empty)
    give 0 and ``-inf``; a NaN score makes its row's head NaN.  ``dropout`` > 0 drops attention entries after
    the softmax (:func:`attention_keep` with ``seed``).  Any device.
    """
    xp = array_module(V)
    n, nnz = indptr.shape[0] - 1, indices.shape[0]
    rows, cols = edge_rows(indptr, nnz), indices
    f = lambda a: None if a is None else a.astype(dtype)  # noqa: E731
    z, _ = attention_scores(rows, cols, heads, kind, f(s_src), f(s_dst), f(Q), f(K), f(beta), float(slope))
    w = xp.ones(nnz, dtype) if weights is None else weights.astype(dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = xp.where((w != 0)[:, None], z + xp.log(w)[:, None], -np.inf)
        m = xp.full((n, heads), -np.inf, dtype)
        xp.maximum.at(m, rows, z)  # NaN propagates: its row's head becomes NaN
        ex = xp.where(z == -np.inf, 0, xp.exp(z - m[rows]))
        l = xp.zeros((n, heads), dtype)
        xp.add.at(l, rows, ex)
        D = V.shape[1] // heads
        acc = xp.zeros((n, heads, D), dtype)
        exd = ex if not dropout else ex * attention_keep(xp.arange(nnz), heads, seed, dropout).astype(dtype)
        xp.add.at(acc, rows, exd[:, :, None] * V.astype(dtype).reshape(-1, heads, D)[cols])
        out = xp.where((l != 0)[:, :, None], acc / l[:, :, None], 0).reshape(n, heads * D)
        lse = xp.where(l != 0, m + xp.log(l), -np.inf)
    return out.astype(dtype), lse.astype(dtype)
