"""Layer 0: synthetic graphs for tests and benchmarks."""

import numpy as np

from ._validation import check_count

__all__ = ["power_law_graph", "uniform_graph", "banded_graph", "planted_partition_graph", "planted_partition_csr"]


def power_law_graph(n_nodes, n_edges, exponent=2.1, seed=0, symmetric=False):
    """A Chung-Lu style graph with power-law degrees, as a binary ``csr_array``.

    Both endpoints of each edge follow weights ``w_i ~ (i + 1) ** (-1 / (exponent - 1))``;
    node ids are shuffled so hubs are scattered.  Repeated pairs are redrawn, so the
    result has exactly ``n_edges`` stored entries (``<= 2 * n_edges`` if ``symmetric``).

    Examples
    --------
    >>> import tcgnn_py as tg
    >>> A = tg.power_law_graph(1000, 5000, seed=1)
    >>> A.shape, A.nnz, A.has_canonical_format
    ((1000, 1000), 5000, True)
    """
    n_nodes = check_count("n_nodes", n_nodes, minimum=1)
    n_edges = check_count("n_edges", n_edges, minimum=0)
    if n_edges > n_nodes * n_nodes:
        raise ValueError(f"n_edges: {n_edges} edges do not fit {n_nodes} nodes")
    if not exponent > 1:
        raise ValueError(f"exponent must be > 1, got {exponent!r}")
    rng = np.random.default_rng(seed)
    w = (np.arange(1, n_nodes + 1, dtype=np.float64)) ** (-1.0 / (exponent - 1.0))
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    relabel = rng.permutation(n_nodes).astype(np.int64)

    def draw(k):
        ends = np.searchsorted(cdf, rng.random((2, k)), side="right").clip(max=n_nodes - 1)
        return relabel[ends[0]] * n_nodes + relabel[ends[1]]

    keys = np.unique(draw(n_edges + n_edges // 4))
    while keys.shape[0] < n_edges:
        keys = np.unique(np.concatenate((keys, draw(2 * (n_edges - keys.shape[0]) + 16))))
    keys = np.sort(keys[rng.permutation(keys.shape[0])[:n_edges]])
    src, dst = keys // n_nodes, keys % n_nodes
    if symmetric:
        src, dst = np.concatenate((src, dst)), np.concatenate((dst, src))
    return _binary_csr(src, dst, n_nodes)


def _binary_csr(src, dst, n_nodes):
    import scipy.sparse as sp

    A = sp.csr_array((np.ones(src.shape[0], np.float32), (src, dst)), shape=(n_nodes, n_nodes))
    A.sum_duplicates()
    A.data[:] = 1.0
    A.indices = A.indices.astype(np.int32)
    A.indptr = A.indptr.astype(np.int32)
    return A


def uniform_graph(n_nodes, n_edges, seed=0):
    """A uniform random (Erdos-Renyi style) binary graph with exactly ``n_edges`` entries.

    Examples
    --------
    >>> from tcgnn_py._synth import uniform_graph
    >>> A = uniform_graph(1000, 5000, seed=1)
    >>> A.shape, A.nnz
    ((1000, 1000), 5000)
    """
    n_nodes = check_count("n_nodes", n_nodes, minimum=1)
    n_edges = check_count("n_edges", n_edges, minimum=0)
    if n_edges > n_nodes * n_nodes:
        raise ValueError(f"n_edges: {n_edges} edges do not fit {n_nodes} nodes")
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, n_nodes * n_nodes, n_edges + n_edges // 8 + 16, dtype=np.int64))
    while keys.shape[0] < n_edges:
        keys = np.unique(np.concatenate((keys, rng.integers(0, n_nodes * n_nodes, n_edges, dtype=np.int64))))
    keys = np.sort(rng.choice(keys, n_edges, replace=False))
    return _binary_csr(keys // n_nodes, keys % n_nodes, n_nodes)


def banded_graph(n_nodes, half_width):
    """Every node linked to the ``half_width`` nodes on each side and to itself (a band matrix).

    Examples
    --------
    >>> from tcgnn_py._synth import banded_graph
    >>> A = banded_graph(5, 1)
    >>> A.nnz, A.toarray()[0].tolist()
    (13, [1.0, 1.0, 0.0, 0.0, 0.0])
    """
    offsets = np.arange(-half_width, half_width + 1, dtype=np.int64)
    src = np.repeat(np.arange(n_nodes, dtype=np.int64), offsets.shape[0])
    dst = src + np.tile(offsets, n_nodes)
    keep = (dst >= 0) & (dst < n_nodes)
    return _binary_csr(src[keep], dst[keep], n_nodes)


def planted_partition_csr(xp, n_nodes, n_edges, communities, p_in=0.9, exponent=2.1, seed=0, shuffle=True):
    """``(data, indices, indptr)`` of :func:`planted_partition_graph` on ``xp`` (NumPy or CuPy): float32 ones,
    int32 columns, int64 row pointers, sorted and duplicate-free.  CuPy draws a 240M-edge graph in seconds
    (a different random stream from NumPy's: the same law, not the same graph)."""
    n, C = n_nodes, communities
    rs = xp.random.RandomState(seed)
    w = np.arange(1, n + 1, dtype=np.float64) ** (-1.0 / (exponent - 1.0))
    w = w[np.random.default_rng(seed).permutation(n)]  # hubs spread over the communities
    # On the host: a GPU's float scan may associate differently from run to run (CUB's look-back), and a
    # seeded graph must be the same on every rank and every run.
    cum = xp.asarray(np.cumsum(w))
    first = (xp.arange(C + 1, dtype=np.int64) * n) // C  # community c: nodes first[c]:first[c + 1] (unshuffled)
    base = xp.concatenate([xp.zeros(1), cum])[first]  # cumulative weight before each community
    relabel = xp.asarray(np.random.default_rng(seed + 1).permutation(n).astype(np.int64)) if shuffle else None

    def draw(k):
        u = xp.searchsorted(cum, rs.random_sample(k) * cum[-1], side="right").clip(max=n - 1)
        c = (u * C) // n
        lo, hi = base[c], base[c + 1]
        inside = rs.random_sample(k) < p_in
        r = rs.random_sample(k)
        t = xp.searchsorted(cum, xp.where(inside, lo + r * (hi - lo), r * cum[-1]), side="right").clip(max=n - 1)
        if relabel is not None:
            u, t = relabel[u], relabel[t]
        return u * n + t

    keys = xp.unique(draw(n_edges + n_edges // 4 + 16))
    while keys.shape[0] < n_edges:
        keys = xp.unique(xp.concatenate((keys, draw(2 * (n_edges - int(keys.shape[0])) + 16))))
    keys = xp.sort(keys[rs.permutation(int(keys.shape[0]))[:n_edges]])
    src, dst = keys // n, (keys % n).astype(np.int32)
    del keys
    indptr = xp.searchsorted(src, xp.arange(n + 1, dtype=np.int64)).astype(np.int64)
    return xp.ones(dst.shape[0], np.float32), dst, indptr


def planted_partition_graph(n_nodes, n_edges, communities, p_in=0.9, exponent=2.1, seed=0, shuffle=True, device="cpu"):
    """A power-law graph with planted communities, as a binary ``csr_array``: the test of a partitioner.

    Nodes fall into ``communities`` groups of equal size; each edge's source follows power-law weights
    ``w_i ~ i ** (-1 / (exponent - 1))`` (hubs spread over the groups), and its target is drawn by weight
    within the source's group with probability ``p_in`` (else from the whole graph).  Node ids are shuffled
    (``shuffle``), so a row split of the natural order has no locality: a partitioner must find the groups.
    Exactly ``n_edges`` distinct directed entries.  One group (or ``p_in=0``) is a Chung-Lu power-law graph.
    ``device="cuda"`` draws it on the GPU (seconds for hundreds of millions of edges; another random stream,
    the same law) and returns a ``cupyx.scipy.sparse.csr_matrix``.

    Examples
    --------
    >>> import tcgnn_py as tg
    >>> A = tg.planted_partition_graph(2000, 16000, communities=8, seed=1)
    >>> A.shape, A.nnz
    ((2000, 2000), 16000)
    """
    import scipy.sparse as sp

    n_nodes = check_count("n_nodes", n_nodes, minimum=1)
    n_edges = check_count("n_edges", n_edges, minimum=0)
    communities = check_count("communities", communities, minimum=1)
    if communities > n_nodes:
        raise ValueError(f"communities: {communities} groups do not fit {n_nodes} nodes")
    if n_edges > n_nodes * n_nodes // communities:
        raise ValueError(f"n_edges: {n_edges} edges do not fit {n_nodes} nodes in {communities} groups")
    if not 0 <= p_in <= 1:
        raise ValueError(f"p_in must be in [0, 1], got {p_in!r}")
    if not exponent > 1:
        raise ValueError(f"exponent must be > 1, got {exponent!r}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r:.60}")
    if device == "cuda":
        import cupy
        import cupyx.scipy.sparse as csp

        arrays = planted_partition_csr(cupy, n_nodes, n_edges, communities, p_in, exponent, seed, shuffle)
        return csp.csr_matrix(arrays, shape=(n_nodes, n_nodes))
    data, indices, indptr = planted_partition_csr(np, n_nodes, n_edges, communities, p_in, exponent, seed, shuffle)
    return sp.csr_array((data, indices, indptr.astype(np.int32) if n_edges < 2**31 else indptr),
                        shape=(n_nodes, n_nodes))
