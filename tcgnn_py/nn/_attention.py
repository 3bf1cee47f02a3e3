"""Layer 4: graph attention in one pass per row (scores, softmax and aggregation fused), and the GAT layer.

On the GPU both passes run the ``"attention"`` kernels (:mod:`tcgnn_py.kernels.attention`): the scores never
reach global memory, each row keeps one log-sum-exp per head, and the backward pass recomputes the attention
from it in a pass over A's rows and one over Aᵀ's.  On the CPU (and beyond the kernels' reach) the NumPy
reference runs (:func:`tcgnn_py._reference.attention`); ``fused=False`` runs the unfused sequence on the
library's SpMM and SDDMM, for comparison.
"""

import numpy as np

from .. import _reference as ref
from .._device import get_cupy
from .._validation import is_half
from ._edges import TiledEdges, array_on, edges_of
from ._layers import check_2d, column_sums, mm

__all__ = ["graph_attention", "gat_conv", "agnn_conv", "SCORES"]

#: ``normalize`` divides by ``max(||h||, _NORM_EPS)`` (PyTorch's F.normalize rule).
_NORM_EPS = 1e-12

#: The attention scores :func:`graph_attention` fuses.
SCORES = ("additive", "cosine")


def _structure(T):
    """``(indices, indptr, rows, cols)``: the CSR columns and row pointers, and each tiled entry's row and column
    (per tiling, made once)."""
    def build():
        _, indices, indptr = T.csr_arrays()
        rows, cols = T.tiling.rows_cols()
        return indices.astype(np.int32), indptr.astype(np.int32), rows.astype(np.int32), cols.astype(np.int32)

    return T.tiling.cached("attention_structure", build)


def _transpose_structure(T):
    """``(indptr, rows, eids)`` of Aᵀ's CSR: per column j its entries' rows in ascending order, and each entry's
    CSR id in A (per tiling, made once; the fused backward's column pass)."""
    def build():
        xp = np if T.device == "cpu" else get_cupy()
        indices, indptr, _, _ = _structure(T)
        n, k = T.shape
        rows = ref.edge_rows(indptr, indices.shape[0]).astype(np.int64)
        order = xp.argsort(indices.astype(np.int64) * max(n, 1) + rows)  # unique keys: one order
        t_indptr = xp.zeros(k + 1, np.int32)
        t_indptr[1:] = xp.cumsum(xp.bincount(indices, minlength=k))
        return t_indptr, rows[order].astype(np.int32), order.astype(np.int32)

    return T.tiling.cached("attention_transpose", build)


def _units(T, kind, heads):
    """``(units, splits, n_slots)`` of a fused pass over A's rows (``kind="rows"``) or Aᵀ's (``"cols"``) for
    ``heads`` heads, per tiling and part size.

    ``units`` int4 rows ``(owner, first entry, end entry, slot or -1)``: an owner of more than
    ``attention_unit(heads)`` entries is cut into parts of that many, each writing its partial results to a slot;
    ``splits`` int4 rows ``(owner, first slot, parts, 0)`` for the merge, in owner order.
    """
    from ..kernels.attention import attention_unit

    unit = attention_unit(heads)

    def build():
        xp = get_cupy()
        ptr = (_structure(T)[1] if kind == "rows" else _transpose_structure(T)[0]).astype(np.int64)
        deg = xp.diff(ptr)
        parts = xp.maximum(-(-deg // unit), 1)
        uptr = xp.concatenate([xp.zeros(1, np.int64), xp.cumsum(parts)])
        uid = xp.arange(int(uptr[-1]), dtype=np.int64)  # synchronize! once per tiling, kind and part size
        owner = xp.searchsorted(uptr, uid, side="right") - 1
        start = ptr[owner] + (uid - uptr[owner]) * unit
        end = xp.minimum(start + unit, ptr[owner + 1])
        split = parts[owner] > 1
        slot = xp.where(split, xp.cumsum(split) - 1, -1)
        units = xp.stack([owner, start, end, slot], axis=1).astype(np.int32)
        so = xp.flatnonzero(parts > 1)
        splits = xp.stack([so, slot[uptr[so]], parts[so], xp.zeros_like(so)], axis=1).astype(np.int32)
        return units, splits, int(split.sum())  # synchronize!

    return T.tiling.cached(("attention_units", kind, unit), build)


#: A null device pointer: the kernels read no argument their kind or settings leave unused (no per-call dummy).
_NULL = np.uint64(0)


def _fused_backward(T, V, g, out, lse, heads, score, s_src, s_dst, Q, K, beta, slope, dropout, seed):
    """The fused backward on the GPU: a pass over the rows and one over the columns, each with its long owners cut
    into parts and merged.  ``(dV, ds_src, ds_dst)`` for ``"additive"``, ``(dV, dQ, dK, dbeta)`` for ``"cosine"``."""
    from ..kernels import attention as ka
    from ..kernels.registry import get_kernel

    cp = get_cupy()
    n, k = T.shape
    HD = V.shape[1]
    D = HD // heads
    f32 = np.float32
    G = cp.ascontiguousarray(g, V.dtype)
    tdot = cp.empty((n, heads), f32)  # <g_i, out_i> per head: the rows pass writes it, the columns pass reads it
    indices = _structure(T)[0]
    _, t_rows, t_eids = _transpose_structure(T)
    w = _weights_csr(T, f32)
    V = cp.ascontiguousarray(V)
    seed = cp.ascontiguousarray(seed, np.uint32) if dropout else _NULL
    dV = cp.empty((k, HD), f32)
    additive = score == "additive"
    kid = ka.ADDITIVE if additive else ka.COSINE
    if additive:
        ss, sd = cp.ascontiguousarray(s_src, f32), cp.ascontiguousarray(s_dst, f32)
        ds_dst, ds_src = cp.empty((n, heads), f32), cp.empty((k, heads), f32)
        # per mode: the kernel's outputs, and the merge's (slot width, out0, w0, out1, w1)
        outs = ((ds_dst, (heads + HD, ds_dst, heads, _NULL, 0)), (ds_src, (heads + HD, ds_src, heads, dV, HD)))
        head = (w, V, G, out, ss, sd, lse, tdot, dV)
        tail = (np.int32(heads), np.int32(D), f32(slope), f32(dropout), seed)
    else:
        Qc, Kc = cp.ascontiguousarray(Q, V.dtype), cp.ascontiguousarray(K, V.dtype)
        dQ, dK = cp.empty((n, D), f32), cp.empty((k, D), f32)
        dbeta = cp.zeros(1, f32)
        outs = ((dQ, (D, dQ, D, _NULL, 0)), (dK, (2 * D, dV, D, dK, D)))
        head = (w, V, G, out, Qc, Kc, cp.ascontiguousarray(beta, f32), lse, tdot, dV)
        tail = (np.int32(D), f32(dropout), seed)
    block = (32 * ka.ATTENTION_WARPS,)
    for mode, (kind, partners, eids) in enumerate((("rows", indices, _NULL), ("cols", t_rows, t_eids))):
        units, splits, n_slots = _units(T, kind, heads)
        if not units.shape[0]:
            continue
        out_k, (width, out0, w0, out1, w1) = outs[mode]
        part = cp.empty((n_slots, width), f32) if n_slots else _NULL
        nu = np.int32(units.shape[0])
        if additive:
            extra = (out_k, part, nu)
        else:
            dbp = cp.empty(units.shape[0], f32) if mode == 0 else _NULL  # the row units' shares of dbeta
            extra = (out_k, dbp, part, nu)
        warps = units.shape[0] * heads  # a warp per owner and head
        get_kernel("attention", ka.attention_bwd_config(V.dtype.name, kid, mode, D).name)(
            (-(-warps // ka.ATTENTION_WARPS),), block, (units, partners, eids) + head + extra + tail)
        if splits.shape[0]:
            get_kernel("attention", ka.BWD_MERGE)(
                (-(-splits.shape[0] // ka.ATTENTION_WARPS),), block,
                (splits, part, out0, out1, np.int32(splits.shape[0]), np.int32(width), np.int32(w0), np.int32(w1)))
        if not additive and mode == 0:
            dbeta = dbp.sum(keepdims=True)  # a fixed-order reduction: deterministic
    dV = dV.astype(V.dtype, copy=False)
    return (dV, ds_src, ds_dst) if additive else (dV, dQ, dK, dbeta)


#: CSR-order weights kept per tiling, for the latest distinct value arrays (matrices sharing the tiling).
_WEIGHTS_KEEP = 4


def _weights_csr(T, dtype):
    """The entries' values in CSR order, as ``dtype`` (the softmax weights): made once per values array and
    dtype, and kept on the tiling with the values (a training step does not rebuild them)."""
    values, dtype = T.values, np.dtype(dtype)
    kept = T.tiling.cached("attention_weights", dict)
    hit = kept.get((id(values), dtype.char))
    if hit is not None and hit[0] is values:
        return hit[1]
    xp = np if T.device == "cpu" else get_cupy()
    w = xp.empty(values.shape[0], dtype)
    w[T.tiling.perm] = values  # tiled entry e is CSR entry perm[e]
    if xp is not np and xp.cuda.get_current_stream().is_capturing():
        return w  # the graph holds the scatter; its arrays must not outlive it in a cache
    if len(kept) >= _WEIGHTS_KEEP:
        del kept[next(iter(kept))]
    kept[(id(values), dtype.char)] = (values, w)
    return w


def _fused(T, V, heads, kind, s_src, s_dst, Q, K, beta, slope, dropout, seed):
    """``(out, lse)`` on the GPU: one warp per row, or per part of a long row, then the merge of those parts
    (:mod:`tcgnn_py.kernels.attention`)."""
    from ..kernels import attention as ka
    from ..kernels.registry import get_kernel

    cp = get_cupy()
    indices = _structure(T)[0]
    n, HD = T.shape[0], V.shape[1]
    kid = ka.ADDITIVE if kind == "additive" else ka.COSINE
    cfg = ka.attention_config(V.dtype.name, kid, HD // heads)  # a warp per row and head (cosine: Q as wide as V)
    out = cp.empty((n, HD), V.dtype)
    lse = cp.empty((n, heads), np.float32)
    if n == 0:
        return out, lse
    f32 = np.float32
    V = cp.ascontiguousarray(V)
    if kid == ka.ADDITIVE:
        args = (cp.ascontiguousarray(s_src, f32), cp.ascontiguousarray(s_dst, f32), _NULL, _NULL, _NULL)
    else:
        args = (_NULL, _NULL, cp.ascontiguousarray(Q, V.dtype), cp.ascontiguousarray(K, V.dtype),
                cp.ascontiguousarray(beta, f32))
    units, splits, n_slots = _units(T, "rows", heads)
    part = cp.empty((n_slots, 2 * heads + HD), f32) if n_slots else _NULL
    get_kernel("attention", cfg.name)(
        (-(-(units.shape[0] * heads) // ka.ATTENTION_WARPS),), (32 * ka.ATTENTION_WARPS,),
        (units, indices, _weights_csr(T, f32), V) + args
        + (out, lse, part, np.int32(units.shape[0]), np.int32(heads), np.int32(HD // heads), f32(slope),
           f32(dropout), cp.ascontiguousarray(seed, np.uint32) if dropout else _NULL))
    if splits.shape[0]:
        get_kernel("attention", ka.MERGE_NAMES[V.dtype.name])(
            (-(-splits.shape[0] // ka.ATTENTION_WARPS),), (32 * ka.ATTENTION_WARPS,),
            (splits, part, out, lse, np.int32(splits.shape[0]), np.int32(heads), np.int32(HD // heads)))
    return out, lse


def graph_attention(A, V, *, heads=1, score="additive", s_src=None, s_dst=None, Q=None, K=None, beta=None,
                    negative_slope=0.2, dropout=0.0, seed=None, precision=None, fused=True):
    """Attention over the stored entries of each row, fused: ``out_i = sum_j softmax_j(score(i, j)) V_j``.

    For each head h, ``P_ij,h = a_ij exp(z_ij,h) / sum_k a_ik exp(z_ik,h)`` over row i's stored entries
    (``a`` A's non-negative values) and ``out[i, h] = sum_j P_ij,h V[j, h]``.  The scores ``z`` never
    reach global memory: one pass per row keeps a running maximum and sum (online softmax) and one
    log-sum-exp per row and head, from which the backward pass recomputes ``P``.

    Parameters
    ----------
    A : TiledMatrix, shape (n, k)
    V : array, shape (k, heads * D)
        Values, head by head (D features each).  The fused kernel takes float32, float16 and bfloat16 with
        ``heads <= 8`` and ``D <= 256``; other products run the unfused reference on their device.
    heads : int
    score : {"additive", "cosine"}
        ``"additive"`` (GAT): ``z_ij,h = LeakyReLU(s_dst[i, h] + s_src[j, h])``, with ``s_src`` of shape
        ``(k, heads)`` and ``s_dst`` ``(n, heads)``.  ``"cosine"`` (AGNN; one head):
        ``z_ij = beta * <Q[i], K[j]>`` with ``Q`` ``(n, d)``, ``K`` ``(k, d)`` (row-normalised by the
        caller for a cosine) and ``beta`` of shape (1,).
    negative_slope : float
        Of the LeakyReLU (``"additive"``).
    dropout : float
        Attention dropout: each entry's ``P`` is dropped with this probability after the softmax and the kept
        ones scaled by ``1 / (1 - dropout)`` (PyTorch Geometric's GATConv); the mask is a hash of the entry,
        the head and ``seed``, so the backward pass recomputes it.
    seed : array of shape (1,), uint32, optional
        On the graph's device (read there: no host read, so a CUDA graph can hold the call); needed with
        ``dropout``.
    precision : {None, "tf32", "fp32", "fp16", "bf16"}, optional
        For the unfused passes' sparse products.
    fused : bool
        False runs the sequence the fused pass replaces, one head at a time: the scores of every entry (an
        SDDMM for ``"cosine"``), an edge softmax, and SpMM; its backward pass likewise.  For comparison.

    Returns
    -------
    out : array, shape (n, heads * D)
        Of V's dtype (computed in float32 for 16-bit V).
    vjp : callable
        ``vjp(g)``: ``(dV, ds_src, ds_dst)`` for ``"additive"``, ``(dV, dQ, dK, dbeta)`` for ``"cosine"``.

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
    if type(E) is not TiledEdges:  # (a distributed view's products exchange halos: not this kernel's rows)
        raise TypeError(f"graph_attention needs a TiledMatrix, got {type(A).__name__}")
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    if not (isinstance(heads, (int, np.integer)) and heads >= 1):
        raise ValueError(f"heads must be a positive integer, got {heads!r}")
    xp, T = E.xp, E.matrix
    n, k = T.shape
    V = array_on(E, V)
    check_2d("V", V)
    if V.shape[0] != k:
        raise ValueError(f"V has {V.shape[0]} rows, the graph has {k} columns")
    if V.shape[1] % heads:
        raise ValueError(f"V's {V.shape[1]} columns are not {heads} heads of equal width")
    fd = np.dtype(np.float32) if is_half(V.dtype) else np.dtype(V.dtype)  # the softmax's dtype
    if score == "additive":
        if s_src is None or s_dst is None:
            raise TypeError("score='additive' needs s_src and s_dst")
        s_src, s_dst = array_on(E, s_src).astype(fd, copy=False), array_on(E, s_dst).astype(fd, copy=False)
        for name, s, rows in (("s_src", s_src, k), ("s_dst", s_dst, n)):
            if s.shape != (rows, heads):
                raise ValueError(f"{name} must have shape {(rows, heads)}, got {s.shape}")
    else:
        if heads != 1:
            raise ValueError(f"score='cosine' has one head, got heads={heads}")
        if Q is None or K is None or beta is None:
            raise TypeError("score='cosine' needs Q, K and beta")
        Q, K = array_on(E, Q), array_on(E, K)
        beta = xp.asarray(beta, dtype=fd).reshape(-1)
        if Q.ndim != 2 or K.ndim != 2 or Q.shape[0] != n or K.shape[0] != k or Q.shape[1] != K.shape[1]:
            raise ValueError(f"Q and K must have shapes ({n}, d) and ({k}, d), got {Q.shape} and {K.shape}")
        if beta.shape != (1,):
            raise ValueError(f"beta must be a scalar or have shape (1,), got {beta.shape}")
    slope = float(negative_slope)
    dropout = float(dropout)
    if not 0 <= dropout < 1:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if dropout and seed is None:
        raise TypeError("dropout needs seed: a one-element uint32 array on the graph's device")
    if dropout:
        seed = array_on(E, seed).astype(np.uint32, copy=False).reshape(-1)
        if seed.shape != (1,):
            raise ValueError(f"seed must have one element, got shape {seed.shape}")
    from ..kernels.attention import ATTENTION_CHUNKS, ATTENTION_MAX_HEADS

    # The kernel's reach; beyond it (float64, more heads or features) the reference runs on the device, unfused.
    gpu = (fused and xp is not np and V.dtype.name in ("float32", "float16", "bfloat16")
           and heads <= ATTENTION_MAX_HEADS and V.shape[1] // heads <= 32 * ATTENTION_CHUNKS[-1]
           and (score == "additive" or Q.dtype == V.dtype and Q.shape[1] == V.shape[1]))
    if gpu:
        out, lse = _fused(T, V, heads, score, s_src, s_dst, Q, K, beta, slope, dropout, seed)
    elif not fused:  # the sequence the fused pass replaces: scores, an edge softmax, SpMM, per head
        out, lse = _unfused(E, V, heads, score, s_src, s_dst, Q, K, beta, slope, dropout, seed, fd)
    else:  # the reference: on the CPU, and for float64 on the GPU
        indices, indptr, _, _ = _structure(T)
        out, lse = ref.attention(indptr, indices, _weights_csr(T, fd), V, heads, score, s_src=s_src,
                                 s_dst=s_dst, Q=Q, K=K, beta=beta, slope=slope, dtype=fd, dropout=dropout,
                                 seed=seed)
        out = out.astype(V.dtype, copy=False)

    def vjp(g):
        g = array_on(E, g)
        check_2d("g", g, n)
        if gpu:  # fused: recomputed per entry, no E-sized array
            return _fused_backward(T, V, g, out, lse, heads, score, s_src, s_dst, Q, K, beta, slope, dropout, seed)
        _, _, rows, cols = _structure(T)
        D = V.shape[1] // heads
        if score == "additive":
            z, pre = ref.attention_scores(rows, cols, heads, score, s_src, s_dst, slope=slope)
        else:  # the cosines by SDDMM (as the unfused pass computes them), not by gathering E x d features
            pre = E.sddmm(Q, K).astype(fd, copy=False)[:, None]
            z = beta * pre
        w = T.values.astype(fd)
        with np.errstate(divide="ignore", invalid="ignore"):
            P = xp.where((w != 0)[:, None], xp.exp(z + xp.log(w)[:, None] - lse[rows]), 0).astype(fd)
        # dropped attention: out = sum_j P_ij m_ij V_j, so dP_ij = m_ij <g_i, V_j> (m: 0 or 1 / (1 - p))
        m = ref.attention_keep(T.tiling.perm, heads, seed, dropout).astype(fd) if dropout else None
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
        if score == "additive":
            dpre = dz * xp.where(pre > 0, 1, slope).astype(fd)
            ds_dst = xp.stack([E.row_sums(xp.ascontiguousarray(dpre[:, h])) for h in range(heads)], axis=1)
            ds_src = xp.stack([E.col_sums(xp.ascontiguousarray(dpre[:, h])) for h in range(heads)], axis=1)
            return dV, ds_src, ds_dst
        dz0 = dz[:, 0]
        dbeta = (dz0 * pre[:, 0]).sum().reshape(1)
        dc = beta * dz0
        return dV, E.spmm(K.astype(fd), values=dc), E.spmm_t(Q.astype(fd), values=dc), dbeta

    return out, vjp


def gat_conv(A, H, W, a_src, a_dst, b=None, *, heads=1, concat=True, negative_slope=0.2, dropout=0.0, rng=None,
             training=True, precision=None, fused=True):
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
    fused : bool
        False runs the attention unfused (see :func:`graph_attention`), for comparison.

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
    E = edges_of(A, precision)
    xp = E.xp
    H, W = array_on(E, H), array_on(E, W)
    n = E.shape[0]
    check_2d("H", H, n)
    check_2d("W", W, H.shape[1])
    if W.shape[1] % heads:
        raise ValueError(f"W's {W.shape[1]} columns are not {heads} heads of equal width")
    D = W.shape[1] // heads
    a_src, a_dst = array_on(E, a_src), array_on(E, a_dst)
    for name, a in (("a_src", a_src), ("a_dst", a_dst)):
        if a.shape != (heads, D):
            raise ValueError(f"{name} must have shape {(heads, D)}, got {a.shape}")
    X = mm(H, W)
    fd = np.float32 if is_half(X.dtype) else X.dtype
    X3 = X.reshape(n, heads, D).astype(fd, copy=False)
    s_src = (X3 * a_src.astype(fd)).sum(axis=2)
    s_dst = (X3 * a_dst.astype(fd)).sum(axis=2)
    drop = float(dropout) if training else 0.0
    seed = None
    if drop:
        if rng is None:
            raise ValueError("attention dropout in training needs rng (tcgnn_py.nn.default_rng(seed, like=A))")
        seed = (rng.random(1) * 2.0**32).astype(np.uint32)  # drawn on rng's device: no host read
    att, att_vjp = graph_attention(E, X, heads=heads, s_src=s_src, s_dst=s_dst, negative_slope=negative_slope,
                                   dropout=drop, seed=seed, fused=fused)
    out = att if concat else att.reshape(n, heads, D).mean(axis=1)
    if b is not None:
        out = out + array_on(E, b).astype(out.dtype, copy=False)

    def vjp(g, input_grad=True):
        g = array_on(E, g)
        db = None if b is None else column_sums(g).astype(b.dtype, copy=False)
        ga = g if concat else xp.repeat(g[:, None, :] / heads, heads, axis=1).reshape(n, heads * D)
        dX, ds_src, ds_dst = att_vjp(ga)
        dX = dX.astype(fd, copy=False).reshape(n, heads, D)
        dX = dX + ds_src[:, :, None] * a_src.astype(fd) + ds_dst[:, :, None] * a_dst.astype(fd)
        # sums over the n rows as 1ᵀ M (column_sums): a reduction along the long axis is slow on the GPU
        da_src = column_sums((X3 * ds_src[:, :, None]).reshape(n, heads * D)).reshape(heads, D)
        da_dst = column_sums((X3 * ds_dst[:, :, None]).reshape(n, heads * D)).reshape(heads, D)
        da_src, da_dst = da_src.astype(a_src.dtype, copy=False), da_dst.astype(a_dst.dtype, copy=False)
        dX = dX.reshape(n, heads * D).astype(X.dtype, copy=False)
        dH = mm(dX, W.T) if input_grad else None  # (a first layer's input needs none: n x features skipped)
        return dH, mm(H.T, dX).astype(W.dtype, copy=False), da_src, da_dst, db

    return out, vjp


def _edge_softmax(E, z, xp):
    """``(P, lse)``: ``P_ij = a_ij exp(z_ij) / sum_k a_ik exp(z_ik)`` per row, stable (row max subtracted), and
    each row's ``log sum_k a_ik exp(z_ik)`` (-inf where that sum is 0): the unfused path."""
    rows = E.rows
    n = E.shape[0]
    m = xp.full(n, -np.inf, dtype=z.dtype)
    xp.maximum.at(m, rows, z)  # order-independent: deterministic
    ex = E.values.astype(z.dtype, copy=False) * xp.exp(z - m[rows])
    s = E.row_sums(ex)
    P = ex / xp.where(s > 0, s, 1)[rows]
    with np.errstate(divide="ignore", invalid="ignore"):
        return P, xp.where(s > 0, m + xp.log(xp.where(s > 0, s, 1)), -np.inf).astype(z.dtype, copy=False)


def _unfused(E, V, heads, score, s_src, s_dst, Q, K, beta, slope, dropout, seed, fd):
    """``(out, lse)`` by the unfused sequence: every entry's scores (E x heads), an edge softmax and SpMM per head."""
    xp, T = E.xp, E.matrix
    _, _, rows, cols = _structure(T)
    if score == "additive":
        z, _ = ref.attention_scores(rows, cols, heads, score, s_src, s_dst, slope=slope)
    else:
        z = beta * E.sddmm(Q, K).astype(fd, copy=False)[:, None]
    m = ref.attention_keep(T.tiling.perm, heads, seed, dropout).astype(fd) if dropout else None
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


def agnn_conv(A, H, beta, *, precision=None, fused=True):
    """Attention-based propagation (AGNN, Thekumparampil et al. 2018).

    ``out_i = sum_j P_ij h_j`` with ``P_ij = softmax_j(beta * cos(h_i, h_j))``
    over the stored entries of row i; A's values weight the softmax
    (``P_ij ∝ a_ij exp(...)``, the usual AGNN for a binary A).  The cosines,
    the softmax and the aggregation run fused (:func:`graph_attention` on
    row-normalised features), the backward pass recomputes the attention;
    ``fused=False`` runs them one after another (SDDMM, an edge softmax, SpMM),
    the sequence the fused pass replaces.

    Parameters
    ----------
    A : TiledMatrix, shape (n, n)
        Non-negative weights; usually :func:`add_self_loops` of the adjacency.
    H : array, shape (n, d)
    beta : array, shape (1,), or float
        The attention temperature (learnable).
    precision : {None, "tf32", "fp32", "fp16", "bf16"}, optional
        For the sparse products.
    fused : bool

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
    E = edges_of(A, precision)
    xp = E.xp
    H = array_on(E, H)
    check_2d("H", H, E.shape[0])
    if E.shape[0] != E.shape[1]:
        raise ValueError(f"agnn_conv needs a square graph, got shape {E.shape}")
    fd = np.float32 if is_half(H.dtype) else H.dtype  # 16-bit features: the attention runs in float32
    beta = xp.asarray(beta, dtype=fd).reshape(-1)
    if beta.shape != (1,):
        raise ValueError(f"beta must be a scalar or have shape (1,), got {beta.shape}")
    Hn, norm, inv = _normalize_rows(H, xp)

    def normalize_vjp(dH, dHn):
        # d(h / max(|h|, eps)): project out the radial part where |h| > eps.
        radial = xp.where(norm > _NORM_EPS, (Hn * dHn).sum(axis=1), 0)
        # In float32 for 16-bit H: rows of norm ~0 get 1 / eps-sized terms (a later relu mask zeroes them).
        dH = dH.astype(fd, copy=False)
        dH += (dHn - Hn * radial[:, None]) * inv[:, None]
        return dH

    if fused and type(E) is TiledEdges:  # (distributed views run the unfused sequence, whose products exchange halos)
        out, att_vjp = graph_attention(E, H, score="cosine", Q=Hn, K=Hn, beta=beta)

        def vjp(g):
            dH, dQ, dK, dbeta = att_vjp(g)
            return normalize_vjp(dH, dQ + dK), dbeta

        return out, vjp
    c = E.sddmm(Hn, Hn).astype(fd, copy=False)
    P, _ = _edge_softmax(E, beta * c, xp)
    out = E.spmm(H, values=P)

    def vjp_unfused(g):
        g = array_on(E, g)
        dH = E.spmm_t(g, values=P)
        dP = E.sddmm(g, H).astype(fd, copy=False)
        rows = E.rows
        t = E.row_sums(P * dP)
        dz = P * (dP - t[rows])
        dbeta = (dz * c).sum().reshape(1)
        dc = beta * dz
        dHn = E.spmm(Hn, values=dc) + E.spmm_t(Hn, values=dc)
        return normalize_vjp(dH, dHn), dbeta

    return out, vjp_unfused
