"""Layer 1: Numba CUDA kernel of the neighbor sampler (:func:`tcgnn_py.nn.sample_blocks`).

:func:`sample_rows` draws, for each node of a batch, at most ``fanout`` of its neighbors uniformly without
replacement: all of them where the degree is at most ``fanout``, else Floyd's algorithm over the neighbor
positions (``fanout`` draws whatever the degree, so a hub costs what a leaf does).  Draw ``t`` of node ``v`` is
:func:`draw` of ``(key, v, t)``, a counter-based hash: no state between threads, and the same numbers on the host
(:func:`tcgnn_py.nn._sample.sample_reference`), which this kernel must match bit for bit.
"""

import numpy as np
from numba import cuda

__all__ = ["sample_rows", "draw", "KERNELS", "GOLDEN", "NODE_MIX"]

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


#: Every kernel with example argument types, for ``compile_ptx`` checks in CI.
KERNELS = {
    "sample_rows": (sample_rows, "(int64[::1], int32[::1], int64[::1], int64, uint64, int64[::1], int32[::1])"),
}
