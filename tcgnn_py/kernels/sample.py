"""Layer 1: Numba CUDA kernels of the neighbor sampler (:func:`tcgnn_py.nn.sample_blocks`).

:func:`sample_rows` draws, for each node of a batch, at most ``fanout`` of its neighbors uniformly without
replacement: all of them where the degree is at most ``fanout``, else Floyd's algorithm over the neighbor
positions (``fanout`` draws whatever the degree, so a hub costs what a leaf does).  Draw ``t`` of node ``v`` is
:func:`draw` of ``(key, v, t)``, a counter-based hash: no state between threads, and the same numbers on the host
(:func:`tcgnn_py.sampling.sample_reference`), which this kernel must match bit for bit.  :func:`sort_rows`
makes a hop's entries a canonical CSR: each row's columns ascending, with their rows and values.  A hop on the GPU
(:func:`tcgnn_py.sampling.sample_hop`) samples with :func:`sample_mark_rows` and relabels with :func:`hop_counts`,
:func:`hop_sources`, :func:`hop_local` and :func:`clear_slots`, so that it reads the device once.
"""

import numpy as np
from numba import cuda

__all__ = ["sample_rows", "sort_rows", "hop_counts", "sample_mark_rows", "hop_sources", "hop_local", "clear_slots",
           "draw", "KERNELS", "GOLDEN", "NODE_MIX"]

#: splitmix64's increment (the golden ratio) and the node's multiplier in the draw's counter.
GOLDEN = 0x9E3779B97F4A7C15
NODE_MIX = 0xD1B54A32D192ED03


@cuda.jit(device=True, inline=True)
def draw(key, v, t):
    """splitmix64 of ``(key ^ v * NODE_MIX) + (t + 1) * GOLDEN`` (uint64 arithmetic): draw ``t`` of node ``v``."""
    z = np.uint64(key) ^ (np.uint64(v) * np.uint64(NODE_MIX))
    z = z + (np.uint64(t) + np.uint64(1)) * np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@cuda.jit(device=True, inline=True)
def _sample_row(indptr, indices, v, fanout, key, out_cols, o):
    """Node ``v``'s sampled neighbors into ``out_cols[o:]``; returns how many."""
    start = indptr[v]
    d = indptr[v + 1] - start
    if fanout < 0 or d <= fanout:
        for t in range(d):
            out_cols[o + t] = indices[start + t]
        return d
    k = fanout
    for t in range(k):  # Floyd: position r of [0, j], or j where r is taken already
        j = d - k + t
        r = np.int64(draw(key, v, t) % np.uint64(j + 1))
        for s in range(t):
            if out_cols[o + s] == r:
                r = j
                break
        out_cols[o + t] = r
    for t in range(k):
        out_cols[o + t] = indices[start + out_cols[o + t]]
    return k


@cuda.jit(cache=True)
def sample_rows(indptr, indices, nodes, fanout, key, out_ptr, out_cols):
    """Per node ``i`` of the batch (one thread): its sampled neighbors into ``out_cols[out_ptr[i]:out_ptr[i+1]]``
    (``out_ptr`` the scan of ``min(degree, fanout)``; ``fanout < 0`` takes every neighbor), in CSR order where all
    are taken, else in the order Floyd's algorithm picks their positions."""
    i = cuda.grid(1)
    if i >= nodes.shape[0]:
        return
    _sample_row(indptr, indices, nodes[i], fanout, key, out_cols, out_ptr[i])


# A hop on the GPU (:func:`tcgnn_py.sampling.sample_hop`): the sample and its relabelling with one host read.
# ``slot`` (node -> its column in the hop's sources, -1 where none) and ``mark`` (the sampled nodes that are not
# destinations) are the graph's dense maps, whole (all -1, all 0) before and after a hop.

@cuda.jit(cache=True)
def hop_counts(indptr, nodes, fanout, counts, slot):
    """Per destination ``i`` (one thread): how many neighbors it samples (``min(degree, fanout)``; every one where
    ``fanout < 0``), and its node's slot ``i``."""
    i = cuda.grid(1)
    if i >= nodes.shape[0]:
        return
    v = nodes[i]
    d = indptr[v + 1] - indptr[v]
    counts[i] = d if fanout < 0 or d <= fanout else fanout
    slot[v] = i


@cuda.jit(cache=True)
def sample_mark_rows(indptr, indices, nodes, fanout, key, out_ptr, out_cols, slot, mark):
    """:func:`sample_rows`, each sampled node without a slot (not a destination) marked in ``mark``."""
    i = cuda.grid(1)
    if i >= nodes.shape[0]:
        return
    o = out_ptr[i]
    n = _sample_row(indptr, indices, nodes[i], fanout, key, out_cols, o)
    for t in range(n):
        c = out_cols[o + t]
        if slot[c] < 0:
            mark[c] = 1


@cuda.jit(cache=True)
def hop_sources(nodes, mark, scan, slot, src):
    """Per node ``t`` of the graph and per destination (one thread): ``src`` the destinations, then the marked nodes
    ascending (``scan``: the inclusive scan of ``mark``), each marked node's slot its place there; marks cleared."""
    t = cuda.grid(1)
    n_dst = nodes.shape[0]
    if t < n_dst:
        src[t] = nodes[t]
    if t < mark.shape[0] and mark[t] != 0:
        p = n_dst + scan[t] - 1
        src[p] = t
        slot[t] = p
        mark[t] = 0


@cuda.jit(cache=True)
def hop_local(cols, slot):
    """Per sampled entry (one thread): its node replaced by its column among the hop's sources, in place."""
    j = cuda.grid(1)
    if j < cols.shape[0]:
        cols[j] = slot[cols[j]]


@cuda.jit(cache=True)
def clear_slots(src, slot):
    """Per source node (one thread): its slot back to -1."""
    i = cuda.grid(1)
    if i < src.shape[0]:
        slot[src[i]] = -1


@cuda.jit(cache=True)
def sort_rows(ptr, local, rows, values):
    """Per row ``i`` of a sampled hop (one thread): its columns ``local[ptr[i]:ptr[i+1]]`` sorted ascending in
    place (insertion: a row holds at most the fan-out's few entries), and each of its entries' row ``i`` and value
    ``1 / count`` (the mean over the row's sampled neighbors, divided in float64 as NumPy's reference does)."""
    i = cuda.grid(1)
    if i >= ptr.shape[0] - 1:
        return
    s = ptr[i]
    e = ptr[i + 1]
    v = np.float32(1.0 / max(e - s, 1))
    for t in range(s, e):
        x = local[t]
        j = t
        while j > s and local[j - 1] > x:
            local[j] = local[j - 1]
            j -= 1
        local[j] = x
        rows[t] = i
        values[t] = v


#: Every kernel with example argument types, for ``compile_ptx`` checks in CI.
KERNELS = {
    "sample_rows": (sample_rows, "(int64[::1], int32[::1], int64[::1], int64, uint64, int64[::1], int32[::1])"),
    "sort_rows": (sort_rows, "(int64[::1], int32[::1], int32[::1], float32[::1])"),
    "hop_counts": (hop_counts, "(int64[::1], int64[::1], int64, int64[::1], int32[::1])"),
    "sample_mark_rows": (sample_mark_rows, "(int64[::1], int32[::1], int64[::1], int64, uint64, int64[::1], int32[::1],"
                                           " int32[::1], int8[::1])"),
    "hop_sources": (hop_sources, "(int64[::1], int8[::1], int32[::1], int32[::1], int64[::1])"),
    "hop_local": (hop_local, "(int32[::1], int32[::1])"),
    "clear_slots": (clear_slots, "(int64[::1], int32[::1])"),
}
