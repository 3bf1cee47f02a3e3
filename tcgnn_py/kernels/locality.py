"""Layer 1: the Numba CUDA kernel of the locality reorder's coarsening.

:func:`best_partner` is the step of each coarsening level that is not a sort
or a scan: every vertex of the (contracted) graph picks the neighbour with the
highest score, the smallest neighbour id on ties.  One warp per vertex strides
its CSR row and reduces (score, id) with ``shfl_xor``, so a hub's row costs
``degree / 32`` steps, not ``degree``.  The reduction is an argmax over a total
order, so its result does not depend on the order of the lanes: it equals
:func:`tcgnn_py.orders._locality._best_partner_reference` bit for bit.
"""

import numpy as np
from numba import cuda

from .warp import FULL_MASK

__all__ = ["best_partner", "KERNELS"]


@cuda.jit(cache=True)
def best_partner(ptr, col, score, partner):
    """``partner[v]`` = argmax of ``score`` over row ``v`` (ties: smallest ``col``); -1 for an empty row."""
    v = cuda.grid(1) // 32  # the same for the whole warp: it exits together
    lane = cuda.laneid
    if v >= partner.shape[0]:
        return
    best_s = -1.0
    best_c = np.int64(-1)
    for e in range(ptr[v] + lane, ptr[v + 1], 32):
        s = score[e]
        c = np.int64(col[e])
        if s > best_s or (s == best_s and c < best_c):
            best_s = s
            best_c = c
    off = 16
    while off > 0:
        s = cuda.shfl_xor_sync(FULL_MASK, best_s, off)
        c = cuda.shfl_xor_sync(FULL_MASK, best_c, off)
        # an empty lane holds (-1.0, -1): every real score is > 0, so it never wins
        if s > best_s or (s == best_s and c < best_c):
            best_s = s
            best_c = c
        off >>= 1
    if lane == 0:
        partner[v] = best_c


#: Every kernel with example argument types, for ``compile_ptx`` checks in CI.
KERNELS = {
    "best_partner": (best_partner, "(int64[::1], int64[::1], float64[::1], int64[::1])"),
}
