"""Layer 1: Numba CUDA kernels of the neighbor sampler (:func:`tcgnn_py.nn.sample_blocks`).

:func:`sample_rows` draws, for each node of a batch, at most ``fanout`` of its neighbors uniformly without
replacement: all of them where the degree is at most ``fanout``, else Floyd's algorithm over the neighbor
positions (``fanout`` draws whatever the degree, so a hub costs what a leaf does).  Draw ``t`` of node ``v`` is
:func:`draw` of ``(key, v, t)``, a counter-based hash: no state between threads, and the same numbers on the host
(:func:`tcgnn_py.sampling.sample_reference`), which this kernel must match bit for bit.  :func:`sort_rows`
makes a hop's entries a canonical CSR: each row's columns ascending, with their rows and values.
"""

import numpy as np
from numba import cuda

__all__ = ["sample_rows", "sort_rows", "draw", "KERNELS", "GOLDEN", "NODE_MIX"]

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


@cuda.jit(cache=True)
def sample_rows(indptr, indices, nodes, fanout, key, out_ptr, out_cols):
    """Per node ``i`` of the batch (one thread): its sampled neighbors into ``out_cols[out_ptr[i]:out_ptr[i+1]]``
    (``out_ptr`` the scan of ``min(degree, fanout)``; ``fanout < 0`` takes every neighbor), in CSR order where all
    are taken, else in the order Floyd's algorithm picks their positions."""
    i = cuda.grid(1)
    if i >= nodes.shape[0]:
        return
    v = nodes[i]
    start = indptr[v]
    d = indptr[v + 1] - start
    o = out_ptr[i]
    if fanout < 0 or d <= fanout:
        for t in range(d):
            out_cols[o + t] = indices[start + t]
        return
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
}
