"""Layer 4: batches of small graphs -- one block-diagonal matrix, and per-graph readouts with their vjps.

Graph classification trains on many small graphs; a batch of them is one block-diagonal adjacency (PyG's
``Batch``, DGL's ``dgl.batch``), so every layer runs once per batch.  :func:`batch` joins graphs and keeps their
node offsets ``ptr`` (graph g owns nodes ``ptr[g]:ptr[g + 1]``, on the host: sizes are host facts); the
layers take the joined matrix (``gcn_norm(b.adj)``); :func:`readout` sums, averages or takes the maximum of each
graph's node features.  Sums and means are products with the pooling matrix (``P[g, i] = 1`` or ``1 / n_g`` for i
in g) in the data's precision, each sum in node order: on the GPU one launch of per-segment sums (a batch's
matrix is new every step), on the host the product (:func:`tcgnn_py.spmm`).  Their vjp is the transposed product,
which has one entry per node: each node's graph's gradient gathered (times ``1 / n_g`` for a mean, which is the
product with ``1 / n_g``: within a rounding of ``sum / n_g``).
A graph of no nodes reads out zeros.
"""

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from .._device import array_module
from .._tiled import TiledMatrix, spmm
from ..products import pointwise
from ._edges import floats

__all__ = ["GraphBatch", "batch", "readout", "READOUTS"]

#: The per-graph readouts :func:`readout` computes.
READOUTS = ("sum", "mean", "max")


class GraphBatch(NamedTuple):
    """Graphs joined into one: ``adj`` the block-diagonal adjacency (``scipy.sparse.csr_array``, or cupyx's
    ``csr_matrix`` for graphs on the GPU), ``ptr`` the node offsets (int64, ``n_graphs + 1``), ``graph`` each
    node's graph (int64, ``n_nodes``)."""

    adj: object
    ptr: np.ndarray
    graph: np.ndarray

    @property
    def n_graphs(self):
        return self.ptr.shape[0] - 1

    @property
    def sizes(self):
        """Nodes per graph."""
        return np.diff(self.ptr)


def batch(graphs):
    """Join square adjacency matrices into one block-diagonal graph, keeping where each graph's nodes are.

    Parameters
    ----------
    graphs : sequence of sparse arrays or matrices (or dense arrays), each square
        A graph of no nodes is allowed (its readout is zeros).  Where every graph is a cupyx sparse matrix (a
        dataset kept on the GPU), they are joined there and ``adj`` is a cupyx CSR matrix: nothing crosses to
        the host but their sizes.

    Returns
    -------
    GraphBatch
        ``adj`` (CSR, the first graph's nodes first), ``ptr`` and ``graph``.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> b = tg.nn.batch([sp.csr_array(np.ones((2, 2))), sp.csr_array((0, 0)), sp.csr_array(np.ones((1, 1)))])
    >>> b.adj.shape, b.ptr.tolist(), b.graph.tolist()
    ((3, 3), [0, 2, 2, 3], [0, 0, 2])
    """
    if isinstance(graphs, (str, bytes)) or not hasattr(graphs, "__len__"):
        raise TypeError(f"graphs must be a sequence of adjacency matrices, got {type(graphs).__name__}")
    if len(graphs) == 0:
        raise ValueError("graphs must hold at least one graph")
    on_device = all(type(g).__module__.startswith("cupyx.scipy.sparse") for g in graphs)
    blocks = []
    for i, g in enumerate(graphs):
        if isinstance(g, TiledMatrix):
            g = g.tocsr()
        if on_device:
            g = g.tocsr()
        elif not (sp.issparse(g) and g.format == "csr"):  # (a scipy CSR is read as it is: a batch joins dozens)
            try:
                g = sp.csr_array(g)
            except (TypeError, ValueError) as err:
                raise TypeError(f"graphs[{i}] must be an adjacency matrix (sparse, or a dense 2-D array), got "
                                f"{type(g).__name__}") from err
        if g.ndim != 2 or g.shape[0] != g.shape[1]:
            raise ValueError(f"graphs[{i}] must be a square adjacency matrix, got shape {g.shape}")
        blocks.append(g)
    sizes = np.array([g.shape[0] for g in blocks], np.int64)
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    graph = np.repeat(np.arange(len(blocks), dtype=np.int64), sizes)
    return GraphBatch(_join(blocks, ptr, on_device), ptr, graph)


def _join(blocks, ptr, on_device):
    """The block-diagonal CSR of CSR graphs (cupyx's, joined on the GPU: the sizes, host facts, are all the host
    reads; else scipy's), each graph's columns shifted by its first node and its row pointers by the entries
    before it -- one concatenation per array, where ``scipy.sparse.block_diag`` goes through COO."""
    if not on_device:
        return _join_host(blocks, ptr)
    import cupy as xp
    import cupyx.scipy.sparse as sparse

    make = sparse.csr_matrix
    nnz = np.concatenate([[0], np.cumsum([g.nnz for g in blocks])]).astype(np.int64)
    n = int(ptr[-1])
    if not nnz[-1]:
        return make((n, n), dtype=np.result_type(*[g.dtype for g in blocks]))
    indptr = xp.concatenate([g.indptr[:-1].astype(np.int64) + int(nnz[i]) for i, g in enumerate(blocks)]
                            + [xp.full(1, nnz[-1], np.int64)])
    indices = xp.concatenate([g.indices.astype(np.int32) + np.int32(ptr[i]) for i, g in enumerate(blocks)])
    data = xp.concatenate([g.data for g in blocks])
    return make((data, indices, indptr), shape=(n, n))


def _join_host(blocks, ptr):
    """:func:`_join` of scipy CSR graphs, the shifts added to all graphs at once (each graph's own NumPy calls would
    cost a batch of dozens of small graphs more than its entries do); each graph's arrays up to its last entry
    (``indptr[-1]``), as scipy reads them."""
    n, G = int(ptr[-1]), len(blocks)
    counts = np.fromiter((g.indptr[-1] for g in blocks), np.int64, G)
    nnz = np.concatenate([[0], np.cumsum(counts)])
    if not nnz[-1]:
        return sp.csr_array((n, n), dtype=np.result_type(*[g.dtype for g in blocks]))
    indices = np.concatenate([g.indices[:c] for g, c in zip(blocks, counts.tolist())])
    data = np.concatenate([g.data[:c] for g, c in zip(blocks, counts.tolist())])
    indices = indices.astype(np.int32) + np.repeat(ptr[:-1], counts).astype(np.int32)
    pointers = np.concatenate([g.indptr for g in blocks]).astype(np.int64)  # (each graph's n_g + 1 pointers)
    last = ptr[1:] + np.arange(G)  # (each graph's last pointer: its entries' end, the next graph's start)
    keep = np.ones(pointers.shape[0], bool)
    keep[last] = False
    indptr = np.empty(n + 1, np.int64)
    np.add(pointers[keep], np.repeat(nnz[:-1], np.diff(ptr)), out=indptr[:-1])
    indptr[-1] = nnz[-1]
    return sp.csr_array((data, indices, indptr), shape=(n, n))


def _check_ptr(ptr, n):
    ptr = np.asarray(ptr)
    if ptr.ndim != 1 or ptr.shape[0] < 2 or ptr.dtype.kind not in "iu":
        raise ValueError(f"ptr must be 1-D integer node offsets of at least one graph, got shape {ptr.shape} and "
                         f"dtype {ptr.dtype}")
    if ptr[0] != 0 or ptr[-1] != n or np.any(np.diff(ptr) < 0):
        raise ValueError(f"ptr must rise from 0 to the {n} rows of H, got {ptr[0]} ... {ptr[-1]}"
                         + (" (falling somewhere)" if np.any(np.diff(ptr) < 0) else ""))
    return ptr.astype(np.int64)


def _pooling(ptr, how, device, dtype):
    """``(P, values)``: the ``(n_graphs, n)`` pooling matrix of ``ptr`` as a TiledMatrix, and its values per node
    (host): ones, or ``1 / n_g`` for a mean."""
    sizes = np.diff(ptr)
    G, n = sizes.shape[0], int(ptr[-1])
    values = np.ones(n, dtype) if how == "sum" else np.repeat(1 / np.maximum(sizes, 1), sizes).astype(dtype)
    P = sp.csr_array((values, np.arange(n, dtype=np.int64), ptr), shape=(G, n))
    return TiledMatrix(P, dtype=dtype, device=device), values


def readout(H, ptr, how="sum"):
    """Each graph's node features summed, averaged or maxed: ``out[g] = reduce(H[ptr[g]:ptr[g + 1]])``.

    Parameters
    ----------
    H : array, shape (n, d)
        Node features of a batch (NumPy or CuPy, float32 or float64).
    ptr : array_like of int, shape (n_graphs + 1,)
        Node offsets (:attr:`GraphBatch.ptr`).
    how : {"sum", "mean", "max"}

    Returns
    -------
    out : array, shape (n_graphs, d)
        A graph of no nodes gives zeros (as PyG's readouts).
    vjp : callable
        ``vjp(g) -> dH``: the transposed pooling product; for ``max`` each output's gradient goes to the first
        node that holds the maximum (deterministic where several do).

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> H = np.array([[1.0], [3.0], [5.0]], dtype=np.float32)
    >>> [tg.nn.readout(H, [0, 2, 2, 3], how)[0].ravel().tolist() for how in ("sum", "mean", "max")]
    [[4.0, 0.0, 5.0], [2.0, 0.0, 5.0], [3.0, 0.0, 5.0]]
    """
    if how not in READOUTS:
        raise ValueError(f"how must be one of {READOUTS}, got {how!r}")
    H = floats(H, "H")
    if H.ndim != 2:
        raise ValueError(f"H must be 2-D (nodes x features), got shape {H.shape}")
    if H.dtype not in (np.float32, np.float64):
        raise TypeError(f"readout takes float32 or float64 features, got {H.dtype}")
    xp = array_module(H)
    n, d = H.shape
    ptr = _check_ptr(ptr, n)
    device = "cpu" if xp is np else "cuda"
    G = ptr.shape[0] - 1
    sizes = np.diff(ptr)
    graph_of = np.repeat(np.arange(G, dtype=np.int64), sizes)  # (host: uploaded where a vjp or max needs it)
    if how != "max":
        if xp is np:
            P, values = _pooling(ptr, how, device, H.dtype)
            out = spmm(P, np.ascontiguousarray(H), precision="fp32") if n else np.zeros((G, d), H.dtype)
        else:  # (the same sums, the pooling matrix's rows, in one launch: no matrix built per batch)
            scale = None if how == "sum" else (1 / np.maximum(sizes, 1)).astype(H.dtype)
            values = None if scale is None else np.repeat(scale, sizes)
            out = pointwise.segment_sum(xp.ascontiguousarray(H), xp.asarray(ptr),
                                        None if scale is None else xp.asarray(scale))

        def vjp(g):
            g = xp.asarray(g, dtype=H.dtype)
            if g.shape != (G, d):
                raise ValueError(f"g must have the output's shape {(G, d)}, got {g.shape}")
            # Pᵀ has one entry per node (its graph's): the transposed product is a gather, times the value of a mean
            # (one rounding, as the product's single term).
            dH = g[xp.asarray(graph_of)]
            return dH if how == "sum" else dH * xp.asarray(values)[:, None]

        return out, vjp
    graph = xp.asarray(graph_of)
    out = xp.full((G, d), -xp.inf, H.dtype)
    xp.maximum.at(out, graph, H)  # order-independent: deterministic
    out[xp.asarray(sizes == 0)] = 0
    # the first node of each graph that holds each column's maximum: the one the gradient goes to
    index = xp.where(H == out[graph], xp.arange(n, dtype=np.int64)[:, None], n)
    first = xp.full((G, d), n, np.int64)
    xp.minimum.at(first, graph, index)

    def vjp(g):
        g = xp.asarray(g, dtype=H.dtype)
        if g.shape != (G, d):
            raise ValueError(f"g must have the output's shape {(G, d)}, got {g.shape}")
        dH = xp.zeros((n + 1, d), H.dtype)  # (row n: the empty graphs' sink)
        dH[first, xp.arange(d)[None, :]] = g
        return dH[:n]

    return out, vjp

