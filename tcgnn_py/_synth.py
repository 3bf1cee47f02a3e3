"""Layer 0: synthetic graphs for tests and benchmarks."""

import numpy as np

__all__ = ["power_law_graph"]


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
    import scipy.sparse as sp

    if n_edges > n_nodes * n_nodes:
        raise ValueError(f"{n_edges} edges do not fit {n_nodes} nodes")
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
    A = sp.csr_array((np.ones(src.shape[0], np.float32), (src, dst)), shape=(n_nodes, n_nodes))
    A.sum_duplicates()
    A.data[:] = 1.0
    A.indices = A.indices.astype(np.int32)
    A.indptr = A.indptr.astype(np.int32)
    return A
