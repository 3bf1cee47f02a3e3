"""Layer 1: Numba CUDA kernels of the neighbor sampler (:func:`tcgnn_py.nn.sample_blocks`).

:func:`sample_rows` draws, for each node of a batch, at most ``fanout`` of its neighbors uniformly without
replacement: all of them where the degree is at most ``fanout``, else Floyd's algorithm over the neighbor
positions (``fanout`` draws whatever the degree, so a hub costs what a leaf does).  Draw ``t`` of node ``v`` is
:func:`draw` of ``(key, v, t)``, a counter-based hash: no state between threads, and the same numbers on the host
(:func:`tcgnn_py.sampling.sample_reference`), which this kernel must match bit for bit.  A batch's hops on the GPU
(:func:`tcgnn_py.sampling.sample_hops`) take three launches each -- :func:`sample_mark_rows` and
:func:`hop_sources` around one scan, hop after hop on buffers of each hop's bound, then one host read of every hop's
sizes and :func:`hop_rows` per hop (which also copies the sources and row pointer out of the bound-sized buffers)
-- with :func:`place_slots` before the first and after the last: the sample, its relabelling and a canonical CSR
(each row's columns ascending, with their rows and values).  A loader's batches replay the launches up to the read
as a CUDA graph (:class:`tcgnn_py.sampling.RecordedHops`), so every size and key they use is read on the device.
"""

import numpy as np
from numba import cuda

__all__ = ["sample_rows", "place_slots", "sample_mark_rows", "hop_sources", "hop_rows", "draw", "KERNELS", "GOLDEN",
           "NODE_MIX"]

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


# A batch's hops on the GPU (:func:`tcgnn_py.sampling.sample_hops`): each hop's sample and its relabelling with one
# host read.  ``slot`` (node -> its column in the hop's sources, -1 where none) is the graph's dense map: it holds the
# destinations' places when a hop starts (its sources are the next hop's destinations, in the same places, so the map
# carries from hop to hop) and is whole (all -1) before and after a batch.  ``work`` is one int32 buffer: marks of
# the sampled nodes that are not destinations at ``work[:n]`` (all 0 between hops), the destinations' sample counts
# at ``work[n:n + n_dst]``, so that one scan of it gives both the new sources' places and the row pointer.

@cuda.jit(cache=True)
def place_slots(nodes, slot, place):
    """Per node ``i`` (one thread): its slot ``i`` where ``place``, else -1 (the map cleared)."""
    i = cuda.grid(1)
    if i < nodes.shape[0]:
        slot[nodes[i]] = i if place else -1


@cuda.jit(cache=True)
def sample_mark_rows(indptr, indices, nodes, fanout, keys, cols, work, n, slot, sizes, h):
    """Per destination ``i`` (one thread) of the ``sizes[2 h]`` the hop has (``nodes`` may be longer: a bound):
    :func:`sample_rows` of ``fanout >= 0`` with the hop's key ``keys[h]`` into ``cols[i * fanout:]`` (a stride of
    the fan-out: no scan before it), its count at ``work[n + i]``, and each sampled node without a slot (not a
    destination) marked at ``work[node]``; a thread past the hop's destinations writes a zero count, so that the
    scan of the bound's counts is the scan of the hop's.  The key is read on the device, as the sizes are, so that
    a recorded batch replays with new keys."""
    i = cuda.grid(1)
    if i >= nodes.shape[0]:
        return
    if i >= sizes[2 * h]:
        work[n + i] = 0
        return
    o = i * fanout
    c = _sample_row(indptr, indices, nodes[i], fanout, keys[h], cols, o)
    work[n + i] = c
    for t in range(c):
        v = cols[o + t]
        if slot[v] < 0:
            work[v] = 1


@cuda.jit(cache=True)
def hop_sources(nodes, work, scan, n, slot, src, ptr, sizes, h):
    """Per node ``t`` of the graph and per destination (one thread), ``scan`` the inclusive scan of ``work[:n +
    bound]`` and ``sizes[2 h]`` the hop's destinations: ``src`` the destinations, then the marked nodes ascending,
    each marked node's slot its place there (marks cleared); ``ptr`` the row pointer (the counts' scan less the
    marks' total); ``sizes[2 h + 1]`` the hop's entries and ``sizes[2 h + 2]`` its sources (the next hop's
    destinations), so that the host reads every hop's sizes at once, after the last."""
    t = cuda.grid(1)
    n_dst = sizes[2 * h]
    if t < n_dst:
        src[t] = nodes[t]
    if t <= n_dst:
        ptr[t] = scan[n + t - 1] - scan[n - 1] if t else 0
    if t == 0:
        sizes[2 * h + 1] = scan[n + n_dst - 1] - scan[n - 1]
        sizes[2 * h + 2] = n_dst + scan[n - 1]
    if t < n and work[t] != 0:
        p = n_dst + scan[t] - 1
        src[p] = t
        slot[t] = p
        work[t] = 0


@cuda.jit(cache=True)
def hop_rows(cols, fanout, ptr, slot, src, local, rows, values, src_out, ptr_out):
    """Per thread ``t``, after :func:`hop_sources`, on a hop of ``ptr_out.shape[0] - 1`` rows and
    ``src_out.shape[0]`` sources: the sources and the row pointer copied out of their bound-sized buffers (``src``,
    ``ptr``) into arrays of the hop's size, and row ``t``'s sampled nodes (``cols[t * fanout:]``) as columns among
    the sources, sorted ascending into ``local[ptr[t]:ptr[t+1]]`` (insertion: a row holds at most the fan-out's few
    entries), each entry's row ``t`` and value ``1 / count`` (the mean over the row's sampled neighbors, divided in
    float64 as NumPy's reference does)."""
    t = cuda.grid(1)
    if t < src_out.shape[0]:
        src_out[t] = src[t]
    if t < ptr_out.shape[0]:
        ptr_out[t] = ptr[t]
    if t >= ptr_out.shape[0] - 1:
        return
    s = ptr[t]
    e = ptr[t + 1]
    o = t * fanout
    v = np.float32(1.0 / max(e - s, 1))
    for q in range(e - s):
        x = slot[cols[o + q]]
        j = s + q
        while j > s and local[j - 1] > x:
            local[j] = local[j - 1]
            j -= 1
        local[j] = x
        rows[s + q] = t
        values[s + q] = v


#: Every kernel with example argument types, for ``compile_ptx`` checks in CI.
KERNELS = {
    "sample_rows": (sample_rows, "(int64[::1], int32[::1], int64[::1], int64, uint64, int64[::1], int32[::1])"),
    "place_slots": (place_slots, "(int64[::1], int32[::1], int64)"),
    "sample_mark_rows": (sample_mark_rows, "(int64[::1], int32[::1], int64[::1], int64, uint64[::1], int32[::1], "
                                           "int32[::1], int64, int32[::1], int64[::1], int64)"),
    "hop_sources": (hop_sources, "(int64[::1], int32[::1], int32[::1], int64, int32[::1], int64[::1], int32[::1], "
                                 "int64[::1], int64)"),
    "hop_rows": (hop_rows, "(int32[::1], int64, int32[::1], int32[::1], int64[::1], int32[::1], int32[::1], "
                           "float32[::1], int64[::1], int32[::1])"),
}
