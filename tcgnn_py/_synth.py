"""Layer 0: synthetic graphs for tests and benchmarks."""

import numpy as np

from ._validation import check_count

__all__ = ["power_law_graph", "uniform_graph", "banded_graph"]


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
