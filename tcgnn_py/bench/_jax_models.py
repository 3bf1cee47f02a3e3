"""Layer 4 (bench): the harness's three models in pure JAX -- the baseline a JAX user would write.

GCN, AGNN and GAT as :func:`tcgnn_py.bench.train_step` trains them (the same widths, dropout, loss on the training
nodes and Adam with the same weight decay), the aggregation a ``jax.ops.segment_sum`` over the edges, the whole
step -- forward, loss, backward, Adam -- one ``jax.jit`` function, so XLA fuses and prunes it end to end.  They
need no PyTorch, so they live here; JAX (and optax, its optimizer library) load only when a model is built, and
the harness adds the column only where JAX is installed (:func:`available`).

JAX is told not to take most of the GPU's memory up front (``XLA_PYTHON_CLIENT_PREALLOCATE=false``, unless the
environment says otherwise): it shares the device with CuPy's pool in one process.
"""

import functools
import importlib.util
import os

import numpy as np

__all__ = ["available", "aggregations", "build", "forward", "graph_arrays", "init", "MODELS", "AGGREGATIONS"]

MODELS = ("gcn", "agnn", "gat")
#: The aggregations of the JAX models: ``jax.ops.segment_sum`` over the edges (what GNNs in JAX write), a
#: ``jax.experimental.sparse.BCOO`` product, or this library's products inside the jitted step (``tcgnn_py.jax``:
#: its product for GCN, its fused attention for AGNN and GAT).
AGGREGATIONS = ("segment_sum", "bcoo", "tcgnn")


def available():
    """Whether JAX and optax can be imported here (the harness's ``jax`` column needs both)."""
    return all(importlib.util.find_spec(m) is not None for m in ("jax", "optax"))


def _jax():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    return jax


def graph_arrays(adj, model):
    """``(rows, cols, weights, n)`` of the graph ``model`` runs on, as NumPy arrays in CSR order: Kipf & Welling's
    ``D^-1/2 (A + I) D^-1/2`` for GCN, ``A + I`` (the weights the attention's softmax carries) for AGNN and GAT --
    the same matrices as :func:`tcgnn_py.nn.gcn_norm` and :func:`tcgnn_py.nn.add_self_loops`."""
    import scipy.sparse as sp

    from .. import nn

    A = (nn.gcn_norm if model == "gcn" else nn.add_self_loops)(adj, dtype=np.float64, device="cpu")
    csr = sp.csr_array(A.tocsr())
    csr.sort_indices()
    rows = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
    return rows.astype(np.int32), csr.indices.astype(np.int32), csr.data.astype(np.float32), csr.shape[0]


def init(model, dims, seed=0, heads=8):
    """The parameters of ``model`` for ``dims = (features, hidden, classes)``, drawn as :mod:`tcgnn_py.nn` draws
    them (its ``*_init`` with a NumPy generator of ``seed``), as float32 NumPy arrays."""
    from .. import nn

    rng = np.random.default_rng(seed)
    if model == "gcn":
        return nn.gcn_init(dims, rng)
    if model == "agnn":
        return nn.agnn_init(dims, rng)
    return nn.gat_init(dims, rng, heads=heads)


def _softmax_rows(scores, rows, weights, n, rows_sorted=True):
    """Per entry, ``weights * exp(scores)`` normalised over its row (``scores`` ``(nnz, heads)``)."""
    jax = _jax()
    jnp = jax.numpy
    top = jax.ops.segment_max(scores, rows, num_segments=n, indices_are_sorted=rows_sorted)
    ex = weights[:, None] * jnp.exp(scores - top[rows])
    total = jax.ops.segment_sum(ex, rows, num_segments=n, indices_are_sorted=rows_sorted)
    return ex / total[rows]


def forward(model, params, graph, X, key=None, p=0.0, product=None, cosines=None, rows_sorted=True, attend=None,
            linear=None, gcn=None):
    """The logits of ``model`` (``params`` a dict of JAX arrays; ``graph`` :func:`graph_arrays` as JAX arrays)
    on features ``X``; dropout of rate ``p`` drawn from ``key`` (none where ``key`` is None).

    ``product(w, h)``: the aggregation ``sum_e w_e h_col(e)`` over each row's entries another way than
    ``segment_sum`` (:data:`AGGREGATIONS`; ``w`` the graph's ``weights`` or the attention, ``(nnz,)`` or
    ``(nnz, heads)`` for ``h`` of ``heads`` blocks of columns); ``cosines(hn)``: AGNN's ``<hn_row, hn_col>`` per
    entry another way than gathers; ``rows_sorted``: whether the graph's entries are in row order (CSR's; a tiled
    matrix's stored order is not); ``attend(V, heads, score, operands, p, key)``: AGNN's and GAT's whole attention
    (scores, softmax over each row's entries, dropout of rate ``p`` on it, aggregation) in one operation (this
    library's fused one), in place of those steps; ``linear(x, W, p, key)``: ``dropout(x) @ W`` in one operation
    (this library's, which reads x dropped), in place of a dropout and a product; ``gcn(x, W, b, p, key)``: a GCN
    layer of ``dropout(x)`` in one operation (this library's, whose product runs on the narrower side of ``W``)."""
    jax = _jax()
    jnp = jax.numpy
    rows, cols, weights, n = graph
    keys = iter(jax.random.split(key, 8)) if key is not None else None

    def drop(x):
        if keys is None or not p:
            return x
        return jnp.where(jax.random.bernoulli(next(keys), 1 - p, x.shape), x / (1 - p), 0)

    def lin(x, W):  # dropout(x) @ W
        if linear is None or keys is None or not p:
            return drop(x) @ W
        return linear(x, W, p, next(keys))

    def segments(w, h):  # sum over each row's entries of w_e h_col (w: (nnz,) or (nnz, heads))
        msg = (w[:, :, None] * h[cols].reshape(cols.shape[0], w.shape[1], -1)).reshape(cols.shape[0], -1) \
            if w.ndim == 2 else w[:, None] * h[cols]
        return jax.ops.segment_sum(msg, rows, num_segments=n, indices_are_sorted=rows_sorted)

    aggregate = segments if product is None else product
    if cosines is None:
        def cosines(hn):
            return jnp.sum(hn[rows] * hn[cols], axis=1)

    def conv(x, W, b):  # a GCN layer of dropout(x)
        if gcn is None:
            return aggregate(weights, lin(x, W)) + b
        dropping = keys is not None and p
        return gcn(x, W, b, p if dropping else 0.0, next(keys) if dropping else None)

    if model == "gcn":
        h = jax.nn.relu(conv(X, params["W0"], params["b0"]))
        return conv(h, params["W1"], params["b1"])
    if model == "agnn":
        h = jax.nn.relu(lin(X, params["W_in"]) + params["b_in"])
        betas = [jnp.ones(1, h.dtype)] + [params[f"beta{k}"] for k in range(1, 1 + sum(k.startswith("beta")
                                                                                    for k in params))]
        for beta in betas:
            hn = h / jnp.maximum(jnp.linalg.norm(h, axis=1, keepdims=True), 1e-12)
            if attend is not None:
                h = attend(h, 1, "cosine", dict(Q=hn, K=hn, beta=jnp.reshape(beta, (1,))), 0.0, None)
                continue
            cos = cosines(hn)[:, None]
            h = aggregate(_softmax_rows(beta * cos, rows, weights, n, rows_sorted)[:, 0], h)
        return lin(h, params["W_out"]) + params["b_out"]

    def gat(hW, a_src, a_dst, heads):  # (hW: the layer's input times its weight)
        wh = hW.reshape(n, heads, -1)
        s_src, s_dst = jnp.sum(wh * a_src, axis=2), jnp.sum(wh * a_dst, axis=2)  # (n, heads)
        if attend is not None:
            dropping = keys is not None and p
            return attend(wh.reshape(n, -1), heads, "additive", dict(s_src=s_src, s_dst=s_dst, negative_slope=0.2),
                          p if dropping else 0.0, next(keys) if dropping else None)
        att = drop(_softmax_rows(jax.nn.leaky_relu(s_src[cols] + s_dst[rows], 0.2), rows, weights, n, rows_sorted))
        return aggregate(att, wh.reshape(n, -1))

    heads = params["a_src1"].shape[0]
    h = jax.nn.elu(gat(lin(X, params["W1"]), params["a_src1"], params["a_dst1"], heads) + params["b1"])
    return gat(lin(h, params["W2"]), params["a_src2"], params["a_dst2"], 1) + params["b2"]


def aggregations(adj, model, aggregation, T=None):
    """``(graph, product, cosines, attend, linear, gcn)`` for :func:`forward`: the graph's arrays (JAX arrays; in
    ``T``'s stored order for this library's products, ``T`` the model's matrix as :mod:`tcgnn_py.nn` makes it) and
    the aggregation's functions (None: segment operations, JAX's dropout and GEMM; ``attend``: this library's
    fused attention; ``linear``: its dropped product; ``gcn``: its GCN layer)."""
    jax = _jax()
    jnp = jax.numpy
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if aggregation == "tcgnn":
        from ..jax import entries, gcn_conv, graph_attention, linear, sddmm, spmm

        rows, cols = entries(T)
        weights = np.asarray(T.values if T.device == "cpu" else T.values.get(), np.float32)
        graph = (jnp.asarray(rows), jnp.asarray(cols), jnp.asarray(weights), T.shape[0])

        def product(w, h):
            return _per_head(jnp, w, h, lambda wk, hk: spmm(T, hk, values=wk))

        def attend(V, heads, score, operands, p, key):
            return graph_attention(T, V, heads=heads, score=score, dropout=p, key=key, **operands)

        def dropped(x, W, p, key):
            return linear(x, W, dropout=p, key=key)

        def conv(x, W, b, p, key):
            return gcn_conv(T, x, W, b, dropout=p, key=key)

        return graph, product, lambda hn: sddmm(T, hn), attend, dropped, conv
    rows, cols, weights, n = graph_arrays(adj, model)
    graph = (jnp.asarray(rows), jnp.asarray(cols), jnp.asarray(weights), n)
    if aggregation == "segment_sum":
        return graph, None, None, None, None, None
    from jax.experimental import sparse

    index = jnp.stack([graph[0], graph[1]], axis=1)

    def product(w, h):
        return _per_head(jnp, w, h, lambda wk, hk: sparse.BCOO((wk, index), shape=(n, n), indices_sorted=True) @ hk)

    return graph, product, None, None, None, None


def _per_head(jnp, w, h, aggregate):
    """``aggregate(w_k, h_k)`` per head (``w`` ``(nnz,)``: one head; ``(nnz, heads)``: ``h``'s columns in as many
    blocks), the heads side by side."""
    if w.ndim == 1:
        return aggregate(w, h)
    heads = w.shape[1]
    D = h.shape[1] // heads
    return jnp.concatenate([aggregate(w[:, k], h[:, k * D:(k + 1) * D]) for k in range(heads)], axis=1)


def build(problem, model, hidden=16, gat=(8, 8), aggregation="segment_sum"):
    """``(step, sync)`` of one jitted training step of ``model`` on the harness's ``problem``
    (:func:`tcgnn_py.bench.gnn_problem`), as :func:`tcgnn_py.bench.bench_gnn`'s ``extra`` takes it (which
    passes its ``hidden`` width and GAT's ``(heads, hidden)``); ``step.loss()`` is the training loss without
    dropout.  ``aggregation``: one of :data:`AGGREGATIONS` (:func:`aggregations`)."""
    jax = _jax()
    jnp = jax.numpy
    X = jnp.asarray(problem["X"])
    labels, idx = jnp.asarray(problem["labels"]), jnp.asarray(problem["train_idx"])
    T = None
    if aggregation == "tcgnn":
        from .. import nn

        # (on the GPU where the harness runs there, as the other columns)
        T = (nn.gcn_norm if model == "gcn" else nn.add_self_loops)(problem["adj"])
    graph, product, cosines, attend, linear, gcn = aggregations(problem["adj"], model, aggregation, T)
    import optax

    c = problem["n_classes"]
    if model == "gcn":
        params, lr, p, decayed = init(model, (X.shape[1], hidden, c)), 0.01, 0.5, {"W0", "b0"}
    elif model == "agnn":
        params, lr, p, decayed = init(model, (X.shape[1], hidden, c)), 0.01, 0.5, None
    else:
        params, lr, p, decayed = init(model, (X.shape[1], gat[1], c), heads=gat[0]), 0.005, 0.6, None
    params = {k: jnp.asarray(v) for k, v in params.items()}
    mask = None if decayed is None else {k: k in decayed for k in params}
    tx = optax.chain(optax.add_decayed_weights(5e-4, mask), optax.adam(lr))  # L2 in the gradient, as nn.Adam

    # The features, labels and the graph's arrays are arguments of the step, not constants it closes over: XLA
    # compiles a closed-over array into the program (tens of seconds for facebook_pagepage's dense features).
    data = (X, labels, idx, graph[:3])

    def loss(params, key, data):
        X, labels, idx, arrays = data
        logits = forward(model, params, (*arrays, graph[3]), X, key, p, product, cosines, aggregation != "tcgnn",
                         attend, linear, gcn)
        return optax.softmax_cross_entropy_with_integer_labels(logits[idx], labels[idx]).mean()

    # The parameters, Adam's state and the key are donated, as a JAX training step is written for speed: their
    # buffers are reused for the step's results, so each call finds its buffers where the last left them and XLA
    # replays its command buffers as recorded, with no update of their buffer addresses on the host.
    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def step(params, state, key, data):
        key, sub = jax.random.split(key)
        grads = jax.grad(loss)(params, sub, data)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, key

    carry = [params, tx.init(params), jax.random.key(0)]

    def run():
        carry[:] = step(*carry, data)

    run.loss = lambda: float(loss(carry[0], None, data))  # the training loss without dropout, for checks
    return run, lambda: jax.block_until_ready(carry)
