"""Layer 1: Numba CUDA kernels of Sparse Graph Translation (SGT).

The translation is one check pass, three passes over the edges and one over
the blocks, each fully parallel (no per-window loop, so hub windows do not
serialise), with one host read at the end:

0. :func:`check_csr` -- per entry: its row (binary search of ``indptr``), and
   checks of the CSR arrays (``indptr`` from 0 to nnz and non-decreasing, columns in
   range, sorted and distinct inside a row).  A failed check sets a bit of
   ``status``; every later kernel returns at once when ``status[0] != 0``, so
   invalid arrays are never indexed, and the host raises after its one read.
1. :func:`rank_edges` -- a group of ``H`` lanes per edge; lane ``t`` binary-
   searches row ``t`` of the edge's window for the edge's column.  The sum of
   the counts (``shfl_xor`` tree) is the edge's rank in the window's
   (column, row)-sorted order -- a 16-way merge by search -- and a ``ballot``
   tells whether an earlier row of the window holds the same column, i.e.
   whether this edge is its column's first occurrence.
2. :func:`scan_tiles` (tiles of 4096 entries, ``shfl_up`` inside warps; one
   launch for a single tile, CuPy's scan over :data:`SCAN_SMALL_MAX`) scans
   the first-occurrence flags, in merged order,
   which numbers each window's distinct columns; :func:`window_blocks` turns
   them into blocks per window, and a second scan into ``win_ptr``.  It also
   counts what planning a product reads of the windows (:data:`N_STATS`
   integers in ``status``: the longest, the units of each size), which the
   host reads with ``status``.
3. :func:`condense_edges` -- per edge: its condensed column id; first
   occurrences write ``block_cols`` (and pad the window's last block with -1).
4. :func:`count_block_rows` -- a group of ``H`` lanes per block; lane ``t``
   counts row ``t``'s entries in the block (two binary searches), and a
   ``shfl_up`` scan gives each row's offset inside the block.
5. A third scan gives ``block_ptr``; :func:`scatter_edges` -- per edge: its
   slot in the tiled arrays.
6. For a small tiling, :func:`block_meta` -- per block: its occupancy mask and
   first entry, which planning its products would otherwise read back.
7. For a small matrix (the ``sgt_one_launch_max`` option), :func:`translate_small`
   runs steps 0-6 as phases of one CTA, a barrier between them: the same
   work on the same arrays in one launch, where the host's launches would
   cost more than the GPU's work.

Beside the translation, with its scans: :func:`plan_units` writes a small new tiling's product plan (its
windows cut into units) by one CTA where the tiling is, and :func:`plan_longest_first` writes it with its units
sorted by length, longest first, in the same launch; :func:`csr_of_order` gathers the CSR of COO pairs after their
sort in one launch; :func:`transpose_count`, :func:`transpose_place` and :func:`transpose_rank` make a CSR's
transpose without a sort (a sampled block's, made every step).

The number of blocks is known only on the device: buffers are sized by the
bound ``nnz // W + windows`` (a window of ``m`` entries has at most
``ceil(m / W)`` blocks), and kernels over blocks read the count from
``win_ptr``.  The host reads ``status`` (errors, number of blocks) once.

Kernels take ``window`` (``H``) and ``block`` (``W``) as arguments: powers of
two, ``H <= 32``, so a lane group never straddles a warp.  Every lane of a
warp reaches every collective (out-of-range lanes carry neutral values), which
is what ``FULL_MASK`` promises.
"""

import numpy as np
from numba import config, cuda

from .warp import FULL_MASK, inclusive_scan, lower_bound

__all__ = [
    "check_csr",
    "rank_edges",
    "window_blocks",
    "condense_edges",
    "count_block_rows",
    "scatter_edges",
    "block_meta",
    "sum_runs",
    "scan_tile_totals",
    "scan_tiles",
    "translate_small",
    "plan_units",
    "plan_longest_first",
    "plan_work",
    "PLAN_WORK",
    "STAT_SIZES",
    "STAT_MAX_UNITS",
    "N_STATS",
    "csr_of_order",
    "transpose_count",
    "transpose_place",
    "transpose_rank",
    "SMALL_THREADS",
    "cta_threads",
    "KERNELS",
]




#: ``status[0]`` bits set by :func:`check_csr`.  ``BAD_SIZES``: ``indptr[0] != 0`` or ``indptr[-1] != nnz``, which
#: the host reads and words as scipy does (or, for a last entry below ``nnz``, translates the entries before it).
BAD_INDPTR, NEGATIVE_INDEX, INDEX_TOO_LARGE, NOT_CANONICAL, BAD_SIZES = 1, 2, 4, 8, 16


@cuda.jit(device=True)
def _check_at(t, indptr, indices, n_cols, edge_row, status):
    """:func:`check_csr`'s work for thread ``t``."""
    n_rows = indptr.shape[0] - 1
    nnz = indices.shape[0]
    if t == 0 and (indptr[0] != 0 or indptr[n_rows] != nnz):
        cuda.atomic.or_(status, 0, BAD_SIZES)
    if t < n_rows and indptr[t + 1] < indptr[t]:
        cuda.atomic.or_(status, 0, BAD_INDPTR)
    if t >= nnz:
        return
    lo = 0
    hi = n_rows - 1
    while lo < hi:  # last row whose start is <= t
        mid = (lo + hi + 1) >> 1
        if indptr[mid] <= t:
            lo = mid
        else:
            hi = mid - 1
    edge_row[t] = lo
    c = indices[t]
    if c < 0:
        cuda.atomic.or_(status, 0, NEGATIVE_INDEX)
    elif c >= n_cols:
        cuda.atomic.or_(status, 0, INDEX_TOO_LARGE)
    if t + 1 < nnz and t + 1 < indptr[lo + 1] and indices[t + 1] <= c:
        cuda.atomic.or_(status, 0, NOT_CANONICAL)


@cuda.jit(cache=True)
def check_csr(indptr, indices, n_cols, edge_row, status):
    """Row of every entry, and the O(nnz) checks of the CSR arrays (bits of ``status[0]``).

    One thread per entry and per row.  The binary search stays inside
    ``indptr`` whatever its contents, so checking reads nothing out of bounds;
    thread 0 checks ``indptr[0] == 0`` and ``indptr[-1] == nnz`` (``BAD_SIZES``).
    """
    _check_at(cuda.grid(1), indptr, indices, n_cols, edge_row, status)


@cuda.jit(device=True)
def _rank_at(tid, indptr, indices, edge_row, n_rows, window, rank, first_flag):
    """:func:`rank_edges`' work for thread ``tid`` (every lane of the warp calls it: collectives)."""
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
def rank_edges(indptr, indices, edge_row, n_rows, window, rank, first_flag, status):
    """Rank of each edge in its window's merged order, and first-occurrence flags.

    ``rank[e]``: number of window entries before edge ``e`` in (column, row)
    order.  ``first_flag[indptr[w*H] + rank[e]]``: 1 when no earlier row of
    the window holds ``e``'s column.
    """
    if status[0] != 0:
        return
    _rank_at(cuda.grid(1), indptr, indices, edge_row, n_rows, window, rank, first_flag)


@cuda.jit(device=True)
def _window_blocks_at(w, indptr, scan, n_rows, window, block, nblk):
    """:func:`window_blocks`' work for window ``w``."""
    if w >= nblk.shape[0]:
        return
    lo = indptr[w * window]
    hi = indptr[min((w + 1) * window, n_rows)]
    nblk[w] = (scan[hi] - scan[lo] + block - 1) // block


@cuda.jit(cache=True)
def window_blocks(indptr, scan, n_rows, window, block, nblk, status):
    """Blocks of each window: its distinct columns over ``block``, rounded up; and the windows' statistics in
    ``status[2:]`` (:func:`_window_stats`), summed in the CTA first: atomics of every warp on the same few counts
    queue at L2 and made the kernel several times longer."""
    if status[0] != 0:
        return
    cta = cuda.shared.array(N_STATS, dtype=np.int32)  # (the CTA's counts: one global atomic each per CTA)
    t = cuda.threadIdx.x
    if t < N_STATS:
        cta[t] = 0
    cuda.syncthreads()
    w = cuda.grid(1)
    _window_blocks_at(w, indptr, scan, n_rows, window, block, nblk)
    _window_stats(nblk[w] if w < nblk.shape[0] else -1, cta, 0)
    cuda.syncthreads()
    if t == 0 and cta[0] > 0:
        cuda.atomic.max(status, 2, cta[0])
    elif 0 < t < N_STATS and cta[t] > 0:
        cuda.atomic.add(status, 2 + t, cta[t])


#: What a translation counts of its windows for planning products (``status[2:]``, :func:`_window_stats`), for
#: each unit size ``16 << i`` (``i <`` :data:`STAT_SIZES`) and windows of ``nb`` blocks cut into ``k = ceil(nb /
#: size)`` units: the longest window's blocks, the empty windows, then per size the units beyond one per non-empty
#: window (``k - 1``), the units beyond :data:`STAT_MAX_UNITS` per window, and the windows of more than ``size``
#: blocks.  Counted beyond what a short window takes, so that the windows of at most 16 blocks (most) add nothing
#: but the longest and the empty count: the host adds the rest from the number of windows
#: (:class:`tcgnn_py.tiles.WindowStats`).  A new matrix's first product reads them in the translation's one host read,
#: instead of passes over its windows.
STAT_SIZES = 5
STAT_MAX_UNITS = 1024
N_STATS = 2 + 3 * STAT_SIZES


@cuda.jit(device=True)
def _window_stats(nb, stats, at):
    """Add a window of ``nb`` blocks (-1 where the lane has none) to the :data:`N_STATS` statistics from
    ``stats[at]`` (the translation's ``status[2:]``, or a CTA's shared counts).  Every lane of the warp calls it.
    The warp takes the longest by shuffles and counts the empty and the cut windows by votes, which its lane 0 adds;
    a lane whose window is cut adds its own units, with shifts: sums over the warp for every size made the kernel
    instruction-bound."""
    nb = np.int32(nb)
    top = nb
    lanes = 16
    while lanes > 0:
        top = max(top, np.int32(cuda.shfl_xor_sync(FULL_MASK, top, lanes)))
        lanes >>= 1
    empty = np.int32(cuda.popc(cuda.ballot_sync(FULL_MASK, nb == 0)))
    first = cuda.laneid == 0
    if first and top > 0:
        cuda.atomic.max(stats, at, np.int32(top))
    if first and empty > 0:
        cuda.atomic.add(stats, at + 1, empty)
    for i in range(STAT_SIZES):
        shift = np.int32(4 + i)
        size = np.int32(1) << shift
        if top <= size:  # (the warp's windows are cut no further: a warp-uniform end)
            break
        cut = np.int32(cuda.popc(cuda.ballot_sync(FULL_MASK, nb > size)))
        if first:
            cuda.atomic.add(stats, at + 2 + 2 * STAT_SIZES + i, cut)
        if nb > size:
            k = np.int32((nb + size - np.int32(1)) >> shift)
            cuda.atomic.add(stats, at + 2 + i, np.int32(k - np.int32(1)))
            if k > STAT_MAX_UNITS:
                cuda.atomic.add(stats, at + 2 + STAT_SIZES + i, np.int32(k - np.int32(STAT_MAX_UNITS)))


@cuda.jit(device=True)
def _condense_at(e, indptr, indices, edge_row, window, block, win_ptr, scan, first_flag, kidx, block_cols, block_win):
    """:func:`condense_edges`' work for edge ``e``."""
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
        n_rows = indptr.shape[0] - 1
        distinct = scan[indptr[min((w + 1) * window, n_rows)]] - scan[ws]
        if k == distinct - 1:
            for s in range(k % block + 1, block):
                block_cols[b * block + s] = -1


@cuda.jit(cache=True)
def condense_edges(
    indptr, indices, edge_row, window, block, win_ptr, scan, first_flag, kidx, block_cols, block_win, status
):
    """Condensed column id of each edge; first occurrences fill ``block_cols``.

    ``scan`` is the inclusive scan of ``first_flag`` with a leading 0, so that
    ``scan[p + 1] - scan[window start]`` counts distinct columns up to merged
    position ``p``.  On entry ``kidx`` holds the ranks; on exit the condensed ids.
    The window's last column also writes -1 into the unused slots of its block.
    """
    if status[0] != 0:
        return
    _condense_at(cuda.grid(1), indptr, indices, edge_row, window, block, win_ptr, scan, first_flag, kidx, block_cols,
                 block_win)


@cuda.jit(device=True)
def _count_rows_at(tid, indptr, indices, n_rows, window, block, win_ptr, block_cols, block_win, row_off, block_nnz):
    """:func:`count_block_rows`' work for thread ``tid`` (every lane of the warp calls it: collectives)."""
    b = tid // window
    lane = tid % window
    valid = b < win_ptr[win_ptr.shape[0] - 1]
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
    incl = inclusive_scan(cnt, lane, window)  # over the block's lane group
    if valid:
        row_off[b * window + lane] = incl - cnt
        if lane == window - 1:
            block_nnz[b] = incl
    elif b < block_nnz.shape[0] and lane == window - 1:
        block_nnz[b] = 0


@cuda.jit(cache=True)
def count_block_rows(indptr, indices, n_rows, window, block, win_ptr, block_cols, block_win, row_off, block_nnz, status):
    """Per block: each row's entry offset inside the block, and the block's entry count.

    Launched over the buffers' bound: blocks past ``win_ptr[-1]`` count 0.
    """
    if status[0] != 0:
        return
    _count_rows_at(cuda.grid(1), indptr, indices, n_rows, window, block, win_ptr, block_cols, block_win, row_off,
                   block_nnz)


@cuda.jit(device=True)
def _scatter_at(e, indptr, edge_row, data, window, block, win_ptr, kidx, block_ptr, row_off, tile_pos, values, perm,
                status):
    """:func:`scatter_edges`' work for edge ``e``."""
    if e == 0:
        status[1] = win_ptr[win_ptr.shape[0] - 1]
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
def scatter_edges(
    indptr, edge_row, data, window, block, win_ptr, kidx, block_ptr, row_off, tile_pos, values, perm, status
):
    """Write each edge to its tiled slot: blocks in order, row-major inside a block.

    Also copies the number of blocks to ``status[1]`` (for the host's one read).
    """
    if status[0] != 0:
        return
    _scatter_at(cuda.grid(1), indptr, edge_row, data, window, block, win_ptr, kidx, block_ptr, row_off, tile_pos,
                values, perm, status)


@cuda.jit(device=True)
def _meta_at(b, win_ptr, block_ptr, tile_pos, words, meta):
    """:func:`block_meta`'s work for block ``b``."""
    if b >= meta.shape[0] or b >= win_ptr[win_ptr.shape[0] - 1]:
        return
    for w in range(words):
        meta[b, w] = 0
    start = block_ptr[b]
    for e in range(start, block_ptr[b + 1]):
        p = np.uint32(tile_pos[e])
        meta[b, p >> 5] |= np.uint32(1) << (p & np.uint32(31))
    if meta.shape[1] > words:
        meta[b, words] = start


@cuda.jit(cache=True)
def block_meta(win_ptr, block_ptr, tile_pos, words, meta, status):
    """Per block ``b``: its occupancy words -- bit ``p % 32`` of ``meta[b, p // 32]`` set when tile position ``p``
    is stored, ``p // 32 < words`` -- and, where ``meta`` has a column more, its first entry ``block_ptr[b]``.

    Launched over the buffers' bound: rows past ``win_ptr[-1]`` are left alone.
    """
    if status[0] != 0:
        return
    _meta_at(cuda.grid(1), win_ptr, block_ptr, tile_pos, words, meta)


#: Entries per thread of the tiled scan (a CTA of ``t`` threads scans tiles of ``SCAN_ITEMS * t`` entries).
SCAN_ITEMS = 4
#: Threads per CTA of the tiled scan.
SCAN_THREADS = 1024
#: Arrays up to this size use the two-kernel tiled scan (each CTA sums the tile totals before its own, a
#: quadratic term in the number of tiles); larger ones CuPy's scan.
SCAN_SMALL_MAX = 1 << 20


@cuda.jit(device=True, inline=True)
def _block_exclusive(x, totals):
    """Exclusive scan of one value per thread across the CTA, and the CTA's total (``shfl_up`` in warps)."""
    lane = cuda.threadIdx.x & 31
    warp = cuda.threadIdx.x >> 5
    incl = inclusive_scan(x, lane, 32)
    if lane == 31:
        totals[warp] = incl
    cuda.syncthreads()
    if warp == 0:
        w = totals[lane] if lane < (cuda.blockDim.x >> 5) else 0
        wi = inclusive_scan(w, lane, 32)
        totals[lane] = wi - w
        if lane == 31:
            totals[32] = wi
    cuda.syncthreads()
    out = totals[warp] + incl - x
    total = totals[32]
    cuda.syncthreads()  # totals is reused by the caller
    return out, total


@cuda.jit(cache=True)
def scan_tile_totals(src, tile_totals, status):
    """Sum of each tile of ``SCAN_ITEMS * blockDim`` entries (the first pass of the tiled scan)."""
    if status[0] != 0:
        return
    totals = cuda.shared.array(33, dtype=np.int32)
    n = src.shape[0]
    base = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * SCAN_ITEMS
    s = 0
    for j in range(SCAN_ITEMS):
        if base + j < n:
            s += src[base + j]
    _, total = _block_exclusive(s, totals)
    if cuda.threadIdx.x == 0:
        tile_totals[cuda.blockIdx.x] = total


@cuda.jit(cache=True)
def scan_tiles(src, tile_totals, dst, status):
    """``dst[0] = 0``, ``dst[i + 1] = src[0] + ... + src[i]``: one tile per CTA, after the tiles before it.

    Each CTA first sums the totals of the tiles before its own (read by all
    its threads, reduced with the same CTA scan), then scans its tile: each
    thread's ``SCAN_ITEMS`` consecutive entries, offsets across the CTA with
    ``shfl_up``.  Loads are coalesced; a single tile needs no first pass.
    """
    if status[0] != 0:
        return
    totals = cuda.shared.array(33, dtype=np.int32)
    t = cuda.threadIdx.x
    before = 0
    i = t
    while i < cuda.blockIdx.x:
        before += tile_totals[i]
        i += cuda.blockDim.x
    _, before = _block_exclusive(before, totals)
    if cuda.blockIdx.x == 0 and t == 0:
        dst[0] = 0
    _scan_tile(src, dst, cuda.blockIdx.x * cuda.blockDim.x * SCAN_ITEMS, before, totals)


@cuda.jit(device=True)
def _scan_tile(src, dst, tile, before, totals):
    """The CTA's scan of the tile of ``SCAN_ITEMS * blockDim`` entries from ``tile``, after ``before``: each
    thread's consecutive entries, offsets across the CTA with ``shfl_up``; returns the tile's total."""
    n = src.shape[0]
    base = tile + cuda.threadIdx.x * SCAN_ITEMS
    s = 0
    for j in range(SCAN_ITEMS):
        if base + j < n:
            s += src[base + j]
    off, total = _block_exclusive(s, totals)
    run = before + off
    for j in range(SCAN_ITEMS):
        if base + j < n:
            run += src[base + j]
            dst[base + j + 1] = run
    return total


@cuda.jit(device=True)
def _scan_cta(src, dst, totals):
    """:func:`scan_tiles` of a whole array by one CTA: its tiles in turn, each after the ones before it."""
    n = src.shape[0]
    if cuda.threadIdx.x == 0:
        dst[0] = 0
    carry = 0
    tile = 0
    while tile < n:  # (the same trip count in every thread: the CTA scan's barriers)
        carry += _scan_tile(src, dst, tile, carry, totals)
        tile += SCAN_ITEMS * cuda.blockDim.x


#: Threads of :func:`translate_small`'s one CTA (at most 64 registers each: the SM's 64K registers hold them).
SMALL_THREADS = 1024


def cta_threads(simulated):
    """Threads of a one-CTA kernel's launch (:func:`translate_small`, :func:`plan_units`, :func:`plan_longest_first`):
    :data:`SMALL_THREADS`, or two warps in the simulator, whose threads are Python threads (each loop then still
    takes several trips)."""
    return 64 if simulated else SMALL_THREADS


@cuda.jit(cache=True, **({} if config.ENABLE_CUDASIM else {"max_registers": 64}))  # (the simulator takes no limit)
def translate_small(indptr, indices, data, n_cols, window, block, edge_row, kidx, first_flag, scan, nblk, win_ptr,
                    block_cols, block_win, row_off, block_nnz, block_ptr, tile_pos, values, perm, words, meta, status):
    """The whole translation of a small matrix by one CTA: :func:`check_csr` to :func:`block_meta` and their scans,
    in order, each a loop of the CTA's threads over the kernel's threads, with a barrier between them -- the same
    work on the same arrays, so the same bits, in one launch instead of ten (a small matrix's translation is the
    host's launches).  Buffers as the kernels', of the bound: ``block_nnz`` holds one entry per possible block.

    Every thread runs every loop the same number of times (a loop over lane groups keeps whole warps in their
    collectives), and all of them read ``status`` after the checks' barrier, so they return together.
    """
    totals = cuda.shared.array(33, dtype=np.int32)
    t0 = cuda.threadIdx.x
    nt = cuda.blockDim.x
    n_rows = indptr.shape[0] - 1
    nnz = indices.shape[0]
    bound = block_nnz.shape[0]
    for t in range(t0, max(nnz, n_rows), nt):
        _check_at(t, indptr, indices, n_cols, edge_row, status)
    cuda.syncthreads()
    if status[0] != 0:
        return
    for base in range(0, nnz * window, nt):
        _rank_at(base + t0, indptr, indices, edge_row, n_rows, window, kidx, first_flag)
    cuda.syncthreads()
    _scan_cta(first_flag, scan, totals)
    cuda.syncthreads()
    for w in range(t0, nblk.shape[0], nt):
        _window_blocks_at(w, indptr, scan, n_rows, window, block, nblk)
    cuda.syncthreads()
    _scan_cta(nblk, win_ptr, totals)
    for base in range(0, nblk.shape[0], nt):  # (whole warps: the statistics' collectives)
        w = base + t0
        _window_stats(nblk[w] if w < nblk.shape[0] else -1, status, 2)
    cuda.syncthreads()
    for e in range(t0, nnz, nt):
        _condense_at(e, indptr, indices, edge_row, window, block, win_ptr, scan, first_flag, kidx, block_cols,
                     block_win)
    cuda.syncthreads()
    for base in range(0, bound * window, nt):
        _count_rows_at(base + t0, indptr, indices, n_rows, window, block, win_ptr, block_cols, block_win, row_off,
                       block_nnz)
    cuda.syncthreads()
    _scan_cta(block_nnz, block_ptr, totals)
    cuda.syncthreads()
    for e in range(t0, nnz, nt):
        _scatter_at(e, indptr, edge_row, data, window, block, win_ptr, kidx, block_ptr, row_off, tile_pos, values,
                    perm, status)
    cuda.syncthreads()
    for b in range(t0, bound, nt):
        _meta_at(b, win_ptr, block_ptr, tile_pos, words, meta)


#: Scratch int32 of :func:`plan_units` per window, and 3 more: three counts per window, and their scans of one more
#: each.
PLAN_WORK = 6


def plan_work(n_windows):
    """int32 scratch of :func:`plan_units` for ``n_windows`` windows (:func:`plan_longest_first` adds its sort's)."""
    return PLAN_WORK * n_windows + PLAN_WORK // 2


@cuda.jit(cache=True, **({} if config.ENABLE_CUDASIM else {"max_registers": 64}))  # (the simulator takes no limit)
def plan_units(win_ptr, unit_size, max_units, work, units, unit_k0, splits):
    """A product's work plan of the windows ``win_ptr`` by one CTA, where they are: window ``w`` of ``nb`` blocks
    is ``k = ceil(nb / unit_size)`` units (1 to ``max_units``), part ``j`` its blocks ``[j nb / k, (j + 1) nb /
    k)``; the windows cut in several give their units consecutive slots, and a ``splits`` row each -- the arrays of
    the host's plan (``tcgnn_py.products``' ``build_plan``), without a pass on the host or an upload (a small new
    matrix's first product).  ``work`` is :func:`plan_work` ``(n)`` int32 of scratch for ``n`` windows: each
    window's parts, cut parts and whether it is cut, and their scans -- one array, as each array a launch passes
    costs a new matrix's first product host time of its own."""
    totals = cuda.shared.array(33, dtype=np.int32)
    _plan_units_cta(win_ptr, unit_size, max_units, work, units, unit_k0, splits, totals)


@cuda.jit(cache=True, **({} if config.ENABLE_CUDASIM else {"max_registers": 64}))  # (the simulator takes no limit)
def plan_longest_first(win_ptr, unit_size, max_units, work, keys, plan, plan_k0, splits, units, unit_k0):
    """:func:`plan_units`' plan (its units in ``plan`` and ``plan_k0``, scratch here), then its units and their split
    rows longest first into ``units`` and ``unit_k0`` (:func:`_longest_first_cta`), by one CTA in one launch: a
    new matrix's first product whose grid runs in several waves plans it so, and each launch costs that call as
    much host time as the CTA runs.  ``work`` holds :func:`plan_units`' scratch, then the sort's ``keys`` counts
    and their ``keys + 1`` scan."""
    totals = cuda.shared.array(33, dtype=np.int32)
    _plan_units_cta(win_ptr, unit_size, max_units, work, plan, plan_k0, splits, totals)
    cuda.syncthreads()
    at = PLAN_WORK * (win_ptr.shape[0] - 1) + PLAN_WORK // 2  # (after plan_units' scratch: plan_work(n))
    _longest_first_cta(plan, plan_k0, work[at:at + keys], work[at + keys:at + 2 * keys + 1], units, unit_k0, totals)


@cuda.jit(device=True)
def _plan_units_cta(win_ptr, unit_size, max_units, work, units, unit_k0, splits, totals):
    """:func:`plan_units`' work by the CTA's threads (``totals``: the CTA scan's shared memory), its per-window
    arrays and scans views of ``work``."""
    t0 = cuda.threadIdx.x
    nt = cuda.blockDim.x
    n = win_ptr.shape[0] - 1
    parts, cut, is_cut = work[:n], work[n:2 * n], work[2 * n:3 * n]
    unit_ptr, slot_ptr, split_ptr = work[3 * n:4 * n + 1], work[4 * n + 1:5 * n + 2], work[5 * n + 2:6 * n + 3]
    for w in range(t0, n, nt):
        k = max((win_ptr[w + 1] - win_ptr[w] + unit_size - 1) // unit_size, 1)
        k = min(k, max_units)
        parts[w] = k
        cut[w] = k if k > 1 else 0
        is_cut[w] = 1 if k > 1 else 0
    cuda.syncthreads()
    _scan_cta(parts, unit_ptr, totals)
    cuda.syncthreads()
    _scan_cta(cut, slot_ptr, totals)
    cuda.syncthreads()
    _scan_cta(is_cut, split_ptr, totals)
    cuda.syncthreads()
    for w in range(t0, n, nt):
        k = parts[w]
        start = np.int64(win_ptr[w])
        nb = np.int64(win_ptr[w + 1]) - start
        u0 = unit_ptr[w]
        slot = slot_ptr[w] if k > 1 else -1
        for j in range(k):
            u = u0 + j
            units[u, 0] = w
            units[u, 1] = start + j * nb // k
            units[u, 2] = start + (j + 1) * nb // k
            units[u, 3] = slot + j if k > 1 else -1
            unit_k0[u, 0] = slot
            unit_k0[u, 1] = k
        if k > 1:
            f = split_ptr[w]
            splits[f, 0] = w
            splits[f, 1] = slot
            splits[f, 2] = k
            splits[f, 3] = 0


@cuda.jit(device=True)
def _longest_first_cta(units, unit_k0, counts, starts, units_out, k0_out, totals):
    """A plan's units (and their split rows) longest first, stable, by the CTA's threads: a counting sort of the
    units' block counts (at most ``keys - 1``, where ``counts`` holds ``keys`` per warp) -- the host's sort, on a
    plan made on the device.

    Each warp takes a contiguous run of units, 32 at a time: ``match_any`` groups the lanes of one length, and the
    lowest lane of each group counts it, then places it after the runs before it.  ``counts`` (zeroed here) and
    its scan ``starts`` are scratch, ordered by length (longest first), then warp; ``totals`` is the CTA scan's
    shared memory."""
    t0 = cuda.threadIdx.x
    lane = t0 % 32
    warp = t0 // 32
    n_warps = cuda.blockDim.x // 32
    n = units.shape[0]
    top = counts.shape[0] // n_warps - 1  # (the longest length counted)
    for i in range(t0, counts.shape[0], cuda.blockDim.x):
        counts[i] = 0
    cuda.syncthreads()
    run = (n + n_warps - 1) // n_warps
    lo = min(warp * run, n)
    hi = min(lo + run, n)
    below = (np.int64(1) << lane) - 1  # (the lanes before this one)
    for scatter in range(2):  # count, then place
        for base in range(lo, hi, 32):  # (the same trip count in every lane of the warp)
            u = base + lane
            key = -1
            if u < hi:
                key = (top - (units[u, 2] - units[u, 1])) * n_warps + warp
            peers = np.int64(cuda.match_any_sync(FULL_MASK, key)) & 0xFFFFFFFF
            first = (peers & below) == 0
            if scatter and u < hi:
                at = starts[key] + cuda.popc(np.uint32(peers & below))
                for c in range(4):
                    units_out[at, c] = units[u, c]
                k0_out[at, 0] = unit_k0[u, 0]
                k0_out[at, 1] = unit_k0[u, 1]
            cuda.syncwarp(FULL_MASK)
            if first and u < hi:
                if scatter:
                    starts[key] += cuda.popc(np.uint32(peers))
                else:
                    counts[key] += cuda.popc(np.uint32(peers))
            cuda.syncwarp(FULL_MASK)
        if not scatter:
            cuda.syncthreads()
            _scan_cta(counts, starts, totals)
            cuda.syncthreads()


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


@cuda.jit(cache=True)
def csr_of_order(order, rows, cols, data, indptr, indices, out):
    """The CSR of COO pairs from the order of a stable sort by row (``order``), a thread per sorted position and per
    row pointer: ``indices[i] = cols[order[i]]``, ``out[i] = data[order[i]]`` (``out`` empty: no values), and
    ``indptr[r]`` the first sorted position whose row is at least ``r`` -- a binary search through ``order``, so a
    long run of empty rows costs no thread more than the others."""
    t = cuda.grid(1)
    nnz = order.shape[0]
    if t < nnz:
        e = order[t]
        indices[t] = cols[e]
        if out.shape[0]:
            out[t] = data[e]
    if t < indptr.shape[0]:
        lo = 0
        hi = nnz
        while lo < hi:
            mid = (lo + hi) // 2
            if rows[order[mid]] < t:
                lo = mid + 1
            else:
                hi = mid
        indptr[t] = lo


# A canonical CSR's transpose without a sort: its columns' counts (``transpose_count``), a scan of them into the
# transpose's row pointer, each entry's row into its column's run in any order (``transpose_place``), then each
# entry at its place in that run, the run's rows ascending (``transpose_rank``).  The rows of one column are
# distinct, so an entry's place is the number of the run's rows below its own: the result does not depend on the
# order the atomics placed them in (bit for bit the stable sort's).

@cuda.jit(cache=True)
def transpose_count(indices, count):
    """Per entry (one thread): one more in its column's ``count`` (zeroed before)."""
    e = cuda.grid(1)
    if e < indices.shape[0]:
        cuda.atomic.add(count, indices[e], 1)


@cuda.jit(cache=True)
def transpose_place(indices, rows, ptr, count, run_rows):
    """Per entry (one thread), ``ptr`` the scan of the counts: its row into a free place of its column's run
    ``run_rows[ptr[c]:ptr[c + 1]]`` (any order), the column's count taken back down to zero."""
    e = cuda.grid(1)
    if e < indices.shape[0]:
        c = indices[e]
        run_rows[ptr[c] + cuda.atomic.sub(count, c, 1) - 1] = rows[e]


@cuda.jit(cache=True)
def transpose_rank(indices, rows, ptr, run_rows, data, order, out_indices, out_data):
    """Per entry ``e`` (one thread) of row ``r`` and column ``c``, after :func:`transpose_place`: its place ``p`` in
    the transpose is ``ptr[c]`` plus the number of rows below ``r`` in its column's run; ``out_indices[p] = r``,
    ``order[p] = e``, ``out_data[p] = data[e]`` (``out_data`` empty: no values)."""
    e = cuda.grid(1)
    if e >= indices.shape[0]:
        return
    c = indices[e]
    r = rows[e]
    s = ptr[c]
    p = s
    for q in range(s, ptr[c + 1]):
        if run_rows[q] < r:
            p += 1
    out_indices[p] = r
    order[p] = e
    if out_data.shape[0]:
        out_data[p] = data[e]


#: Every kernel with example argument types, for ``compile_ptx`` checks in CI.
_I = "int32[::1]"
KERNELS = {
    "check_csr": (check_csr, f"({_I}, {_I}, int64, {_I}, {_I})"),
    "rank_edges": (rank_edges, f"({_I}, {_I}, {_I}, int64, int64, {_I}, {_I}, {_I})"),
    "window_blocks": (window_blocks, f"({_I}, {_I}, int64, int64, int64, {_I}, {_I})"),
    "condense_edges": (
        condense_edges,
        f"({_I}, {_I}, {_I}, int64, int64, {_I}, {_I}, {_I}, {_I}, {_I}, {_I}, {_I})",
    ),
    "count_block_rows": (
        count_block_rows,
        f"({_I}, {_I}, int64, int64, int64, {_I}, {_I}, {_I}, {_I}, {_I}, {_I})",
    ),
    "scatter_edges": (
        scatter_edges,
        f"({_I}, {_I}, float32[::1], int64, int64, {_I}, {_I}, {_I}, {_I}, uint8[::1], float32[::1], {_I}, {_I})",
    ),
    "block_meta": (block_meta, f"({_I}, {_I}, uint8[::1], int64, uint32[:, ::1], {_I})"),
    "sum_runs": (sum_runs, "(int32[::1], float32[::1], float32[::1])"),
    "scan_tile_totals": (scan_tile_totals, f"({_I}, {_I}, {_I})"),
    "scan_tiles": (scan_tiles, f"({_I}, {_I}, {_I}, {_I})"),
    "translate_small": (
        translate_small,
        f"({_I}, {_I}, float32[::1], int64, int64, int64, {_I}, {_I}, {_I}, {_I}, {_I}, {_I}, {_I}, {_I}, {_I}, "
        f"{_I}, {_I}, uint8[::1], float32[::1], {_I}, int64, uint32[:, ::1], {_I})",
    ),
    "plan_units": (plan_units, f"({_I}, int64, int64, {_I}, int32[:, ::1], int32[:, ::1], int32[:, ::1])"),
    "csr_of_order": (csr_of_order, f"(int64[::1], {_I}, {_I}, float32[::1], {_I}, {_I}, float32[::1])"),
    "transpose_count": (transpose_count, f"({_I}, {_I})"),
    "transpose_place": (transpose_place, f"({_I}, {_I}, {_I}, {_I}, {_I})"),
    "transpose_rank": (transpose_rank, f"({_I}, {_I}, {_I}, {_I}, float32[::1], int64[::1], {_I}, float32[::1])"),
    "plan_longest_first": (plan_longest_first, f"({_I}, int64, int64, {_I}, int64, int32[:, ::1], int32[:, ::1], "
                                               "int32[:, ::1], int32[:, ::1], int32[:, ::1])"),
}
