"""Layer 4: neighbor-sampled blocks (GraphSAGE's mini-batches) and the GraphSAGE layer on them.

A batch of seed nodes is trained on the nodes its model can see: hop ``h`` draws at most ``fanouts[h]``
neighbors of every node of hop ``h - 1`` (uniform, without replacement; PyG's ``NeighborLoader`` and DGL's
``sample_neighbors``), and each hop is a bipartite :class:`Block`: a row per destination node, a column per
source node, the destinations first among the sources (DGL's convention: a layer reads its destinations'
own features as ``H_src[:n_dst]``).  The blocks come input layer first, as a model applies them.

Sampling is seeded and counter-based: draw ``t`` of node ``v`` is a hash of ``(key, v, t)``
(:mod:`tcgnn_py.sampling`), so the GPU kernel and its host reference give the same neighbors.
"""

import concurrent.futures

import numpy as np

from .._device import array_module, get_cupy, use_gpu
from .._tiled import TiledMatrix, spmm
from .._validation import check_bool, check_count, coerce_csr
from ..sampling import GOLDEN, Relabel, sample_hops, splitmix64
from ._edges import RowEdges
from ._layers import column_sums, dropout as drop, mm, relu
from ._models import glorot

__all__ = ["Block", "sample_blocks", "NeighborLoader", "sage_init", "sage_conv", "sage_apply"]

class Block:
    """One hop of a sampled batch: ``adj`` (``n_dst x n_src``, each row the mean over its sampled neighbors:
    ``1 / count`` on its entries; a :class:`~tcgnn_py.TiledMatrix`, made on first use, or a scipy / cupyx CSR
    matrix where sampled with ``format="csr"``), ``src`` (the global ids of its source nodes, the destinations
    first) and ``n_dst``.  ``matmat(X)`` is ``adj @ X``, what a layer's forward multiplies by; ``adj_t`` is
    ``adj``'s transpose, and ``rmatmat(X)`` its product ``adj.T @ X``, what a layer's backward multiplies by."""

    __slots__ = ("_adj", "src", "n_dst", "shape", "_layout", "_csr", "_adj_t")

    def __init__(self, adj, src, n_dst, csr=None, layout=None):
        self._adj, self.src, self.n_dst = adj, src, n_dst
        self.shape = tuple((adj if adj is not None else csr).shape)
        self._layout, self._csr, self._adj_t = layout, csr, None

    @property
    def adj(self):
        """The block's matrix.  A block sampled as ``"tiled"`` translates it from its sampled entries on first use:
        its layers multiply by those entries' CSR (:meth:`matmat`), so a training step never translates it."""
        if self._adj is None:
            c = self._csr
            self._adj = TiledMatrix((c.values, c.cols, c.indptr), shape=self.shape, layout=self._layout,
                                    device=self._device())
        return self._adj

    def _device(self):
        return "cpu" if self._csr.xp is np else "cuda"

    @property
    def nnz(self):
        """The sampled entries' count (a tiled block's from its entries: reading it translates nothing)."""
        return int(self._csr.cols.shape[0] if self._adj is None else self._adj.nnz)

    @property
    def dst(self):
        """The destination nodes' global ids (the first ``n_dst`` sources)."""
        return self.src[:self.n_dst]

    @property
    def adj_t(self):
        """``adj``'s transpose (``n_src x n_dst``), made on first use.  A tiled block built from its sampled entries
        makes it from them -- the transpose's CSR (:meth:`RowEdges.transpose`) and one translation -- rather than
        from the tiling (whose transpose first recovers every entry's row and column, then sorts and translates):
        the same matrix, translated from the same CSR."""
        if self._adj_t is None:
            if self._csr is None:
                self._adj_t = self.adj.T
            else:
                self._adj_t = TiledMatrix(self._csr.transpose(), shape=self.shape[::-1], layout=self._layout,
                                          device=self._device())
        return self._adj_t

    def matmat(self, X):
        """``adj @ X`` (``X`` with a row per source node; scipy's ``LinearOperator.matmat``), what a layer's forward
        multiplies by.  A tiled block built from its sampled entries multiplies by their CSR in one launch of the
        CSR kernel (:class:`RowEdges`; its rows hold at most the fan-out's entries): a block serves a step's few
        products, and its translation into tiles and its first product's plan would cost several times the
        product.  Otherwise, and for X the kernel does not take, the product by :attr:`adj`."""
        if X.ndim != 2 or X.shape[0] != self.shape[1]:
            raise ValueError(f"X must have shape ({self.shape[1]}, d) (one row per source node), got {X.shape}")
        if self._takes(X):
            return self._csr.spmm(X)
        return _product(self.adj, X)

    def rmatmat(self, X):
        """``adj.T @ X`` (``X`` with a row per destination node; scipy's ``LinearOperator.rmatmat``), what a
        layer's backward multiplies by.  A tiled block built from its sampled entries multiplies by its transpose's
        CSR (:meth:`RowEdges.transpose`) in one launch of the CSR kernel: the transpose is used once,
        and its translation into tiles and its first product would cost several times the product.  Otherwise,
        and for X the kernel does not take, the product by :attr:`adj_t`."""
        if X.ndim != 2 or X.shape[0] != self.n_dst:
            raise ValueError(f"X must have shape ({self.n_dst}, d) (one row per destination node), got {X.shape}")
        if self._takes(X):
            return self._csr.spmm_t(X)
        return _product(self.adj_t, X)

    def _takes(self, X):
        """Whether the entries' CSR multiplies X: X on the block's side, float32 or float64 on the GPU (the tiled
        products take 16-bit X, and raise the device error of X on the other side)."""
        c = self._csr
        return (c is not None and array_module(X) is c.xp
                and (c.xp is np or X.dtype in (np.float32, np.float64)))

    def __repr__(self):
        kind = "TiledMatrix" if self._adj is None else type(self._adj).__name__
        return f"Block(n_dst={self.n_dst}, n_src={self.shape[1]}, nnz={self.nnz}, {kind})"


def _product(A, X):
    """``A @ X`` for a block's matrix: the library's product on a tiled one, scipy's or cupyx's on a CSR one."""
    return spmm(A, X) if isinstance(A, TiledMatrix) else A @ X


class _Graph:
    """A graph to sample: ``indptr`` int64, ``indices`` int32, ``n`` nodes, on one side, with its relabelling map
    (made at its first batch, kept for the next ones)."""

    __slots__ = ("indptr", "indices", "n", "_relabel")

    def __init__(self, indptr, indices, n):
        self.indptr, self.indices, self.n, self._relabel = indptr, indices, n, None

    def relabel(self):
        if self._relabel is None:
            self._relabel = Relabel(self.n, array_module(self.indptr))
        return self._relabel


def _graph(A, device):
    """The :class:`_Graph` of a square sparse matrix, on ``device``'s side."""
    import scipy.sparse as sp

    if isinstance(A, _Graph):  # (an earlier _graph: kept as it is)
        return A
    _, indices, indptr, shape = coerce_csr(A if not sp.issparse(A) else sp.csr_array(A))
    if shape[0] != shape[1]:
        raise ValueError(f"A must be square (a graph to sample), got shape {shape}")
    xp = array_module(indptr)
    if device is not None and use_gpu(device) != (xp is not np):  # (use_gpu: the device's name checked)
        xp = get_cupy() if device == "cuda" else np
        indptr = xp.asarray(indptr) if xp is not np else get_cupy().asnumpy(indptr)
        indices = xp.asarray(indices) if xp is not np else get_cupy().asnumpy(indices)
    indptr, indices = xp.asarray(indptr, np.int64), xp.asarray(indices)
    _check_graph(xp, indptr, indices, shape[0])
    return _Graph(indptr, indices.astype(np.int32, copy=False), shape[0])


def _check_graph(xp, indptr, indices, n):
    """scipy's full check of a graph's CSR arrays, in its words, once per graph (a loader's, or each call's
    matrix): the sampler's kernel reads ``indices[indptr[v]:indptr[v + 1]]`` and its map has ``n`` slots, so an
    entry out of range would be read or written past them."""
    if indptr.shape[0] != n + 1:
        raise ValueError(f"index pointer size {indptr.shape[0]} should be {n + 1}")
    first, last = (int(v) for v in (indptr[0], indptr[-1]))  # synchronize!
    if first != 0:
        raise ValueError("index pointer should start with 0")
    if last > indices.shape[0]:
        raise ValueError("Last value of index pointer should be less than the size of index and data arrays")
    if n and bool(xp.any(indptr[1:] < indptr[:-1])):  # synchronize!
        raise ValueError("indptr must be a non-decreasing sequence")
    if last:
        lo, hi = (int(v) for v in (indices[:last].min(), indices[:last].max()))  # synchronize!
        if hi >= n:
            raise ValueError(f"indices must be < {n}")
        if lo < 0:
            raise ValueError("indices must be >= 0")


def _fanouts(fanouts):
    fanouts = [fanouts] if isinstance(fanouts, (int, np.integer)) else list(fanouts)
    if not fanouts or any(not isinstance(k, (int, np.integer)) or isinstance(k, bool) or (k < 1 and k != -1)
                          for k in fanouts):
        raise ValueError(f"fanouts must be a non-empty list of positive ints (-1: every neighbor), got {fanouts!r}")
    return [int(k) for k in fanouts]


def _key(seed, hop):
    """The sampler's key of ``hop`` for ``seed`` (any Python int): splitmix64 of both."""
    return splitmix64(int(seed) * 0x100000001B3 + (hop + 1) * GOLDEN)


def sample_blocks(A, seeds, fanouts, *, seed=0, device=None, layout=None, format="tiled"):
    """The blocks of a batch: hop ``h`` samples at most ``fanouts[h]`` neighbors (-1: all) of each node the hop
    before reached (the seeds first); returned input layer first (``blocks[-1].dst`` are the seeds).

    Parameters
    ----------
    A : sparse array or matrix (scipy or cupyx), or ``(data, indices, indptr)``
        The graph, square; row ``v`` lists the nodes ``v`` aggregates from.  Sampling runs where its arrays are
        (or on ``device``).
    seeds : array of int
        Distinct node ids, in ``[0, n)`` (NumPy or CuPy; CuPy seeds are checked on the device, two reads back).
    fanouts : int or list of int
    seed : int
        The sampler's seed: the same seed draws the same blocks, on the host and on the GPU.
    layout : str, optional
        The blocks' :class:`~tcgnn_py.TiledMatrix` layout.
    format : {"tiled", "csr"}
        The blocks' matrices: :class:`~tcgnn_py.TiledMatrix` (the library's products), or CSR (scipy's
        ``csr_array`` on the host, cupyx's ``csr_matrix`` on the GPU: the same blocks for products of those
        libraries).

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> A = sp.csr_array(np.ones((4, 4)) - np.eye(4))
    >>> blocks = tg.nn.sample_blocks(A, [0], [2, -1], seed=1, device="cpu")
    >>> [(b.n_dst, b.adj.shape[1]) for b in blocks], blocks[-1].dst.tolist()
    ([(3, 4), (1, 3)], [0])
    """
    _check_format(format)
    seed = check_count("seed", seed, minimum=None)
    graph = _graph(A, device)
    indptr, indices, n = graph.indptr, graph.indices, graph.n
    xp = array_module(indptr)
    fanouts = _fanouts(fanouts)
    given = np.asarray(seeds) if xp is np or array_module(seeds) is np else seeds
    if given.ndim != 1 or not (given.dtype.kind in "iu" or given.size == 0):
        raise ValueError(f"seeds must be a 1-D array of node ids, got shape {given.shape} and dtype {given.dtype}")
    if given.size:
        # one sort gives the range and the repeats (a hash-based unique of a batch costs several sorts)
        s = array_module(given).sort(given)
        lo, hi = int(s[0]), int(s[-1])  # synchronize! (device seeds: a kernel would read past indptr)
        if lo < 0 or hi >= n:
            raise ValueError(f"seeds must be node ids in [0, {n}), got ids from {lo} to {hi}")
        if bool((s[1:] == s[:-1]).any()):  # synchronize!
            raise ValueError("seeds must be distinct node ids")
    nodes = xp.asarray(given, np.int64)
    # each row's columns ascending: a canonical CSR, which the translation takes as it is (unsorted rows cost a
    # failed pass and a sort inside it)
    sampled = sample_hops(indptr, indices, nodes, fanouts, [_key(seed, h) for h in range(len(fanouts))],
                          graph.relabel())
    hops = []
    for src, ptr, local, rows, values in sampled:
        shape = (nodes.shape[0], src.shape[0])
        if format == "csr":
            hops.append(Block(_csr(xp, values, local, ptr, shape), src, int(nodes.shape[0])))
        else:
            # the CSR kernel's arrays (int32 on the device), and the translation's without a read back before its
            # own; the tiled matrix made if asked for (the layers multiply by the entries' CSR, and adj_t is made
            # from them)
            csr = RowEdges((values, local, ptr), shape, rows=rows, check=False)  # (the sampler's own CSR)
            hops.append(Block(None, src, int(nodes.shape[0]), csr, layout))
        nodes = src
    return hops[::-1]


def _check_format(format):
    if format not in ("tiled", "csr"):
        raise ValueError(f"format must be 'tiled' or 'csr', got {format!r}")


def _csr(xp, values, indices, indptr, shape):
    if xp is np:
        import scipy.sparse as sp

        return sp.csr_array((values, indices, indptr), shape=shape)
    import cupyx.scipy.sparse as csp

    return csp.csr_matrix((values, indices, indptr), shape=shape)


class NeighborLoader:
    """Batches of ``nodes`` (shuffled per epoch, seeded) with their :func:`sample_blocks`: iterate for
    ``(seeds, blocks)``; ``len`` is the batches per epoch.

    ``prefetch``: sample batch k+1 on a worker thread while batch k is used (on the GPU the worker issues to its
    own thread's current stream, CuPy's default: the batches' kernels stay in order with the training's).  It pays
    where a step waits on the GPU; where a step's time is the interpreter's own (small blocks, whose kernels take
    microseconds), the worker shares the interpreter's lock with the step and costs more than it overlaps.
    Epoch ``e`` batch ``b`` samples with seed ``(seed, e, b)``: a run is reproducible."""

    def __init__(self, A, nodes, fanouts, batch_size, *, shuffle=True, seed=0, device=None, layout=None,
                 prefetch=False, format="tiled"):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        _check_format(format)
        shuffle, prefetch = check_bool("shuffle", shuffle), check_bool("prefetch", prefetch)
        self.seed = check_count("seed", seed, minimum=None)
        self._device = "cuda" if use_gpu(device) else "cpu"
        self._graph = _graph(A, self._device)
        self.fanouts = _fanouts(fanouts)
        nodes = np.asarray(nodes if array_module(nodes) is np else get_cupy().asnumpy(nodes))
        n = self._graph.n
        if nodes.ndim != 1 or not (nodes.dtype.kind in "iu" or nodes.size == 0):  # (a float id would be truncated)
            raise ValueError(f"nodes must be a 1-D array of node ids, got shape {nodes.shape} and dtype {nodes.dtype}")
        if nodes.size and (nodes.min() < 0 or nodes.max() >= n):
            raise ValueError(f"nodes must be a 1-D array of node ids in [0, {n})")
        self.nodes, self.batch_size, self.shuffle = nodes.astype(np.int64), int(batch_size), shuffle
        self.layout, self.prefetch, self.format, self.epoch = layout, prefetch, format, 0

    def __len__(self):
        return -(-len(self.nodes) // self.batch_size)

    def sample(self, seeds, seed=0):
        """:func:`sample_blocks` of ``seeds`` on this loader's graph (moved to its device once), fan-outs, layout
        and format."""
        return sample_blocks(self._graph, seeds, self.fanouts, seed=seed, layout=self.layout, format=self.format)

    def _batch(self, epoch, b, seeds):
        return seeds, self.sample(seeds, (int(self.seed) * 1_000_003 + epoch) * 1_000_003 + b)

    def __iter__(self):
        epoch, self.epoch = self.epoch, self.epoch + 1
        order = np.random.default_rng((self.seed, epoch)).permutation(self.nodes) if self.shuffle else self.nodes
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if not self.prefetch:
            for b, seeds in enumerate(batches):
                yield self._batch(epoch, b, seeds)
            return
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            nxt = pool.submit(self._batch, epoch, 0, batches[0]) if batches else None
            for b in range(len(batches)):
                cur = nxt.result()
                nxt = pool.submit(self._batch, epoch, b + 1, batches[b + 1]) if b + 1 < len(batches) else None
                yield cur


def sage_init(dims, rng, dtype=np.float32):
    """Parameters ``W_self{i}, W_neigh{i}, b{i}`` of a GraphSAGE model with layer widths ``dims`` (Glorot weights,
    zero biases), on the generator's device."""
    if len(dims) < 2:
        raise ValueError(f"dims must be (features, ..., classes): at least two widths, got {tuple(dims)}")
    xp = np if isinstance(rng, np.random.Generator) else get_cupy()
    params = {}
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
        params[f"W_self{i}"] = glorot((d_in, d_out), rng, dtype)
        params[f"W_neigh{i}"] = glorot((d_in, d_out), rng, dtype)
        params[f"b{i}"] = xp.zeros(d_out, dtype=dtype)
    return params


def sage_conv(block, H, W_self, W_neigh, b=None):
    """GraphSAGE with the mean aggregator (Hamilton et al. 2017; PyG's ``SAGEConv``): ``out = H_dst W_self +
    mean_{j in N(i)} h_j W_neigh + b`` over a :class:`Block` (``H`` the source nodes' features, ``H_dst =
    H[:n_dst]``; the library's products on a tiled block, scipy's or cupyx's on a CSR one).  Returns
    ``(out, vjp)``, ``vjp(g) -> (dH, dW_self, dW_neigh, db)`` (``db`` None without ``b``);
    ``vjp(g, input_grad=False)`` leaves ``dH`` None, for an input that is data (the first hop's features): its
    product by the block's transpose, which would be made for it, is the backward's largest.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> A = sp.csr_array(np.array([[0, 1], [1, 0]], dtype=np.float32))
    >>> (block,) = tg.nn.sample_blocks(A, [0], [-1], device="cpu")
    >>> out, vjp = tg.nn.sage_conv(block, np.array([[1.0], [3.0]]), np.eye(1), 2 * np.eye(1))
    >>> out.tolist()
    [[7.0]]
    """
    if not isinstance(block, Block):
        raise TypeError(f"sage_conv expects a Block (tcgnn_py.nn.sample_blocks), got {type(block).__name__}")
    n_src, n_dst = block.shape[1], block.n_dst
    if H.ndim != 2 or H.shape[0] != n_src:
        raise ValueError(f"sage_conv: H must have shape ({n_src}, f) (one row per source node), got {H.shape}")
    for name, W in (("W_self", W_self), ("W_neigh", W_neigh)):
        if W.ndim != 2 or W.shape[0] != H.shape[1]:
            raise ValueError(f"sage_conv: {name} must have shape ({H.shape[1]}, d), got {W.shape}")
    agg = block.matmat(H)
    # (the layers' dense products: on the GPU bound launches that every batch's row count shares)
    out = mm(H[:n_dst], W_self, b)
    out += mm(agg, W_neigh)

    def vjp(g, input_grad=True):
        dH = None
        if input_grad:
            dH = block.rmatmat(mm(g, W_neigh.T))
            dH = dH.astype(H.dtype, copy=False)
            dH[:n_dst] += mm(g, W_self.T)
        return dH, mm(H[:n_dst].T, g), mm(agg.T, g), None if b is None else column_sums(g)

    return out, vjp


def sage_apply(params, blocks, H, *, p=0.0, rng=None, training=True):
    """A GraphSAGE model (:func:`sage_init`'s parameters) over a batch's blocks, input hop first: :func:`sage_conv`
    per block, ReLU and dropout of rate ``p`` between them (drawn from ``rng`` where ``training``).

    ``H`` holds the first block's sources' features (``X[blocks[0].src]``).  Returns ``(logits, vjp)``: the
    logits of the last block's destinations (the batch's seeds), and ``vjp(g) -> grads`` by parameter name.
    """
    layers = sum(1 for name in params if name.startswith("W_self"))
    if layers != len(blocks):
        raise ValueError(f"sage_apply: the parameters have {layers} layers, the batch {len(blocks)} blocks")
    tape = []
    h = H
    for i, block in enumerate(blocks):
        h, vjp = sage_conv(block, h, params[f"W_self{i}"], params[f"W_neigh{i}"], params.get(f"b{i}"))
        tape.append(vjp)
        if i + 1 < len(blocks):
            h, relu_vjp = relu(h)
            h, drop_vjp = drop(h, p, rng, training=training) if p else (h, None)
            tape.append((relu_vjp, drop_vjp))

    def vjp(g):
        grads = {}
        for i in range(len(blocks) - 1, -1, -1):
            g, grads[f"W_self{i}"], grads[f"W_neigh{i}"], grads[f"b{i}"] = tape.pop()(g, input_grad=i > 0)
            if i:
                relu_vjp, drop_vjp = tape.pop()
                g = relu_vjp(g if drop_vjp is None else drop_vjp(g))
        return grads

    return h, vjp
