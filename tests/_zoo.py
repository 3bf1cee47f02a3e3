"""Matrices every path is tested on (edge cases, synthetic and real graphs), and shared expectations."""

import numpy as np
import scipy.sparse as sp


def _rand(rng, m, n, density, small_int=True):
    A = sp.random_array((m, n), density=density, rng=rng, format="csr", dtype=np.float64)
    if small_int:
        A.data[:] = rng.integers(1, 9, A.nnz) * rng.choice([-1, 1], A.nnz)
    return A


def star(n_leaves):
    """Node 0 linked both ways to every other node: a hub of n_leaves neighbours."""
    n = n_leaves + 1
    leaves = np.arange(1, n)
    rows = np.concatenate((np.zeros(n_leaves, np.int64), leaves))
    cols = np.concatenate((leaves, np.zeros(n_leaves, np.int64)))
    return sp.csr_array((np.ones(2 * n_leaves), (rows, cols)), shape=(n, n))


def stars(n_hubs, n_leaves):
    """``n_hubs`` disjoint stars, each hub followed by its leaves."""
    return sp.csr_array(sp.block_diag([star(n_leaves)] * n_hubs, format="csr"))


def raw_with_duplicates(rng):
    """(data, indices, indptr), shape: unsorted indices, duplicates, explicit zeros."""
    n = 23
    indptr = [0]
    indices, data = [], []
    for r in range(n):
        k = int(rng.integers(0, 7))
        cols = list(rng.integers(0, n, k))
        if r % 3 == 0 and cols:
            cols += cols[:2]  # duplicates
        indices += cols
        data += list(rng.integers(-4, 5, len(cols)).astype(float))  # zeros included
        indptr.append(len(indices))
    return (np.array(data), np.array(indices, np.int32), np.array(indptr, np.int32)), (n, n)


def zoo(size="full"):
    """``{name: scipy csr_array}``; ``size="tiny"`` for the simulator."""
    rng = np.random.default_rng(12345)
    z = {
        "empty_0x0": sp.csr_array((0, 0)),
        "empty_5x3": sp.csr_array((5, 3)),
        "one": sp.csr_array(np.array([[3.0]])),
        "n17": _rand(rng, 17, 17, 0.2),
        "n33_isolated": sp.csr_array(np.diag(np.r_[np.zeros(10), np.arange(1, 24.0)])),
        "rect_5x40": _rand(rng, 5, 40, 0.3),
        "rect_40x5": _rand(rng, 40, 5, 0.3),
        "dense_window": _rand(rng, 20, 20, 1.0),
    }
    if size == "tiny":
        return z
    z.update(
        {
            "n16k1": _rand(rng, 16 * 20 + 1, 16 * 20 + 1, 0.03),
            "rect_1000x37": _rand(rng, 1000, 37, 0.05),
            "rect_37x1000": _rand(rng, 37, 1000, 0.05),
            "star_100k": star(100_000),
        }
    )
    return z


def sddmm_expected(A, Xa, Xb, multiply=False):
    """SDDMM of A's pattern in canonical (``tocsr``) order, computed in float64."""
    C = sp.csr_array(A, dtype=np.float64)
    C.sum_duplicates()
    rows = np.repeat(np.arange(C.shape[0]), np.diff(C.indptr))
    e = np.einsum("ij,ij->i", Xa[rows].astype(np.float64), Xb[C.indices].astype(np.float64))
    return e * C.data if multiply else e


def coop_units(win_ptr):
    """``(4 * windows, 4)`` int32 rows ``(window, first block, end block, -1)``: each window's blocks in 4 balanced
    parts (possibly empty), the units the one-CTA-per-window vector SpMM derives from the window pointers (its
    reference)."""
    wp = np.asarray(win_ptr, np.int64)
    start, nb = wp[:-1], wp[1:] - wp[:-1]
    j = np.arange(4, dtype=np.int64)
    lo = start[:, None] + j * nb[:, None] // 4
    hi = start[:, None] + (j + 1) * nb[:, None] // 4
    w = np.broadcast_to(np.arange(nb.shape[0], dtype=np.int64)[:, None], lo.shape)
    return np.stack([w, lo, hi, np.full(lo.shape, -1, np.int64)], axis=-1).reshape(-1, 4).astype(np.int32)
