"""Layer 2: the attention family on the GPU -- the fused forward and backward launches of graph attention, the
work units and CSR-order weights they read (per tiling, made once), and the kernels' reach.

:func:`tcgnn_py.nn.graph_attention` validates, picks the path and writes the vjp; this module is the one place
the ``"attention"`` kernels' arguments are written (:mod:`tcgnn_py.kernels.attention`).  ``T`` is a
:class:`~tcgnn_py.TiledMatrix` (its tiling, values and CSR arrays).
"""

import functools

import numpy as np

from ... import _reference as ref
from ..._device import get_cupy
from ...kernels import attention as ka
from ...kernels.attention import attention_unit
from ...kernels.launches import Scratch, make
from .._launch import made
from .._plans import build_plan, sm_count
from .._values import values_form

__all__ = ["csr_structure", "transpose_structure", "work_units", "csr_weights", "fused", "fused_backward", "reach",
           "fused_bound", "fused_backward_bound",
           "WEIGHTS_KEEP", "FILL_WARPS"]


def csr_structure(T):
    """``(indices, indptr, rows, cols)``: the CSR columns and row pointers, and each tiled entry's row and column
    (per tiling, made once)."""
    def build():
        _, indices, indptr = T.csr_arrays()
        rows, cols = T.tiling.rows_cols()
        return indices.astype(np.int32), indptr.astype(np.int32), rows.astype(np.int32), cols.astype(np.int32)

    return T.tiling.cached("attention_structure", build)


def transpose_structure(T):
    """``(indptr, rows, eids)`` of Aᵀ's CSR: per column j its entries' rows in ascending order, and each entry's
    CSR id in A (per tiling, made once; the fused backward's column pass)."""
    def build():
        xp = np if T.device == "cpu" else get_cupy()
        indices, indptr, _, _ = csr_structure(T)
        n, k = T.shape
        rows = ref.edge_rows(indptr, indices.shape[0]).astype(np.int64)
        order = xp.argsort(indices.astype(np.int64) * max(n, 1) + rows)  # unique keys: one order
        t_indptr = xp.zeros(k + 1, np.int32)
        t_indptr[1:] = xp.cumsum(xp.bincount(indices, minlength=k))
        return t_indptr, rows[order].astype(np.int32), order.astype(np.int32)

    return T.tiling.cached("attention_transpose", build)


def work_units(T, kind, heads):
    """``(units, k0, n_slots)`` of a fused pass over A's rows (``kind="rows"``) or Aᵀ's (``"cols"``) for
    ``heads`` heads, per tiling and part size.

    ``units`` int4 rows ``(owner, first entry, end entry, slot or -1)``: an owner of more than
    ``attention_unit(heads, fills)`` entries (``fills``: the owners' warps fill the GPU) is cut into parts of that
    many, each writing its partial results to a slot (an owner's slots are consecutive); ``k0`` int2 rows ``(the
    owner's first slot, its parts)``, by which the owner's last part to finish merges them in part order.  Units
    come longest first.
    """
    owners = T.shape[0] if kind == "rows" else T.shape[1]
    unit = attention_unit(heads, owners * heads >= FILL_WARPS * sm_count(T.tiling))

    def build():
        xp = get_cupy()
        ptr = csr_structure(T)[1] if kind == "rows" else transpose_structure(T)[0]
        # the products' work plan, parts of ``unit`` entries (no cap on an owner's parts)
        plan = build_plan(xp, ptr, unit, np.iinfo(np.int32).max, even=False)
        units = plan["units"]
        length = (units[:, 2] - units[:, 1]).astype(np.int64)
        uid = xp.arange(units.shape[0], dtype=np.int64)
        # longest units first (ties in owner order; unique keys, one order): a block's warps, of similar lengths,
        # end together, so its slots free for the next block rather than waiting on one long warp
        order = xp.argsort((unit - length) * uid.shape[0] + uid)
        return units[order], plan["unit_k0"][order], plan["n_slots"]

    return T.tiling.cached(("attention_units", kind, unit), build)


#: Warps an SM holds (2048 threads on sm_80 and sm_90): a pass of fewer warps per SM leaves it idle, and runs as
#: long as its longest part.
FILL_WARPS = 64


def _bound(T, w, key, template, stream):
    """The bound launch (:meth:`~tcgnn_py.kernels.launches.Launch.bind`) of one pass signature, kept on T's tiling:
    a training step's passes write only their operands' addresses (a pass takes about twenty arguments).

    ``key`` names the kernel and every fixed argument but the weights ``w`` (a :func:`csr_weights` array, matched
    by identity) and the ``stream`` (CuPy's, whose scratch the launch holds); ``template()`` returns the pass's
    :class:`~tcgnn_py.kernels.launches.Launch`.  Kept in the tiling's store of bound calls, but under a capture,
    whose weights and scratch are the graph's own.
    """
    kept = T.tiling.bound()
    key = ("attention",) + key + (id(w), stream.ptr)
    hit = kept.get(key)
    if hit is not None and hit[0] is w:
        return hit[1]
    bound = template().bind()
    kept.put(key, (w, bound), (get_cupy().cuda.runtime.getDevice(), stream.ptr), stream.is_capturing())
    return bound


def _scratch(T, kind, shape, stream, dtype=np.float32, zeros=False):
    """A buffer that one call's passes share (the long owners' parts and their counters): the products' per-stream
    :class:`~tcgnn_py.kernels.launches.Scratch`, kept on the tiling, since calls on one stream run in order; a new one
    under a capture, whose graph keeps it.  ``zeros``: it starts at zero (counters, which each pass leaves so)."""
    if stream.is_capturing():
        return (get_cupy().zeros if zeros else get_cupy().ndarray)(shape, dtype)
    return Scratch(kind, shape, dtype, zeros).get(T.tiling.cached("attention_scratch", dict), stream.ptr)


def _parts(T, kind, n_slots, width, counters, stream):
    """``(part, counters)`` of a pass whose long owners fill ``n_slots`` slots of ``width`` floats (``counters``:
    how many counters they count with), or null pointers (None) where no owner is long."""
    if not n_slots:
        return None, None
    return (_scratch(T, f"{kind} part", (n_slots, width), stream),
            _scratch(T, f"{kind} counters", (counters,), stream, np.int32, zeros=True))


def _grid(warps):
    return -(-warps // ka.ATTENTION_WARPS)


@functools.cache
def _names(dtype, kid, D):
    """``(forward, (backward by rows, by columns))`` kernel names for V of ``dtype``, scores ``kid`` and heads of
    ``D`` features (asked per call, so kept rather than rebuilt from configs and dtype names)."""
    name = np.dtype(dtype).name
    return (ka.attention_config(name, kid, D).name,
            tuple(ka.attention_bwd_config(name, kid, mode, D).name for mode in (0, 1)))


def fused_backward(T, V, g, out, lse, heads, score, s_src, s_dst, Q, K, beta, slope, dropout, seed, into=None,
                   work=None):
    """The fused backward on the GPU: a pass over the rows, which also writes each entry's two factors, and one over
    the columns, which sums them; each with its long owners cut into parts, which the owner's last part to finish
    sums.  ``(dV, ds_src, ds_dst)`` for ``"additive"``, ``(dV, dQ, dK, dbeta shares)`` for ``"cosine"``: the
    temperature's gradient as one share per row unit, which the caller sums in order (the training family's
    one-launch sum, a sibling this family does not import).  The operands as the kernels read them, then
    :func:`fused_backward_bound`'s passes.  ``into``: the arrays the passes write ``dV`` (float32) and
    ``(ds_src, ds_dst)`` or ``(dQ, dK)`` into (a caller's buffers, as C-contiguous float32 of their shapes);
    ``work``: the factors' working array (float32, ``(nnz * heads, 2)``), a caller's buffer too."""
    cp = get_cupy()
    f32 = np.float32
    V = cp.ascontiguousarray(V)
    G = cp.ascontiguousarray(g, V.dtype)
    seed = (cp.ascontiguousarray(seed, np.uint32),) if dropout else ()
    run = fused_backward_bound(T, V, heads, score, slope, dropout)
    if score == "additive":
        dV, ds_src, ds_dst = run(V, G, out, cp.ascontiguousarray(s_src, f32), cp.ascontiguousarray(s_dst, f32), lse,
                                 *seed, into=into, work=work)
        return dV.astype(V.dtype, copy=False), ds_src, ds_dst
    dV, dQ, dK, dbeta = run(V, G, out, cp.ascontiguousarray(Q, V.dtype), cp.ascontiguousarray(K, V.dtype),
                            cp.ascontiguousarray(beta, f32), lse, *seed, into=into, work=work)
    return dV.astype(V.dtype, copy=False), dQ, dK, dbeta


def _pass(name, n_heads, D, units, k0, part, counters, operands, **fixed):
    """One pass's :class:`~tcgnn_py.kernels.launches.Launch`: a warp per owner (part) and each of ``n_heads`` heads
    over ``units``, the long owners' ``part`` and ``counters`` fixed (the stream's), ``operands`` what each call
    passes."""
    nu = int(units.shape[0])
    return make("attention", name, _grid(nu * n_heads), 32 * ka.ATTENTION_WARPS, operands,
                dict(units=units, part=part, k0s=k0, counters=counters, n_units=nu, D=int(D), **fixed))


def _rows_template(T, name, w, heads, D, slope, dropout, additive, stream):
    """The backward rows pass: each call passes ``V, G, out``, the scores' operands, ``lse``, the outputs (``ds``;
    or ``dQ`` and the dbeta shares), the factors and the seed.  The long rows' parts and counters are the
    stream's, fixed in the launch."""
    units, k0, n_slots = work_units(T, "rows", heads)
    part, counters = _parts(T, "bwd rows", n_slots, heads if additive else D, n_slots * heads, stream)
    seed = ("seed",) if dropout else ()
    fixed = dict(partners=csr_structure(T)[0], weights=w, drop_p=dropout, **({} if dropout else {"seed": None}))
    if additive:
        return _pass(name, heads, D, units, k0, part, counters,
                     ("V", "G", "O", "s_src", "s_dst", "lse", "ds", "fac") + seed, heads=int(heads), slope=slope,
                     **fixed)
    return _pass(name, heads, D, units, k0, part, counters,
                 ("V", "G", "O", "Q", "K", "beta", "lse", "dQ", "dbeta", "fac") + seed, **fixed)


def _cols_template(T, name, w, heads, D, additive, stream):
    """The backward columns pass: each call passes the factors, the partners' rows (``G``, and ``Q`` for cosine
    scores), ``dV`` and the other output (``ds_src`` or ``dK``, as ``dX``).  The long columns' parts and
    counters are the stream's, fixed in the launch."""
    units, k0, n_slots = work_units(T, "cols", heads)
    part, counters = _parts(T, "bwd cols", n_slots, heads + heads * D if additive else 2 * D, n_slots * heads,
                            stream)
    _, rows, eids = transpose_structure(T)
    operands = ("fac", "G") + (() if additive else ("Q",)) + ("dV", "dX")
    return _pass(name, heads, D, units, k0, part, counters, operands, partners=rows, eids=eids,
                 weights=w, heads=int(heads), **({"Q": None} if additive else {}))


#: CSR-order weights kept per tiling, for the latest distinct value arrays (matrices sharing the tiling).
WEIGHTS_KEEP = 4


def csr_weights(T, dtype):
    """The entries' values in CSR order, as ``dtype`` (the softmax weights): made once per values array and
    dtype, and kept on the tiling with the values (a training step does not rebuild them)."""
    dtype = np.dtype(dtype)

    def build(values):
        w = T.tiling.xp.empty(values.shape[0], dtype)
        w[T.tiling.perm] = values  # tiled entry e is CSR entry perm[e]
        return w

    return values_form(T.tiling, ("attention_weights", dtype.char), T.values, build, WEIGHTS_KEEP)


def fused(T, V, heads, score, s_src, s_dst, Q, K, beta, slope, dropout, seed, bias=None, into=None):
    """``(out, lse)`` on the GPU: one warp per row, or per part of a long row, whose last part to finish merges the
    row's parts (:mod:`tcgnn_py.kernels.attention`).  The operands as the kernel reads them, then
    :func:`fused_bound`'s pass.  With a ``bias`` (additive scores), ``(out, lse, out + bias)``: added as the pass
    stores ``out`` where V and the bias are float32 (the bits of the sum), else after it.  ``into``: the arrays
    ``(out, lse)`` the pass writes (a caller's buffers, as C-contiguous arrays of the results' shapes and dtypes;
    without a bias)."""
    cp = get_cupy()
    n, HD = T.shape[0], V.shape[1]
    if bias is not None:
        if V.dtype != np.float32 or bias.dtype != np.float32 or not n:
            out, lse = fused(T, V, heads, score, s_src, s_dst, Q, K, beta, slope, dropout, seed)
            return out, lse, out + bias.astype(out.dtype, copy=False)
        f32 = np.float32
        seed = (cp.ascontiguousarray(seed, np.uint32),) if dropout else ()
        V = cp.ascontiguousarray(V)
        return fused_bound(T, V, heads, score, slope, dropout, with_bias=True)(
            V, cp.ascontiguousarray(s_src, f32), cp.ascontiguousarray(s_dst, f32), cp.ascontiguousarray(bias), *seed)
    if n == 0:
        return into or (cp.ndarray((0, HD), V.dtype), cp.ndarray((0, heads), np.float32))
    f32 = np.float32
    V = cp.ascontiguousarray(V)
    if score == "additive":
        scores = (cp.ascontiguousarray(s_src, f32), cp.ascontiguousarray(s_dst, f32))
    else:
        scores = (cp.ascontiguousarray(Q, V.dtype), cp.ascontiguousarray(K, V.dtype), cp.ascontiguousarray(beta, f32))
    seed = (cp.ascontiguousarray(seed, np.uint32),) if dropout else ()
    return fused_bound(T, V, heads, score, slope, dropout)(V, *scores, *seed, into=into)


def fused_bound(T, V, heads, score, slope, dropout, with_bias=False, recycle=False):
    """:func:`fused` for operands of this signature, already as the kernel reads them (C-contiguous; the scores
    float32, Q and K of V's dtype, the seed uint32), as ``f(V, s_src, s_dst[, seed])`` or ``f(V, Q, K, beta[,
    seed])`` -> ``(out, lse)``, its pass bound now (a bound layer call's, whose key proves the signature; the
    general call's, after its conversions); a call's ``into=(out, lse)`` are arrays the pass writes instead.  None
    for a graph without rows.

    ``with_bias`` (additive scores): ``f(V, s_src, s_dst, b[, seed]) -> (out, lse, out + b)``, the pass adding a
    layer's bias (float32, one value per feature) as it stores ``out`` (a launch less than adding it after).
    ``recycle``: the results are :func:`~tcgnn_py.products._launch.recycled` (a bound layer call's)."""
    cp = get_cupy()
    n, HD = T.shape[0], V.shape[1]
    if not n:
        return None
    additive = score == "additive"
    biased = with_bias and additive
    name, _ = _names(V.dtype, ka.ADDITIVE if additive else ka.COSINE, HD // heads)
    stream = cp.cuda.get_current_stream()
    w = csr_weights(T, np.float32)
    bound = _bound(T, w, ("fwd", name, heads, slope, dropout, biased),
                   lambda: _fwd_template(T, name, w, heads, HD // heads, slope, dropout, additive, stream, biased),
                   stream)
    dtype, f32 = V.dtype, np.float32
    shape, lse_shape = (n, HD), (n, heads)
    make = made(((shape, dtype), (lse_shape, f32)) + (((shape, dtype),) if biased else ()),
                "recycle" if recycle else "new")
    if biased:
        def scored_biased(V, s_src, s_dst, b, seed=None):
            out, lse, out_b = make()
            if seed is None:
                bound(V, s_src, s_dst, out, lse, b, out_b)
            else:
                bound(V, s_src, s_dst, out, lse, seed, b, out_b)
            return out, lse, out_b

        return scored_biased
    if not additive:
        def cosine(V, Q, K, beta, *seed, into=None):
            out, lse = into or make()
            bound(V, Q, K, beta, out, lse, *seed)
            return out, lse

        return cosine

    def scored(V, s_src, s_dst, seed=None, into=None):
        out, lse = into or make()
        bound(V, s_src, s_dst, out, lse) if seed is None else bound(V, s_src, s_dst, out, lse, seed)
        return out, lse

    return scored


def fused_backward_bound(T, V, heads, score, slope, dropout, keep=False, recycle=False):
    """:func:`fused_backward` for operands of this signature, already as the kernels read them (as
    :func:`fused_bound`; g C-contiguous of V's dtype), as ``f(V, G, out, s_src, s_dst, lse[, seed]) -> (dV,
    ds_src, ds_dst)`` or ``f(V, G, out, Q, K, beta, lse[, seed]) -> (dV, dQ, dK, dbeta shares)``, dV float32,
    its passes bound now (a bound layer call's, whose key proves the signature; the general call's, after its
    conversions).  A graph without rows has no rows pass, one without columns no columns pass.

    ``keep``: the results and the passes' working array are arrays made now, written anew by every call, for a
    caller that reads them before its next call on this stream (calls on one stream run in order); else
    ``recycle``: the results are :func:`~tcgnn_py.products._launch.recycled` (a bound layer call's).  A call's
    ``into=(dV, ds_src, ds_dst)`` or ``(dV, dQ, dK)`` and ``work`` (the factors' working array, ``(nnz * heads,
    2)`` float32) are arrays the passes write instead, each made anew where not given (the cosine shares too)."""
    cp = get_cupy()
    n, k = T.shape
    HD = V.shape[1]
    D = HD // heads
    f32 = np.float32
    stream = cp.cuda.get_current_stream()
    w = csr_weights(T, f32)
    additive = score == "additive"
    rows_name, cols_name = _names(V.dtype, ka.ADDITIVE if additive else ka.COSINE, D)[1]
    none = lambda *arrays: None  # noqa: E731  (a pass without owners)
    rows = none if not n else _bound(T, w, ("bwd rows", rows_name, heads, slope, dropout),
                                     lambda: _rows_template(T, rows_name, w, heads, D, slope, dropout, additive,
                                                            stream), stream)
    cols = none if not k else _bound(T, w, ("bwd cols", cols_name, heads),
                                     lambda: _cols_template(T, cols_name, w, heads, D, additive, stream), stream)
    fac_shape = (w.shape[0] * heads, 2)
    shares = (work_units(T, "rows", heads)[0].shape[0] if n else 0,)  # (cosine: a share per row unit)
    shapes = ((k, HD), fac_shape) + (((n, heads), (k, heads)) if additive else ((n, D), (k, D), shares))
    # the arrays: new, (keep) the ones made now, or (recycle) the call's results again
    make = made([(shape, f32) for shape in shapes], "keep" if keep else "recycle" if recycle else "new")
    if additive:
        def scored(V, G, out, s_src, s_dst, lse, *seed, into=None, work=None):
            if into is None and work is None:
                dV, fac, ds_dst, ds_src = make()
            else:
                dV, ds_src, ds_dst = into or [cp.ndarray(shapes[i], f32) for i in (0, 3, 2)]
                fac = cp.ndarray(fac_shape, f32) if work is None else work
            rows(V, G, out, s_src, s_dst, lse, ds_dst, fac, *seed)
            cols(fac, G, dV, ds_src)
            return dV, ds_src, ds_dst

        return scored

    def cosine(V, G, out, Q, K, beta, lse, *seed, into=None, work=None):
        if into is None and work is None:
            dV, fac, dQ, dK, dbeta = make()
        else:
            dV, dQ, dK = into or [cp.ndarray(shapes[i], f32) for i in (0, 2, 3)]
            fac = cp.ndarray(fac_shape, f32) if work is None else work
            dbeta = cp.ndarray(shares, f32)
        rows(V, G, out, Q, K, beta, lse, dQ, dbeta, fac, *seed)
        cols(fac, G, Q, dV, dK)
        return dV, dQ, dK, dbeta

    return cosine


def _fwd_template(T, name, w, heads, D, slope, dropout, additive, stream, biased=False):
    """The forward pass: each call passes ``V``, the scores' operands, ``out, lse``, the seed, and (``biased``) a
    bias and the biased result.  The long rows' parts and counters are the stream's, fixed in the launch."""
    units, k0, n_slots = work_units(T, "rows", heads)
    part, counters = _parts(T, "fwd", n_slots, 2 * heads + heads * D, n_slots * heads, stream)
    scores = ("s_src", "s_dst") if additive else ("Q", "K", "beta")
    operands = ("V",) + scores + ("out", "lse") + (("seed",) if dropout else ()) + (("bias", "biased") if biased
                                                                                     else ())
    unused = {n: None for n in ("s_src", "s_dst", "Q", "K", "beta", "seed", "bias", "biased") if n not in operands}
    return _pass(name, heads, D, units, k0, part, counters, operands, indices=csr_structure(T)[0],
                 weights=w, heads=int(heads), slope=slope, drop_p=dropout, **unused)


@functools.cache
def _takes(dtype):
    return np.dtype(dtype).name in ("float32", "float16", "bfloat16")


def reach(V, heads, score, Q=None):
    """None where the fused kernels take these operands, else why not (a sentence for the fallback's warning)."""
    if not _takes(V.dtype):
        return f"the fused kernels take float32, float16 and bfloat16 features, not {V.dtype}"
    if heads > ka.ATTENTION_MAX_HEADS:
        return f"the fused kernels take at most {ka.ATTENTION_MAX_HEADS} heads, not {heads}"
    if V.shape[1] // heads > 32 * ka.ATTENTION_CHUNKS[-1]:
        return (f"the fused kernels take at most {32 * ka.ATTENTION_CHUNKS[-1]} features per head, "
                f"not {V.shape[1] // heads}")
    if score == "cosine" and (Q.dtype != V.dtype or Q.shape[1] != V.shape[1]):
        return "the fused cosine kernel takes Q and K of V's dtype and width"
    return None
