"""Layer 4: graph attention in one pass per row (scores, softmax and aggregation fused), and the GAT layer.

On the GPU both passes run the ``"attention"`` kernels (:mod:`tcgnn_py.kernels.attention`): the scores never
reach global memory, each row keeps one log-sum-exp per head, and the backward pass recomputes the attention
from it in a pass over A's rows, which keeps each entry's two factors (8 bytes per entry and head, for the call)
for a pass over Aᵀ's.  Elsewhere -- on the host, on a distributed view, beyond the
kernels' reach -- the unfused sequence runs on the library's SpMM and SDDMM (``fused=False`` asks for it
anywhere); ``fused=True`` on the host runs the row-wise NumPy reference (:func:`tcgnn_py._reference.attention`).
Features of a boolean or integer type become the float type that holds them, as in ``T @ X``.
"""

import functools
import math
import numbers
import sys
import warnings

import numpy as np

from ..products import attention as engine
from ..products import dense, pointwise
from .. import _reference as ref
from .._device import FallbackWarning
from .._validation import check_bool, check_count, is_half
from .._cache import keep
from . import _bound as bound
from ._edges import TiledEdges, array_on, edges_of, features_on
from ._record import Op, Tape, bind, general, general_vjp, input_grad_option, no_options
from ._layers import ATB, MM, MM_T, SUMS, check_2d, check_weight, column_sums, mm

__all__ = ["graph_attention", "gat_conv", "agnn_conv", "SCORES"]

#: ``normalize`` divides by ``max(||h||, _NORM_EPS)`` (PyTorch's F.normalize rule).
_NORM_EPS = 1e-12

#: The attention scores :func:`graph_attention` fuses.
SCORES = ("additive", "cosine")


def _real(name, value, lo=None, hi=None, closed_hi=True):
    """A finite real number argument (bools refused), optionally in ``[lo, hi]`` / ``[lo, hi)``; errors name it.
    A Python float, the usual case, skips the type checks (an ABC check costs more than a layer's arithmetic)."""
    if type(value) is not float and (isinstance(value, (bool, np.bool_))
                                     or not isinstance(value, (numbers.Real, np.floating, np.integer))):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or (lo is not None and value < lo) or (
            hi is not None and (value > hi if closed_hi else value >= hi)):
        where = "" if lo is None else f" in [{lo}, {hi}{']' if closed_hi else ')'}"
        raise ValueError(f"{name} must be a finite number{where}, got {value!r}")
    return value


def _seed(E, seed):
    """The dropout seed as a one-element uint32 array on the graph's device: an integer array (or int) in
    ``[0, 2**32)``; a uint32 array is taken as it is (no host read, so a CUDA graph can hold the call)."""
    if seed is None:
        raise TypeError("dropout needs seed: a one-element uint32 array on the graph's device")
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        if not 0 <= int(seed) < 2**32:  # (a Python int of any size: checked before NumPy would refuse its type)
            raise ValueError(f"seed must be in [0, 2**32) (a uint32), got {int(seed)}")
        seed = np.array([seed], np.uint32)
    seed = array_on(E, seed, "seed")
    if seed.dtype.kind not in "iu" or seed.dtype == np.bool_:
        raise TypeError(f"seed must be an integer array (uint32), got dtype {seed.dtype}")
    seed = seed.reshape(-1)
    if seed.shape != (1,):
        raise ValueError(f"seed must have one element, got shape {seed.shape}")
    if seed.dtype != np.uint32:
        v = int(seed[0])  # synchronize! (a seed of another integer type is range-checked once)
        if not 0 <= v < 2**32:
            raise ValueError(f"seed must be in [0, 2**32) (a uint32), got {v}")
        seed = seed.astype(np.uint32)
    return seed


#: Values arrays whose weights were checked non-negative, per tiling (the latest few).
_CHECKED_KEEP = 4


def _draw_seed(rng):
    """An attention dropout seed: one uint32, on rng's device: on the GPU the next of rng's seed stream
    (:func:`tcgnn_py.products.pointwise.draw`, no host read, so a capture can hold it); on the host the bits of
    ``(rng.random(1) * 2**32).astype(uint32)``."""
    cp = sys.modules.get("cupy")
    if cp is not None and isinstance(rng, cp.random.Generator):
        return pointwise.draw(rng, 1)
    draw = rng.random(1)
    if type(draw) is np.ndarray:
        return (draw * 2.0**32).astype(np.uint32)
    return pointwise.seed_bits(draw)


def _check_weights(E):
    """Refuse negative entries of the graph (the softmax's weights ``a_ij``): ``a exp(z)`` must be a
    non-negative measure, or the fused pass (log weights) and the unfused one (weights times exponentials)
    disagree.  One device read per values array, remembered with the structure."""
    values = E.values
    kept = E.cached("attention_checked", dict)
    hit = kept.get(id(values))
    if hit is not None and hit is values:
        return
    if values.shape[0] and bool((values < 0).any()):  # synchronize!
        raise ValueError("graph_attention: A holds negative values; its values are the softmax's weights "
                         "(a_ij exp(z_ij)), which must be >= 0 (use A.astype(bool) for an unweighted graph)")
    keep(kept, id(values), values, _CHECKED_KEEP)


def _inputs(E, V, heads, score, s_src, s_dst, Q, K, beta, negative_slope, dropout, seed, fused):
    """Every argument of :func:`graph_attention` checked, named in its errors, and made a float array on the
    graph's device (booleans and integers become the float type that holds them, as ``T @ X``)."""
    heads = check_count("heads", heads, 1)
    if not isinstance(score, str) or score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r:.60}")
    if fused is not None:
        fused = check_bool("fused", fused)
    n, k = E.shape
    V = features_on(E, V, "V")
    check_2d("V", V)
    if V.shape[0] != k:
        raise ValueError(f"V has {V.shape[0]} rows, the graph has {k} columns")
    if V.shape[1] % heads:
        raise ValueError(f"V's {V.shape[1]} columns are not {heads} heads of equal width")
    fd = np.dtype(np.float32) if is_half(V.dtype) else V.dtype  # the softmax's dtype
    given = {name: x is not None for name, x in (("s_src", s_src), ("s_dst", s_dst), ("Q", Q), ("K", K),
                                                  ("beta", beta))}
    if score == "additive":
        extra = [name for name in ("Q", "K", "beta") if given[name]]
        if extra:
            raise TypeError(f"{', '.join(extra)}: for score='cosine'; score='additive' takes s_src and s_dst")
        if not (given["s_src"] and given["s_dst"]):
            raise TypeError("score='additive' needs s_src and s_dst")
        s_src, s_dst = (features_on(E, s, name).astype(fd, copy=False)
                        for name, s in (("s_src", s_src), ("s_dst", s_dst)))
        for name, s, rows in (("s_src", s_src, k), ("s_dst", s_dst, n)):
            if s.shape != (rows, heads):
                raise ValueError(f"{name} must have shape {(rows, heads)}, got {s.shape}")
    else:
        extra = [name for name in ("s_src", "s_dst") if given[name]]
        if extra:
            raise TypeError(f"{', '.join(extra)}: for score='additive'; score='cosine' takes Q, K and beta")
        if heads != 1:
            raise ValueError(f"score='cosine' has one head, got heads={heads}")
        if not (given["Q"] and given["K"] and given["beta"]):
            raise TypeError("score='cosine' needs Q, K and beta")
        Q, K = features_on(E, Q, "Q"), features_on(E, K, "K")
        beta = features_on(E, beta, "beta").astype(fd, copy=False).reshape(-1)
        if Q.ndim != 2 or K.ndim != 2 or Q.shape[0] != n or K.shape[0] != k or Q.shape[1] != K.shape[1]:
            raise ValueError(f"Q and K must have shapes ({n}, d) and ({k}, d), got {Q.shape} and {K.shape}")
        if beta.shape != (1,):
            raise ValueError(f"beta must be a scalar or have shape (1,), got {beta.shape}")
    slope = _real("negative_slope", negative_slope)
    dropout = _real("dropout", dropout, 0, 1, closed_hi=False)
    seed = _seed(E, seed) if dropout else None
    _check_weights(E)
    return dict(heads=heads, score=score, V=V, fd=fd, s_src=s_src, s_dst=s_dst, Q=Q, K=K, beta=beta, slope=slope,
                dropout=dropout, seed=seed, fused=fused)


def _path(E, a):
    """``"fused"`` (the GPU kernels), ``"unfused"`` (scores, an edge softmax and SpMM on the library's products)
    or ``"reference"`` (the row-wise NumPy / CuPy pass), for ``fused`` None (the fastest here), True or False."""
    fused, V, heads = a["fused"], a["V"], a["heads"]
    if fused is False:
        return "unfused"
    if type(E) is not TiledEdges:  # a distributed view (its products exchange halos) or a CSR one
        why = f"a {type(E).__name__} view runs its own products"
    elif E.xp is np:  # the host: the unfused sequence beats the row-wise pass 2-7x
        return "reference" if fused else "unfused"
    else:
        why = engine.reach(V, heads, a["score"], a["Q"])
        if why is None:
            return "fused"
    if fused:
        warnings.warn(f"graph_attention(fused=True): {why}; the unfused sequence runs instead", FallbackWarning,
                      stacklevel=4)
    return "unfused"


def graph_attention(A, V, *, heads=1, score="additive", s_src=None, s_dst=None, Q=None, K=None, beta=None,
                    negative_slope=0.2, dropout=0.0, seed=None, precision=None, fused=None):
    """Attention over the stored entries of each row, fused: ``out_i = sum_j softmax_j(score(i, j)) V_j``.

    For each head h, ``P_ij,h = a_ij exp(z_ij,h) / sum_k a_ik exp(z_ik,h)`` over row i's stored entries
    (``a`` A's values, which must be >= 0) and ``out[i, h] = sum_j P_ij,h V[j, h]``.  The scores ``z`` never
    reach global memory in the forward pass: one pass per row keeps a running maximum and sum (online softmax)
    and one log-sum-exp per row and head, from which the backward pass recomputes ``P`` (keeping, for the call,
    8 bytes per entry and head: ``P`` and the score's gradient, which the pass over Aᵀ's rows sums).

    Parameters
    ----------
    A : TiledMatrix, shape (n, k)
        Or an edge view (a distributed one runs the unfused sequence, whose products exchange halo rows).
    V : array, shape (k, heads * D)
        Values, head by head (D features each).  Booleans and integers become the float type that holds them
        (as ``T @ V``).  The fused kernel takes float32, float16 and bfloat16 with ``heads <= 8`` and
        ``D <= 256``.
    heads : int
    score : {"additive", "cosine"}
        ``"additive"`` (GAT): ``z_ij,h = LeakyReLU(s_dst[i, h] + s_src[j, h])``, with ``s_src`` of shape
        ``(k, heads)`` and ``s_dst`` ``(n, heads)``.  ``"cosine"`` (AGNN; one head):
        ``z_ij = beta * <Q[i], K[j]>`` with ``Q`` ``(n, d)``, ``K`` ``(k, d)`` (row-normalised by the
        caller for a cosine) and ``beta`` of shape (1,).  Each score takes only its own arguments.
    negative_slope : float
        Of the LeakyReLU (``"additive"``); finite.
    dropout : float in [0, 1)
        Attention dropout: each entry's ``P`` is dropped with this probability after the softmax and the kept
        ones scaled by ``1 / (1 - dropout)`` (PyTorch Geometric's GATConv); the mask is a hash of the entry,
        the head and ``seed``, so the backward pass recomputes it.
    seed : array of shape (1,), uint32, optional
        On the graph's device (a uint32 array is read there only: no host read, so a CUDA graph can hold the
        call; another integer type is range-checked on the host); needed with ``dropout``.
    precision : {None, "tf32", "fp32", "fp16", "bf16"}, optional
        For the unfused passes' sparse products.
    fused : bool, optional
        None (default): the fastest path here -- the fused kernels on the GPU where they reach, else the unfused
        sequence (on the host it beats the row-wise pass).  True: the fused kernels (the row-wise reference pass
        on the host); where they do not reach, a :class:`~tcgnn_py.FallbackWarning` says why and the unfused
        sequence runs.  False: the sequence the fused pass replaces, one head at a time (every entry's scores,
        an SDDMM for ``"cosine"``, an edge softmax and SpMM), and its backward likewise.

    Returns
    -------
    out : array, shape (n, heads * D)
        Of V's (float) dtype (computed in float32 for 16-bit V).
    vjp : callable
        ``vjp(g)`` (``g`` of ``out``'s shape): ``(dV, ds_src, ds_dst)`` for ``"additive"``, ``(dV, dQ, dK,
        dbeta)`` for ``"cosine"``.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> A = tg.TiledMatrix(sp.csr_array(np.ones((2, 2), np.float32)), device="cpu")
    >>> V = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    >>> s = np.array([[0.0], [np.log(3.0)]], np.float32)  # the second node draws 3x the attention
    >>> out, vjp = tg.nn.graph_attention(A, V, s_src=s, s_dst=np.zeros((2, 1), np.float32))
    >>> print(np.round(out, 4).tolist())
    [[0.25, 0.75], [0.25, 0.75]]
    """
    E = edges_of(A, precision)
    out, vjp, _ = _attend(E, _inputs(E, V, heads, score, s_src, s_dst, Q, K, beta, negative_slope, dropout, seed,
                                     fused))
    return out, vjp


def _attend(E, a, path=None):
    """``(out, vjp, path)``: :func:`graph_attention` of checked arguments ``a`` (:func:`_inputs`'s dict) and the
    path it took (None without features; ``path``: the one :func:`_path` chose already).  The layers, whose own
    checks and arithmetic already give V, the scores and the seed their types and shapes, come in here."""
    if a["V"].shape[1] == 0:  # no features: nothing to attend to, and no gradient flows
        return (*_no_features(E, a), None)
    path = path or _path(E, a)
    if path == "fused":
        out, lse = engine.fused(E.matrix, **_kernel_args(a))
    elif path == "unfused":
        out, lse = _unfused(E, a)
    else:
        out, lse = _reference_pass(E, a)
    return out, functools.partial(_attend_vjp, E, a, path, out, lse), path


def _attend_vjp(E, a, path, out, lse, g):
    """The vjp of :func:`_attend` on the path it took."""
    g = features_on(E, g, "g")
    if g.shape != out.shape:
        raise ValueError(f"g must have the output's shape {out.shape}, got {g.shape}")
    if path == "fused":  # P recomputed per entry (8 bytes per entry and head kept for the call)
        grads = engine.fused_backward(E.matrix, a["V"], g, out, lse, **_kernel_args(a, with_v=False))
        if a["score"] == "additive":
            return grads
        dV, dQ, dK, shares = grads  # the temperature's gradient, one share per row unit: summed in order
        return dV, dQ, dK, pointwise.total(shares, (1,))
    return _backward(E, a, g, out, lse)


def _kernel_args(a, with_v=True):
    keys = ("heads", "score", "s_src", "s_dst", "Q", "K", "beta", "slope", "dropout", "seed")
    args = {key: a[key] for key in keys}
    if with_v:
        args["V"] = a["V"]
    return args


def _no_features(E, a):
    """``graph_attention`` of zero-width V: an empty result, and zero gradients of the right shapes."""
    xp, n, k, heads, fd = E.xp, E.shape[0], E.shape[1], a["heads"], a["fd"]
    out = xp.zeros((n, 0), a["V"].dtype)

    def vjp(g):
        g = features_on(E, g, "g")
        if g.shape != out.shape:
            raise ValueError(f"g must have the output's shape {out.shape}, got {g.shape}")
        dV = xp.zeros((k, 0), a["V"].dtype)
        if a["score"] == "additive":
            return dV, xp.zeros((k, heads), fd), xp.zeros((n, heads), fd)
        return dV, xp.zeros(a["Q"].shape, fd), xp.zeros(a["K"].shape, fd), xp.zeros(1, fd)

    return out, vjp


def _reference_pass(E, a):
    """``(out, lse)`` by the row-wise reference (:func:`tcgnn_py._reference.attention`) on the graph's device."""
    T, fd = E.matrix, a["fd"]
    indices, indptr, _, _ = engine.csr_structure(T)
    out, lse = ref.attention(indptr, indices, engine.csr_weights(T, fd), a["V"], a["heads"], a["score"],
                             s_src=a["s_src"], s_dst=a["s_dst"], Q=a["Q"], K=a["K"], beta=a["beta"], slope=a["slope"],
                             dtype=fd, dropout=a["dropout"], seed=a["seed"])
    return out.astype(a["V"].dtype, copy=False), lse


def _scores(E, a):
    """``(z, pre)``: every stored entry's score per head (tiled order) and, additive, before the LeakyReLU; the
    cosines by SDDMM (tensor cores where the precision allows), not by gathering E x d features."""
    if a["score"] == "additive":
        return ref.attention_scores(E.rows, E.cols, a["heads"], "additive", E.columns(a["s_src"]), a["s_dst"],
                                    slope=a["slope"])
    pre = E.sddmm(a["Q"], a["K"]).astype(a["fd"], copy=False)[:, None]
    return a["beta"] * pre, pre


def _backward(E, a, g, out, lse):
    """The vjp of the unfused and reference passes: ``P`` recomputed from ``lse``, then per head
    ``dV = P^T g`` (SpMM by Aᵀ), ``dP = <g_i, V_j>`` (SDDMM) and the softmax's and score's chain rules."""
    xp, fd, heads, V = E.xp, a["fd"], a["heads"], a["V"]
    n, k = E.shape
    rows = E.rows
    D = V.shape[1] // heads
    z, pre = _scores(E, a)
    w = E.values.astype(fd)
    with np.errstate(divide="ignore", invalid="ignore"):
        P = xp.where((w != 0)[:, None], xp.exp(z + xp.log(w)[:, None] - lse[rows]), 0).astype(fd)
    # dropped attention: out = sum_j P_ij m_ij V_j, so dP_ij = m_ij <g_i, V_j> (m: 0 or 1 / (1 - p))
    m = ref.attention_keep(E.entry_ids, heads, a["seed"], a["dropout"]).astype(fd) if a["dropout"] else None
    gf = g.astype(fd, copy=False).reshape(n, heads, D)
    Vf = V.astype(fd, copy=False).reshape(k, heads, D)
    t = (gf * out.astype(fd, copy=False).reshape(n, heads, D)).sum(axis=2)  # sum_j P dP = <g_i, out_i>
    dV = xp.empty((k, heads, D), fd)
    dz = xp.empty_like(P)
    for h in range(heads):
        gh = xp.ascontiguousarray(gf[:, h])
        dV[:, h] = E.spmm_t(gh, values=P[:, h] if m is None else P[:, h] * m[:, h])
        dP = E.sddmm(gh, xp.ascontiguousarray(Vf[:, h])).astype(fd, copy=False)
        if m is not None:
            dP = dP * m[:, h]
        dz[:, h] = P[:, h] * (dP - t[rows, h])
    dV = dV.reshape(k, heads * D).astype(V.dtype, copy=False)
    if a["score"] == "additive":
        dpre = dz * xp.where(pre > 0, 1, a["slope"]).astype(fd)
        ds_dst = xp.stack([E.row_sums(xp.ascontiguousarray(dpre[:, h])) for h in range(heads)], axis=1)
        ds_src = xp.stack([E.col_sums(xp.ascontiguousarray(dpre[:, h])) for h in range(heads)], axis=1)
        return dV, ds_src, ds_dst
    beta, Q, K = a["beta"], a["Q"], a["K"]
    dz0 = dz[:, 0]
    dbeta = (dz0 * pre[:, 0]).sum().reshape(1)
    dc = beta * dz0
    return dV, E.spmm(K.astype(fd), values=dc), E.spmm_t(Q.astype(fd), values=dc), dbeta


def gat_conv(A, H, W, a_src, a_dst, b=None, *, heads=1, concat=True, negative_slope=0.2, dropout=0.0, rng=None,
             training=True, precision=None, fused=None):
    """Graph attention (GAT, Veličković et al. 2018), as PyTorch Geometric's ``GATConv``.

    ``X = H @ W`` split into ``heads`` heads of D features; for each head
    ``out_i = sum_j softmax_j(LeakyReLU(a_dst . X_i + a_src . X_j)) X_j`` over row i's stored
    entries (edges j -> i; the caller's A has self-loops if it wants them), weighted by A's values;
    heads concatenated (``concat``) or averaged; ``+ b``.  The attention runs fused
    (:func:`graph_attention`).

    Parameters
    ----------
    A : TiledMatrix, shape (n, n)
    H : array, shape (n, f)
    W : array, shape (f, heads * D)
    a_src, a_dst : array, shape (heads, D)
    b : array, shape (heads * D,) if concat else (D,), optional
    heads : int
    concat : bool
    negative_slope : float
    dropout : float
        Attention dropout in training (see :func:`graph_attention`), its seed drawn from ``rng``.
    rng : numpy or cupy random Generator, optional
    training : bool
    precision : optional
        For the unfused passes' sparse products.
    fused : bool, optional
        As in :func:`graph_attention` (None: the fastest path here; False: unfused, for comparison).

    Returns
    -------
    out : array, shape (n, heads * D) or (n, D)
    vjp : callable
        ``vjp(g, input_grad=True) -> (dH, dW, da_src, da_dst, db)`` (``db`` None without ``b``, ``dH`` None
        without ``input_grad``).

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> A = tg.nn.add_self_loops(sp.csr_array(np.array([[0, 1], [1, 0]])), device="cpu")
    >>> H = np.eye(2, dtype=np.float32)
    >>> z = np.zeros((1, 2), np.float32)
    >>> out, vjp = tg.nn.gat_conv(A, H, np.eye(2, dtype=np.float32), z, z)
    >>> print(out.tolist())
    [[0.5, 0.5], [0.5, 0.5]]
    """
    key = None
    if (type(heads) is int and type(concat) is bool and type(training) is bool and type(negative_slope) is float
            and type(dropout) is float and (fused is None or type(fused) is bool)
            and (precision is None or type(precision) is str)):  # options of one type each: a key proves them
        key, call = bound.lookup(A, (H, W, a_src, a_dst, b), ("gat_conv", heads, concat, negative_slope,
                                                              dropout if training else 0.0, precision, fused,
                                                              rng is None))
        if call is not None:
            return call(H, W, a_src, a_dst, b, rng)
    E = edges_of(A, precision)
    xp = E.xp
    given = (H, W, a_src, a_dst, b, rng)  # (a bound call takes them as they are: bound only where none converted)
    heads = check_count("heads", heads, 1)
    concat, training = check_bool("concat", concat), check_bool("training", training)
    H, W = features_on(E, H, "H"), features_on(E, W, "W")
    n = E.shape[0]
    check_2d("H", H, n)
    check_weight("gat_conv", H, W)
    if W.shape[1] % heads:
        raise ValueError(f"W's {W.shape[1]} columns are not {heads} heads of equal width")
    D = W.shape[1] // heads
    a_src, a_dst = features_on(E, a_src, "a_src"), features_on(E, a_dst, "a_dst")
    for name, a in (("a_src", a_src), ("a_dst", a_dst)):
        if a.shape != (heads, D):
            raise ValueError(f"{name} must have shape {(heads, D)}, got {a.shape}")
    width = heads * D if concat else D
    if b is not None:
        b = features_on(E, b, "b")
        if b.shape != (width,):
            raise ValueError(f"b must have shape ({width},) (heads * D if concat else D), got {b.shape}")
    drop = _real("dropout", dropout, 0, 1, closed_hi=False) if training else 0.0
    slope = _real("negative_slope", negative_slope)
    if fused is not None:
        fused = check_bool("fused", fused)
    if E.shape[1] != n:
        raise ValueError(f"gat_conv needs a square graph (X = H W is both sides), got shape {E.shape}")
    # the scores come with X from its product where the product's kernel takes them (one launch, X read by none),
    # else from one read of X (six array passes otherwise), and their vjp likewise
    scored = xp is not np and dense.dense_takes(H, W) and dense.dense_scores_take(D)
    tape = general if key is None or xp is np else Tape()  # (the device's steps, :mod:`._record`)
    fd = pointwise.acc_dtype(H.dtype) if scored else None
    if not scored:
        X = tape(MM, H, W)
        fd = np.float32 if is_half(X.dtype) else X.dtype
    on_device = xp is not np and (scored or pointwise.takes(X.dtype))
    af_src, af_dst = _vectors(xp if on_device else None, a_src, a_dst, fd)
    if scored:
        X, s_src, s_dst = tape(SCORED_MM, H, W, af_src, af_dst, heads)
    elif on_device:
        s_src, s_dst = tape(HEAD_DOTS, X, af_src, af_dst, heads)  # (X C-contiguous: a product's result)
    else:
        X3 = X.reshape(n, heads, D).astype(fd, copy=False)
        s_src, s_dst = (X3 * af_src).sum(axis=2), (X3 * af_dst).sum(axis=2)
    if drop and rng is None:
        raise ValueError("attention dropout in training needs rng (tcgnn_py.nn.default_rng(seed, like=A))")
    _check_weights(E)
    a = dict(heads=heads, score="additive", V=X, fd=np.dtype(fd), s_src=s_src, s_dst=s_dst, Q=None, K=None,
             beta=None, slope=slope, dropout=drop, seed=None, fused=fused)
    path = _path(E, a) if on_device and X.shape[1] else None
    if path == "fused" and (concat or heads == 1):  # the fused path, written once (:func:`_gat_attend`)
        seed = tape(SEED, rng) if drop else None
        results = _gat_attend(tape, E, heads, slope, drop, X, s_src, s_dst, b, seed)
        grads = functools.partial(_gat_grads, E, heads, slope, drop, fd)
        if key is not None:
            bound.seen(A, key, lambda: bind(E, tape, given, results, grads, input_grad_option))
        return results[0], functools.partial(general_vjp, E, grads, input_grad_option,
                                             (H, W, a_src, a_dst, b, rng) + results, 6)
    a["seed"] = _draw_seed(rng) if drop else None
    att, att_vjp, path = _attend(E, a, path)
    out = att if concat or heads == 1 else att.reshape(n, heads, D).mean(axis=1)
    if b is not None:
        out = out + b.astype(out.dtype, copy=False)
    return out, functools.partial(_gat_vjp, E, H, W, a_src, a_dst, b, X, af_src, af_dst, fd, heads, concat,
                                  on_device, att_vjp, out.shape)


def _vectors(xp, a_src, a_dst, fd):
    """The attention vectors in the scores' type ``fd`` (C-contiguous on the device, ``xp`` not None): the arrays
    given where they are so already."""
    af_src, af_dst = a_src.astype(fd, copy=False), a_dst.astype(fd, copy=False)
    if xp is not None:
        af_src, af_dst = xp.ascontiguousarray(af_src), xp.ascontiguousarray(af_dst)
    return af_src, af_dst


def _gat_attend(t, E, heads, slope, dropout, X, s_src, s_dst, b, seed):
    """:func:`gat_conv`'s fused attention on tape ``t`` (:mod:`._record`), the bias added as the pass stores:
    ``(out, att, lse, X, s_src, s_dst, seed)``, what the vjp reads after ``out``."""
    res = t(ADDITIVE, E, heads, slope, dropout, X, s_src, s_dst, b, seed)
    return (res[0] if b is None else res[2]), res[0], res[1], X, s_src, s_dst, seed


def _gat_grads(E, heads, slope, dropout, fd, t, H, W, a_src, a_dst, b, rng, out, att, lse, X, s_src, s_dst, seed,
               g, input_grad=True):
    """:func:`gat_conv`'s vjp on the fused path, on tape ``t``: ``(dH, dW, da_src, da_dst, db)``."""
    xp = E.xp
    af_src, af_dst = _vectors(xp, a_src, a_dst, fd)
    db = None if b is None else t(SUMS, g).astype(b.dtype, copy=False)
    dX, ds_src, ds_dst = t(ADDITIVE_GRADS, E, heads, slope, dropout, X, g, att, s_src, s_dst, lse, seed)
    dX = t(HEAD_DOTS_GRAD, dX, ds_src, ds_dst, af_src, af_dst, heads)
    # da[h] = sum_i ds[i, h] X[i, h]: the diagonal blocks of dsᵀ X (a product, not a reduction along the long axis,
    # which is slow on the GPU; one per vector, as joining the two costs more than a product)
    Xf = X.astype(fd, copy=False)
    R_src, R_dst = t(ATB, ds_src, Xf), t(ATB, ds_dst, Xf)
    da_src, da_dst = (R_src, R_dst) if heads == 1 else t(HEAD_BLOCKS, R_src, R_dst, heads)
    dH = t(MM_T, dX, W) if input_grad else None  # (a first layer's input needs none: n x features skipped)
    return (dH, t(ATB, H, dX).astype(W.dtype, copy=False), da_src.astype(a_src.dtype, copy=False),
            da_dst.astype(a_dst.dtype, copy=False), db)


def _gat_vjp(E, H, W, a_src, a_dst, b, X, af_src, af_dst, fd, heads, concat, on_device, att_vjp, shape, g,
             input_grad=True):
    """:func:`gat_conv`'s vjp: ``X = H W``, ``af_*`` the attention vectors in the scores' type ``fd``, ``att_vjp``
    the attention's."""
    xp = E.xp
    n, D = X.shape[0], X.shape[1] // heads
    g = features_on(E, g, "g")
    if g.shape != shape:
        raise ValueError(f"g must have the output's shape {shape}, got {g.shape}")
    db = None if b is None else column_sums(g).astype(b.dtype, copy=False)
    ga = g if concat or heads == 1 else xp.repeat(g[:, None, :] / heads, heads, axis=1).reshape(n, heads * D)
    dX, ds_src, ds_dst = att_vjp(ga)
    if on_device:
        dX = pointwise.head_dots_grad(xp.ascontiguousarray(dX, dtype=X.dtype), xp.ascontiguousarray(ds_src, fd),
                                     xp.ascontiguousarray(ds_dst, fd), af_src, af_dst, heads)
        # da[h] = sum_i ds[i, h] X[i, h]: the diagonal blocks of dsᵀ X (a product, not a reduction along the
        # long axis, which is slow on the GPU; one per vector, as joining the two costs more than a product)
        Xf = X.astype(fd, copy=False)
        R_src, R_dst = mm(ds_src.T, Xf), mm(ds_dst.T, Xf)
        da_src, da_dst = (R_src, R_dst) if heads == 1 else pointwise.head_blocks(R_src, R_dst, heads)
    else:
        X3 = X.reshape(n, heads, D).astype(fd, copy=False)
        dX = dX.astype(fd, copy=False).reshape(n, heads, D)
        dX = (dX + ds_src[:, :, None] * af_src + ds_dst[:, :, None] * af_dst).reshape(n, heads * D)
        dX = dX.astype(X.dtype, copy=False)
        # sums over the n rows as 1ᵀ M (column_sums), as on the GPU
        da_src = column_sums((X3 * ds_src[:, :, None]).reshape(n, heads * D)).reshape(heads, D)
        da_dst = column_sums((X3 * ds_dst[:, :, None]).reshape(n, heads * D)).reshape(heads, D)
    da_src, da_dst = da_src.astype(a_src.dtype, copy=False), da_dst.astype(a_dst.dtype, copy=False)
    dH = mm(dX, W.T) if input_grad else None  # (a first layer's input needs none: n x features skipped)
    return dH, mm(H.T, dX).astype(W.dtype, copy=False), da_src, da_dst, db


def _edge_softmax(E, z, xp):
    """``(P, lse)``: ``P_ij = a_ij exp(z_ij) / sum_k a_ik exp(z_ik)`` per row, stable (row max subtracted), and
    each row's ``log sum_k a_ik exp(z_ik)`` (-inf where that sum is 0): the unfused path.  An entry of weight 0
    takes no part, whatever its score (as in the fused pass); a NaN score of a weighted entry makes its row NaN."""
    rows = E.rows
    n = E.shape[0]
    w = E.values.astype(z.dtype, copy=False)
    z = xp.where(w != 0, z, -np.inf)
    m = xp.full(n, -np.inf, dtype=z.dtype)
    with np.errstate(invalid="ignore"):  # a NaN score: its row's maximum is NaN, as the fused pass's
        xp.maximum.at(m, rows, z)  # order-independent: deterministic
        ex = xp.where(w != 0, w * xp.exp(z - m[rows]), 0).astype(z.dtype, copy=False)
    s = E.row_sums(ex)
    with np.errstate(divide="ignore", invalid="ignore"):
        P = ex / xp.where(s > 0, s, 1)[rows]
        return P, xp.where(s > 0, m + xp.log(xp.where(s > 0, s, 1)), -np.inf).astype(z.dtype, copy=False)


def _unfused(E, a):
    """``(out, lse)`` by the unfused sequence: every entry's scores (E x heads), an edge softmax and SpMM per head."""
    xp, fd, heads, V = E.xp, a["fd"], a["heads"], a["V"]
    z, _ = _scores(E, a)
    m = ref.attention_keep(E.entry_ids, heads, a["seed"], a["dropout"]).astype(fd) if a["dropout"] else None
    n, D = E.shape[0], V.shape[1] // heads
    out = xp.empty((n, heads * D), V.dtype)
    lse = xp.empty((n, heads), fd)
    for h in range(heads):
        P, lse[:, h] = _edge_softmax(E, xp.ascontiguousarray(z[:, h]), xp)
        out[:, h * D:(h + 1) * D] = E.spmm(xp.ascontiguousarray(V[:, h * D:(h + 1) * D]),
                                           values=P if m is None else P * m[:, h])
    return out, lse


def _normalize_rows(H, xp):
    # 16-bit H: the norms in float32 (a float16 eps of 1e-12 is 0, and sums of squares overflow).
    Hf = H.astype(np.float32) if is_half(H.dtype) else H
    norm = xp.sqrt((Hf * Hf).sum(axis=1))
    inv = 1 / xp.maximum(norm, _NORM_EPS)
    return (Hf * inv[:, None]).astype(H.dtype, copy=False), norm, inv


def agnn_conv(A, H, beta, *, precision=None, fused=None):
    """Attention-based propagation (AGNN, Thekumparampil et al. 2018).

    ``out_i = sum_j P_ij h_j`` with ``P_ij = softmax_j(beta * cos(h_i, h_j))``
    over the stored entries of row i; A's values weight the softmax
    (``P_ij ∝ a_ij exp(...)``, the usual AGNN for a binary A).  The cosines,
    the softmax and the aggregation run fused on the GPU (:func:`graph_attention`
    on row-normalised features), the backward pass recomputes the attention;
    ``fused=False`` runs them one after another (SDDMM, an edge softmax, SpMM),
    the sequence the fused pass replaces (and the default on the host).

    Parameters
    ----------
    A : TiledMatrix, shape (n, n)
        Non-negative weights; usually :func:`add_self_loops` of the adjacency.
    H : array, shape (n, d)
    beta : array, shape (1,), or float
        The attention temperature (learnable).
    precision : {None, "tf32", "fp32", "fp16", "bf16"}, optional
        For the sparse products.
    fused : bool, optional
        As in :func:`graph_attention` (None: the fastest path here).

    Returns
    -------
    out : array, shape (n, d)
    vjp : callable
        ``vjp(g) -> (dH, dbeta)``, ``dbeta`` of shape (1,).

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> A = tg.nn.add_self_loops(sp.csr_array(np.array([[0, 1], [1, 0]])), dtype=np.float64)
    >>> out, vjp = tg.nn.agnn_conv(A, np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([0.0]))
    >>> print(out.tolist())
    [[0.5, 0.5], [0.5, 0.5]]
    """
    key = None
    if (precision is None or type(precision) is str) and (fused is None or type(fused) is bool):
        key, call = bound.lookup(A, (H, beta), ("agnn_conv", precision, fused))
        if call is not None:
            return call(H, beta)
    E = edges_of(A, precision)
    xp = E.xp
    given = (H, beta)  # (a bound call takes them as they are: bound only where nothing was converted)
    H = features_on(E, H, "H")
    check_2d("H", H, E.shape[0])
    if E.shape[0] != E.shape[1]:
        raise ValueError(f"agnn_conv needs a square graph, got shape {E.shape}")
    fd = np.float32 if is_half(H.dtype) else H.dtype  # 16-bit features: the attention runs in float32
    beta = features_on(E, beta, "beta").astype(fd, copy=False)
    if beta.shape != (1,):  # (one of shape (1,) stays the array given)
        beta = beta.reshape(-1)
    if beta.shape != (1,):
        raise ValueError(f"beta must be a scalar or have shape (1,), got {beta.shape}")
    on_device = xp is not np and pointwise.takes(H.dtype)
    if on_device:  # one kernel each way (about eight array passes otherwise)
        H = xp.ascontiguousarray(H)
    if fused is not None:
        fused = check_bool("fused", fused)
    _check_weights(E)
    a = dict(heads=1, score="cosine", V=H, fd=np.dtype(fd), s_src=None, s_dst=None, Q=H, K=H, beta=beta, slope=0.2,
             dropout=0.0, seed=None, fused=fused)  # (Q and K: the rows normalised, of H's dtype and width)
    path = _path(E, a) if on_device and H.shape[1] else None
    if path == "fused":
        tape = general if key is None else Tape()
        results = _agnn(tape, E, H, beta)
        grads = functools.partial(_agnn_grads, E)
        if key is not None:
            bound.seen(A, key, lambda: bind(E, tape, given, results, grads))
        return results[0], functools.partial(general_vjp, E, grads, no_options, (H, beta) + results, 2)
    if on_device:
        Hn, norm = pointwise.row_normalize(H, _NORM_EPS)
    else:
        Hn, norm, inv = _normalize_rows(H, xp)
    a.update(Q=Hn, K=Hn)
    out, att_vjp, _ = _attend(E, a, path)
    return out, functools.partial(_agnn_vjp, E, H, Hn, norm, None if on_device else inv, fd, att_vjp)


def _agnn(t, E, H, beta):
    """:func:`agnn_conv`'s fused forward on tape ``t`` (:mod:`._record`): ``(out, lse, Hn, norm)``."""
    Hn, norm = t(ROW_NORMALIZE, H)
    out, lse = t(COSINE, E, H, Hn, Hn, beta)
    return out, lse, Hn, norm


def _agnn_grads(E, t, H, beta, out, lse, Hn, norm, g):
    """:func:`agnn_conv`'s fused vjp on tape ``t``: ``(dH, dbeta)``, the temperature's shares summed in the
    normalisation's vjp launch."""
    dV, dQ, dK, shares = t(COSINE_GRADS, E, H, g, out, Hn, Hn, beta, lse)
    return t(ROW_NORMALIZE_GRAD, dV, dQ, dK, Hn, norm, shares)


def _agnn_vjp(E, H, Hn, norm, inv, fd, att_vjp, g):
    """:func:`agnn_conv`'s vjp: ``Hn`` the rows normalised, ``norm`` their norms, ``inv`` ``1 / max(norm, eps)``
    on the host (None on the device, whose kernel divides), ``att_vjp`` the attention's."""
    xp = E.xp
    dH, dQ, dK, dbeta = att_vjp(g)
    if inv is None:
        return pointwise.row_normalize_grad(xp.ascontiguousarray(dH, dtype=H.dtype), xp.ascontiguousarray(dQ, fd),
                                           xp.ascontiguousarray(dK, fd), Hn, norm, _NORM_EPS), dbeta
    dHn = dQ + dK
    # d(h / max(|h|, eps)): project out the radial part where |h| > eps.
    radial = xp.where(norm > _NORM_EPS, (Hn * dHn).sum(axis=1), 0)
    # In float32 for 16-bit H: rows of norm ~0 get 1 / eps-sized terms (a later relu mask zeroes them).
    dH = dH.astype(fd, copy=False)
    dH += (dHn - Hn * radial[:, None]) * inv[:, None]
    return dH, dbeta


def _row_normalize(H):
    return pointwise.row_normalize(H, _NORM_EPS)


def _row_normalize_bound(H, keep=False):
    return pointwise.row_normalize_bound(H, _NORM_EPS, recycle=True)


def _cosine(E, V, Q, K, beta):
    return engine.fused(E.matrix, V, 1, "cosine", None, None, Q, K, beta, 0.2, 0.0, None)


def _cosine_bound(E, V, Q, K, beta, keep=False):
    return engine.fused_bound(E.matrix, V, 1, "cosine", 0.2, 0.0, recycle=True)


def _cosine_grads(E, V, G, out, Q, K, beta, lse):
    return engine.fused_backward(E.matrix, V, G, out, lse, 1, "cosine", None, None, Q, K, beta, 0.2, 0.0, None)


def _cosine_grads_bound(E, V, G, out, Q, K, beta, lse, keep=False):
    if not G.flags.c_contiguous:  # (the general pass copies it)
        return None
    return engine.fused_backward_bound(E.matrix, V, 1, "cosine", 0.2, 0.0, keep=keep, recycle=True)


def _row_normalize_grad(dV, dQ, dK, Hn, norm, shares):
    return pointwise.row_normalize_grad(dV, dQ, dK, Hn, norm, _NORM_EPS, shares)


def _row_normalize_grad_bound(dV, dQ, dK, Hn, norm, shares, keep=False):
    return pointwise.row_normalize_grad_bound(Hn, _NORM_EPS, shares, recycle=True)


#: AGNN's primitives (:class:`._record.Op`) on the fused path: the rows normalised, the cosine attention pass, its
#: vjp (``(dV, dQ, dK, the temperature's shares)``), the normalisation's vjp with the shares summed.
ROW_NORMALIZE = Op(_row_normalize, _row_normalize_bound)
COSINE = Op(_cosine, _cosine_bound)
COSINE_GRADS = Op(_cosine_grads, _cosine_grads_bound)
ROW_NORMALIZE_GRAD = Op(_row_normalize_grad, _row_normalize_grad_bound)


def _scored_mm(H, W, a_src, a_dst, heads):
    return dense.dense_mm(H, W, None, a_src, a_dst, heads)


def _scored_mm_bound(H, W, a_src, a_dst, heads, keep=False):
    return dense.dense_mm_bound(H, W, None, a_src, a_dst, heads)


def _head_dots_bound(X, a_src, a_dst, heads, keep=False):
    return pointwise.head_dots_bound(X, heads, recycle=True)


def _seed_bound(rng, keep=False):
    cp = sys.modules.get("cupy")
    if cp is None or not isinstance(rng, cp.random.Generator):  # (a host generator's seed is made on the host)
        return _draw_seed
    return pointwise.draw_bound(1)


def _additive(E, heads, slope, dropout, V, s_src, s_dst, b, seed):
    return engine.fused(E.matrix, V, heads, "additive", s_src, s_dst, None, None, None, slope, dropout, seed, b)


def _additive_bound(E, heads, slope, dropout, V, s_src, s_dst, b, seed, keep=False):
    if b is not None and not b.flags.c_contiguous:  # (the general pass copies it)
        return None
    return engine.fused_bound(E.matrix, V, heads, "additive", slope, dropout, b is not None, recycle=True)


def _additive_grads(E, heads, slope, dropout, V, G, out, s_src, s_dst, lse, seed):
    return engine.fused_backward(E.matrix, V, G, out, lse, heads, "additive", s_src, s_dst, None, None, None, slope,
                                 dropout, seed)


def _additive_grads_bound(E, heads, slope, dropout, V, G, out, s_src, s_dst, lse, seed, keep=False):
    if not G.flags.c_contiguous:  # (the general pass copies it)
        return None
    return engine.fused_backward_bound(E.matrix, V, heads, "additive", slope, dropout, keep=keep, recycle=True)


def _head_dots_grad_bound(dX, ds_src, ds_dst, a_src, a_dst, heads, keep=False):
    return pointwise.head_dots_grad_bound(dX, heads, keep=keep)


def _head_blocks_bound(R_src, R_dst, heads, keep=False):
    return pointwise.head_blocks_bound(R_src, heads, recycle=True)


#: GAT's primitives on the fused path: the product with the scores in its epilogue (else the product and one read
#: of X for the scores), the dropout seed, the additive attention pass (the bias added as it stores), its vjp, the
#: scores' vjp added to dX, the heads' diagonal blocks.
SCORED_MM = Op(_scored_mm, _scored_mm_bound)
HEAD_DOTS = Op(pointwise.head_dots, _head_dots_bound)
SEED = Op(_draw_seed, _seed_bound)
ADDITIVE = Op(_additive, _additive_bound)
ADDITIVE_GRADS = Op(_additive_grads, _additive_grads_bound)
HEAD_DOTS_GRAD = Op(pointwise.head_dots_grad, _head_dots_grad_bound)
HEAD_BLOCKS = Op(pointwise.head_blocks, _head_blocks_bound)
