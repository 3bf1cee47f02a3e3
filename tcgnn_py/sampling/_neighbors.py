"""Layer 2: the neighbor sampler -- at most ``fanout`` neighbors of each node of a batch, uniform without
replacement, seeded: the ``sample_rows`` Numba kernel (:mod:`tcgnn_py.kernels.sample`) on the GPU, its NumPy
reference on the host, the same neighbors for the same key.
"""

import threading

import numpy as np

from .._device import array_module, to_host

__all__ = ["sample_reference", "sample_neighbors", "sample_hop", "hop_kernels", "row_entries", "Relabel", "splitmix64",
           "GOLDEN", "NODE_MIX", "SORT_ROWS_MAX", "HOP_BOUND_BYTES"]

_M64 = (1 << 64) - 1
#: splitmix64's increment and the node's multiplier in a draw's counter (as :mod:`tcgnn_py.kernels.sample`: a test
#: checks it).
GOLDEN, NODE_MIX = 0x9E3779B97F4A7C15, 0xD1B54A32D192ED03


def splitmix64(z):
    """splitmix64's output of the counter ``z`` (a Python int, taken mod 2**64)."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _draws(key, v, k):
    """The draws ``t = 0 .. k-1`` of node ``v`` (Python ints): :func:`tcgnn_py.kernels.sample.draw`."""
    base = (int(key) ^ (int(v) * NODE_MIX)) & _M64
    return [splitmix64(base + (t + 1) * GOLDEN) for t in range(k)]


def sample_reference(indptr, indices, nodes, fanout, key):
    """``(ptr, cols)``: for each node of ``nodes``, at most ``fanout`` of its neighbors (``cols[ptr[i]:ptr[i+1]]``,
    global ids, int32; ``fanout < 0``: all), uniform without replacement -- every neighbor in CSR order where the
    degree is at most ``fanout``, else Floyd's algorithm over the neighbor positions.  NumPy; the GPU kernel's
    oracle."""
    nodes = np.asarray(nodes, np.int64)
    deg = (indptr[nodes + 1] - indptr[nodes]).astype(np.int64)
    counts = deg if fanout < 0 else np.minimum(deg, fanout)
    ptr = np.zeros(len(nodes) + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    cols = np.empty(int(ptr[-1]), np.int32)
    for i, v in enumerate(nodes.tolist()):
        start, d, o = int(indptr[v]), int(deg[i]), int(ptr[i])
        if fanout < 0 or d <= fanout:
            cols[o:o + d] = indices[start:start + d]
            continue
        picked = []
        for t, z in enumerate(_draws(key, v, fanout)):
            j = d - fanout + t
            r = z % (j + 1)
            picked.append(j if r in picked else r)
        cols[o:o + fanout] = indices[start + np.asarray(picked, np.int64)]
    return ptr, cols


def sample_neighbors(indptr, indices, nodes, fanout, key):
    """:func:`sample_reference` where the arrays are: NumPy on the host, the ``sample_rows`` kernel on the GPU
    (``indptr`` int64, ``indices`` int32, ``nodes`` int64 CuPy arrays)."""
    xp = array_module(indptr)
    if xp is np:
        return sample_reference(indptr, indices, nodes, fanout, key)
    from ..kernels.launch import THREADS_PER_BLOCK, grid, launch_numba
    from ..kernels.sample import sample_rows

    deg = indptr[nodes + 1] - indptr[nodes]
    counts = deg if fanout < 0 else xp.minimum(deg, fanout)
    ptr = xp.zeros(nodes.shape[0] + 1, np.int64)
    xp.cumsum(counts, out=ptr[1:])
    cols = xp.empty(int(ptr[-1]), np.int32)  # synchronize! (the sample's size)
    if nodes.shape[0]:
        launch_numba(sample_rows, grid(nodes.shape[0]), THREADS_PER_BLOCK, indptr, indices, nodes, int(fanout),
                     np.uint64(key), ptr, cols)
    return ptr, cols


#: A hop on the GPU writes its sample into a buffer of the fan-out's bound (:func:`hop_kernels`) while that buffer
#: holds at most this many bytes; past it, the hop reads the sample's size first (two reads, an exact buffer).
HOP_BOUND_BYTES = 1 << 28


def sample_hop(indptr, indices, nodes, fanout, key, relabel):
    """``(src, ptr, local, rows, values)`` of one hop: :func:`sample_neighbors` of ``nodes`` (distinct, int64),
    relabelled by ``relabel`` (the graph's :class:`Relabel`, on the arrays' side), each row's columns ascending
    (:func:`row_entries`).  On the GPU a fan-out's hop reads the device once (:func:`hop_kernels`): sampling then
    relabelling reads it twice, the sample's size and then the new sources' count."""
    if array_module(indptr) is np or fanout < 0:
        ptr, cols = sample_neighbors(indptr, indices, nodes, fanout, key)
        src, local = relabel(nodes, cols)
    else:
        src, ptr, local = hop_kernels(array_module(indptr), indptr, indices, nodes, fanout, key, relabel)
    rows, local, values = row_entries(ptr, local, src.shape[0], fanout)
    return src, ptr, local, rows, values


def hop_kernels(xp, indptr, indices, nodes, fanout, key, relabel):
    """``(src, ptr, local)`` of a hop of ``fanout >= 0`` through the kernels (``xp`` CuPy, or NumPy in the
    simulator): :func:`sample_neighbors` and ``relabel``'s call in one pass -- the sample written into a buffer of
    its bound (``fanout`` per node, up to :data:`HOP_BOUND_BYTES`), its new nodes marked as they are drawn -- and
    one host read, of the sample's size and the new sources' count together.  The map is whole again afterwards,
    whatever happened."""
    from ..kernels import sample as k
    from ..kernels.launch import THREADS_PER_BLOCK, grid, launch_numba

    n_dst, n = nodes.shape[0], relabel.slot.shape[0]
    ptr = xp.zeros(n_dst + 1, np.int64)
    if not n_dst:
        return xp.empty(0, np.int64), ptr, xp.empty(0, np.int32)
    counts = xp.empty(n_dst, np.int64)
    bound = min(n_dst * fanout, indices.shape[0])  # (distinct nodes: at most every entry of the graph)
    slot, mark = relabel.slot, relabel.mark
    with relabel._lock:
        src = None
        try:
            launch_numba(k.hop_counts, grid(n_dst), THREADS_PER_BLOCK, indptr, nodes, int(fanout), counts, slot)
            xp.cumsum(counts, out=ptr[1:])
            if bound * 4 > HOP_BOUND_BYTES:  # a buffer of the bound would be large: the sample's size read first
                bound = int(ptr[-1])  # synchronize!
            cols = xp.empty(bound, np.int32)
            launch_numba(k.sample_mark_rows, grid(n_dst), THREADS_PER_BLOCK, indptr, indices, nodes, int(fanout),
                         np.uint64(key), ptr, cols, slot, mark)
            scan = xp.cumsum(mark, dtype=np.int32)
            # synchronize! (the hop's one read: its new sources and its entries)
            n_new, nnz = (int(v) for v in to_host(xp.stack([scan[-1].astype(np.int64), ptr[-1]])))
            src = xp.empty(n_dst + n_new, np.int64)
            launch_numba(k.hop_sources, grid(n), THREADS_PER_BLOCK, nodes, mark, scan, slot, src)
            local = cols[:nnz]
            if nnz:
                launch_numba(k.hop_local, grid(nnz), THREADS_PER_BLOCK, local, slot)
        except BaseException:
            slot[...], mark[...] = -1, 0
            raise
        launch_numba(k.clear_slots, grid(src.shape[0]), THREADS_PER_BLOCK, src, slot)
    return src, ptr, local


#: The largest fan-out whose rows :func:`row_entries` sorts one thread per row on the GPU (insertion: quadratic in
#: a row's length); larger ones, and every neighbor (-1), take the sort of all entries.
SORT_ROWS_MAX = 64


def row_entries(ptr, local, n_src, fanout):
    """``(rows, local, values)`` of a hop's entries (``ptr`` its row pointer, int64; ``local`` each entry's source
    column, int32, in the sampler's order): each row's columns ascending -- a canonical CSR, which the translation
    takes as it is -- with each entry's row (int32) and value ``1 / count`` (float32, the mean over the row's
    sampled neighbors; a row's values are all equal, so only the columns move).  On the GPU, fan-outs up to
    :data:`SORT_ROWS_MAX` take the ``sort_rows`` kernel (one launch, ``local`` sorted in place); NumPy's sort of
    all entries by ``(row, column)`` is the reference."""
    xp = array_module(ptr)
    if xp is not np and 0 <= fanout <= SORT_ROWS_MAX:
        from ..kernels.launch import THREADS_PER_BLOCK, grid, launch_numba
        from ..kernels.sample import sort_rows

        n_rows, nnz = ptr.shape[0] - 1, local.shape[0]
        rows, values = xp.empty(nnz, np.int32), xp.empty(nnz, np.float32)
        if n_rows:
            launch_numba(sort_rows, grid(n_rows), THREADS_PER_BLOCK, ptr, local, rows, values)
        return rows, local, values
    rows = xp.searchsorted(ptr, xp.arange(local.shape[0]), side="right") - 1
    local = local[xp.argsort(rows * n_src + local)]
    values = (1.0 / xp.maximum(xp.diff(ptr), 1)).astype(np.float32)[rows]
    return rows.astype(np.int32), local, values


class Relabel:
    """A hop's source nodes and each sampled entry's column among them, by a dense map of one graph's ``n`` nodes
    (NumPy or CuPy, as ``xp``): its slots are made once and reset after each call, so a hop costs a few passes
    over what it sampled and one scan of the marks -- no sort (a sort-based ``unique`` / ``isin`` per hop costs
    several times more on the GPU)."""

    def __init__(self, n, xp):
        self.slot = xp.full(n, -1, np.int32)  # node -> its column in the hop's sources, -1 where none
        self.mark = xp.zeros(n, np.int8)  # the nodes the hop sampled that are not its destinations
        self._xp, self._lock = xp, threading.Lock()

    def __call__(self, nodes, cols):
        """``(src, local)``: ``src`` the destinations ``nodes`` (distinct, int64) then the other nodes of ``cols``
        ascending (int64), ``local[i]`` the position of ``cols[i]`` in ``src`` (int32)."""
        xp, slot, mark = self._xp, self.slot, self.mark
        with self._lock:
            new = None
            try:
                mark[cols] = 1
                mark[nodes] = 0
                new = xp.flatnonzero(mark)  # synchronize! (how many new sources)
                mark[new] = 0
                n_dst = nodes.shape[0]
                slot[nodes] = xp.arange(n_dst, dtype=np.int32)
                slot[new] = xp.arange(n_dst, n_dst + new.shape[0], dtype=np.int32)
                local = slot[cols]
            finally:  # (the map is whole again for the next call, whatever happened)
                slot[nodes] = -1
                if new is None:
                    mark[...] = 0
                else:
                    slot[new] = -1
        return xp.concatenate([nodes, new.astype(np.int64)]), local
