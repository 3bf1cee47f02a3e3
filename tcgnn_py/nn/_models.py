"""Layer 4: the two models of the papers, as ``init`` / ``apply`` function pairs.

``*_init(dims, rng)`` returns a dict of parameters on the device of ``rng``
(``numpy.random.default_rng`` or ``cupy.random.default_rng``); ``*_apply``
returns ``(logits, vjp)`` with ``vjp(dlogits) -> grads`` (a dict with the
parameters' names), ready for :class:`Adam`.
"""

import numpy as np

from .._device import array_module, get_cupy
from .._tiled import TiledMatrix
from .._validation import as_dtype, check_bool, check_count, is_half
from ._edges import array_on, edges_of, features_on
from ._attention import agnn_conv, gat_conv
from ._layers import bias_act_dropout, dropout, gcn_conv, linear, probability

__all__ = ["default_rng", "glorot", "gcn_init", "gcn_apply", "agnn_init", "agnn_apply"]


def _xp_of(rng):
    """NumPy for a ``numpy.random.Generator``, CuPy for a ``cupy.random.Generator``."""
    if isinstance(rng, np.random.Generator):
        return np
    if type(rng).__module__.startswith("cupy"):
        return get_cupy()
    raise TypeError(f"rng must be a numpy or cupy random Generator, got {type(rng).__name__}")


def default_rng(seed=None, *, like=None):
    """A random Generator on the device of ``like``: CuPy's for the GPU, NumPy's otherwise.

    ``like`` is a TiledMatrix or an array; parameters from :func:`gcn_init`
    and dropout masks then live where the graph does.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> A = tg.nn.gcn_norm(sp.csr_array(np.eye(3)))
    >>> rng = tg.nn.default_rng(0, like=A)
    >>> type(rng).__module__.split(".")[0] == ("numpy" if A.device == "cpu" else "cupy")
    True
    """
    on_device = like.device == "cuda" if isinstance(like, TiledMatrix) else array_module(like) is not np
    return get_cupy().random.default_rng(seed) if on_device else np.random.default_rng(seed)


def glorot(shape, rng, dtype=np.float32):
    """Glorot/Xavier uniform initialisation, ``U(-a, a)`` with ``a = sqrt(6 / (fan_in + fan_out))``.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> W = tg.nn.glorot((30, 10), np.random.default_rng(0))
    >>> W.dtype, bool(abs(W).max() <= np.sqrt(6 / 40))
    (dtype('float32'), True)
    """
    a = np.sqrt(6.0 / (shape[0] + shape[1]))
    return ((rng.random(shape, dtype=np.float64) * 2 - 1) * a).astype(dtype)


def gcn_init(dims, rng, dtype=np.float32):
    """Parameters ``W0, b0, W1, b1, ...`` of a GCN with layer widths ``dims`` (Glorot weights, zero biases).

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> p = tg.nn.gcn_init((1433, 16, 7), np.random.default_rng(0))
    >>> {k: v.shape for k, v in p.items()}
    {'W0': (1433, 16), 'b0': (16,), 'W1': (16, 7), 'b1': (7,)}
    """
    if len(dims) < 2:
        raise ValueError(f"dims must be (features, ..., classes): at least two widths, got {tuple(dims)}")
    xp = _xp_of(rng)
    params = {}
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
        params[f"W{i}"] = glorot((d_in, d_out), rng, dtype)
        params[f"b{i}"] = xp.zeros(d_out, dtype=dtype)
    return params


def _mixed(params, dtype):
    """``(compute dtype or None, params as used in the forward pass)``: 16-bit copies of fp32 master weights."""
    if dtype is None:
        return None, params
    dtype = as_dtype(dtype)
    if not is_half(dtype):
        raise ValueError(f"dtype must be None, float16 or bfloat16 (mixed precision), got {dtype}")
    return dtype, {k: v.astype(dtype) for k, v in params.items()}


def _master_grads(grads, params):
    """Gradients in the master weights' dtype (float32)."""
    return {k: g.astype(params[k].dtype, copy=False) for k, g in grads.items()}


def _input_rate(dropout_p, training):
    """The input layer's dropout rate: ``dropout_p`` (checked in evaluation too), 0 where not ``training``."""
    p = probability("dropout_p", dropout_p)
    return p if check_bool("training", training) else 0.0


def gcn_apply(params, A, X, *, rng=None, dropout_p=0.5, training=True, precision=None, dtype=None):
    """Kipf & Welling's GCN: dropout, ``gcn_conv`` and relu per hidden layer, then dropout and ``gcn_conv``.

    Parameters
    ----------
    params : dict
        From :func:`gcn_init`.
    A : TiledMatrix
        :func:`gcn_norm` of the adjacency.
    X : array, shape (n, dims[0])
        Node features (moved to A's device if elsewhere).
    rng : Generator, optional
        For dropout, on A's device (:func:`default_rng`); needed when
        ``training`` and ``dropout_p > 0``.
    dropout_p : float, default 0.5
    training : bool, default True
    precision : {None, "tf32", "fp32", "fp16", "bf16"}, optional
    dtype : {None, "float16", "bfloat16"}, optional
        Mixed precision (as PyTorch AMP users know it): features, activations
        and the forward copies of the weights in this 16-bit type, sparse
        products on 16-bit tensor cores (on a ``layout="vector"`` matrix) with
        float32 accumulation; ``params`` stay the float32 master weights and
        the gradients come back in float32.  The logits are 16-bit: compute
        the loss in float32 (:func:`train` does).

    Returns
    -------
    logits : array, shape (n, dims[-1])
    vjp : callable
        ``vjp(dlogits) -> {name: gradient}``.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> g = tg.load_cora()
    >>> A = tg.nn.gcn_norm(g.adj)
    >>> rng = tg.nn.default_rng(0, like=A)  # parameters and dropout on A's device
    >>> params = tg.nn.gcn_init((g.features.shape[1], 16, 7), rng)
    >>> logits, vjp = tg.nn.gcn_apply(params, A, g.features.toarray().astype(np.float32), rng=rng)
    >>> logits.shape, sorted(vjp(logits))
    ((2708, 7), ['W0', 'W1', 'b0', 'b1'])
    """
    E = edges_of(A, precision)
    n_layers = len(params) // 2
    cd, p = _mixed(params, dtype)
    H = features_on(E, X, "X")
    if cd is not None:
        H = H.astype(cd, copy=False)
    # the input's dropout in the first layer (read as its product reads X); no gradient flows to X
    p_in = _input_rate(dropout_p, training)
    back = []
    for i in range(n_layers):
        H, c_vjp = gcn_conv(E, H, p[f"W{i}"], dropout_p=p_in, rng=rng) if i == 0 else gcn_conv(E, H, p[f"W{i}"])
        hidden = i < n_layers - 1  # bias, relu and the next layer's dropout in one pass
        H, t_vjp = bias_act_dropout(H, p[f"b{i}"], "relu" if hidden else None, dropout_p if hidden else 0.0, rng,
                                    training=training)
        back.append((c_vjp, t_vjp))

    def vjp(g):
        grads = {}
        if cd is not None:
            g = array_on(E, g).astype(cd, copy=False)
        for i in reversed(range(n_layers)):
            c_vjp, t_vjp = back[i]
            g, grads[f"b{i}"] = t_vjp(g)
            g, grads[f"W{i}"], _ = c_vjp(g, input_grad=i > 0)
        return _master_grads(grads, params)

    return H, vjp


def agnn_init(dims, rng, n_prop=2, dtype=np.float32):
    """Parameters of an AGNN: ``W_in, b_in``, ``beta1`` to ``beta{n_prop-1}`` (1.0), ``W_out, b_out``.

    ``dims = (features, hidden, classes)``.  The first propagation layer keeps
    ``beta = 1`` fixed, as in PyTorch Geometric's AGNN example.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> sorted(tg.nn.agnn_init((1433, 16, 7), np.random.default_rng(0), n_prop=3))
    ['W_in', 'W_out', 'b_in', 'b_out', 'beta1', 'beta2']
    """
    if len(dims) != 3:
        raise ValueError(f"dims must be (features, hidden, classes), got {dims}")
    n_prop = check_count("n_prop", n_prop, 1)
    xp = _xp_of(rng)
    params = {
        "W_in": glorot((dims[0], dims[1]), rng, dtype),
        "b_in": xp.zeros(dims[1], dtype=dtype),
        "W_out": glorot((dims[1], dims[2]), rng, dtype),
        "b_out": xp.zeros(dims[2], dtype=dtype),
    }
    for k in range(1, n_prop):
        params[f"beta{k}"] = xp.ones(1, dtype=dtype)
    return params


def agnn_apply(params, A, X, *, rng=None, dropout_p=0.5, training=True, precision=None, dtype=None):
    """AGNN: ``dropout -> linear -> relu -> agnn_conv x n_prop -> dropout -> linear``.

    Parameters as in :func:`gcn_apply` (``dtype`` too: the attention softmax
    runs in float32); ``A`` is :func:`add_self_loops` of the adjacency.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> g = tg.load_cora()
    >>> A = tg.nn.add_self_loops(g.adj)
    >>> rng = tg.nn.default_rng(0, like=A)
    >>> params = tg.nn.agnn_init((g.features.shape[1], 16, 7), rng)
    >>> logits, vjp = tg.nn.agnn_apply(params, A, g.features.toarray().astype(np.float32), rng=rng)
    >>> logits.shape, sorted(vjp(logits))
    ((2708, 7), ['W_in', 'W_out', 'b_in', 'b_out', 'beta1'])
    """
    E = edges_of(A, precision)
    n_prop = 1 + sum(k.startswith("beta") for k in params)
    cd, p = _mixed(params, dtype)
    H = features_on(E, X, "X")
    if cd is not None:
        H = H.astype(cd, copy=False)
    # the input's dropout in the first layer (read as its product reads X); no gradient flows to X
    p_in = _input_rate(dropout_p, training)
    H, l_in = linear(H, p["W_in"], dropout_p=p_in, rng=rng)
    H, t_in = bias_act_dropout(H, p["b_in"], "relu")
    props = []
    for k in range(n_prop):
        beta = params[f"beta{k}"] if k else 1.0  # float32: the softmax's temperature
        H, p_vjp = agnn_conv(E, H, beta)
        props.append(p_vjp)
    H, d_out = dropout(H, dropout_p, rng, training=training)
    H, l_out = linear(H, p["W_out"])
    H, t_out = bias_act_dropout(H, p["b_out"])

    def vjp(g):
        grads = {}
        if cd is not None:
            g = array_on(E, g).astype(cd, copy=False)
        g, grads["b_out"] = t_out(g)
        g, grads["W_out"], _ = l_out(g)
        g = d_out(g)
        for k in reversed(range(n_prop)):
            g, dbeta = props[k](g)
            if k:
                grads[f"beta{k}"] = dbeta
        g, grads["b_in"] = t_in(g)
        _, grads["W_in"], _ = l_in(g, input_grad=False)
        return _master_grads(grads, params)

    return H, vjp


def gat_init(dims, rng, heads=8, dtype=np.float32):
    """Parameters of a two-layer GAT: ``W1, a_src1, a_dst1, b1`` (``heads`` heads of ``hidden``), ``W2, a_src2,
    a_dst2, b2`` (one head of ``classes``, as the GAT paper's Cora model).

    ``dims = (features, hidden, classes)``; Glorot weights and attention vectors, zero biases.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> sorted(tg.nn.gat_init((1433, 8, 7), np.random.default_rng(0)))
    ['W1', 'W2', 'a_dst1', 'a_dst2', 'a_src1', 'a_src2', 'b1', 'b2']
    """
    if len(dims) != 3:
        raise ValueError(f"dims must be (features, hidden, classes), got {dims}")
    heads = check_count("heads", heads, 1)
    xp = _xp_of(rng)
    f, hid, c = dims
    return {
        "W1": glorot((f, heads * hid), rng, dtype),
        "a_src1": glorot((heads, hid), rng, dtype),
        "a_dst1": glorot((heads, hid), rng, dtype),
        "b1": xp.zeros(heads * hid, dtype=dtype),
        "W2": glorot((heads * hid, c), rng, dtype),
        "a_src2": glorot((1, c), rng, dtype),
        "a_dst2": glorot((1, c), rng, dtype),
        "b2": xp.zeros(c, dtype=dtype),
    }


def gat_apply(params, A, X, *, rng=None, dropout_p=0.6, training=True, precision=None, dtype=None):
    """GAT: ``dropout -> gat_conv (heads, concat) -> elu -> dropout -> gat_conv (one head)``.

    Parameters as in :func:`gcn_apply`; ``A`` is :func:`add_self_loops` of the adjacency.  The attention
    runs fused (:func:`graph_attention`); ``dropout_p`` drops features and attention entries, as the GAT paper.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> g = tg.load_cora()
    >>> A = tg.nn.add_self_loops(g.adj)
    >>> rng = tg.nn.default_rng(0, like=A)
    >>> params = tg.nn.gat_init((g.features.shape[1], 8, 7), rng)
    >>> logits, vjp = tg.nn.gat_apply(params, A, g.features.toarray().astype(np.float32), rng=rng)
    >>> logits.shape, len(vjp(logits))
    ((2708, 7), 8)
    """
    E = edges_of(A, precision)
    cd, p = _mixed(params, dtype)
    heads = p["a_src1"].shape[0]
    H = features_on(E, X, "X")
    if cd is not None:
        H = H.astype(cd, copy=False)
    H, _ = dropout(H, dropout_p, rng, training=training)  # the input's: no gradient flows to X
    att = dict(dropout=dropout_p, rng=rng, training=training)
    H, c1 = gat_conv(E, H, p["W1"], p["a_src1"], p["a_dst1"], heads=heads, **att)
    H, t1 = bias_act_dropout(H, p["b1"], "elu", dropout_p, rng, training=training)  # one pass
    H, c2 = gat_conv(E, H, p["W2"], p["a_src2"], p["a_dst2"], p["b2"], heads=1, concat=False, **att)

    def vjp(g):
        grads = {}
        if cd is not None:
            g = array_on(E, g).astype(cd, copy=False)
        g, grads["W2"], grads["a_src2"], grads["a_dst2"], grads["b2"] = c2(g)
        g, grads["b1"] = t1(g)
        _, grads["W1"], grads["a_src1"], grads["a_dst1"], _ = c1(g, input_grad=False)
        return _master_grads(grads, params)

    return H, vjp
