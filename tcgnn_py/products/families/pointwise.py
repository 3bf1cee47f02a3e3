"""Layer 2: the pointwise family on the GPU -- a layer's elementwise tail (bias, activation, dropout) and
its vjp, the softmax cross-entropy, GAT's per-head scores and head blocks, AGNN's row normalisation (each with its
vjp), a bias added in place, a sum in one fixed order and the attention's dropout seed.

The ``"nn"`` kernels' arguments are written here by parameter name (:func:`tcgnn_py.kernels.launches.make`); the
launches go straight through the driver, kept per signature, since a training step makes dozens of small ones and
CuPy's argument handling would cost more than the kernels.  :mod:`tcgnn_py.nn` validates, keeps the host path and
writes the vjps.
"""

import functools

import numpy as np

from ..._cache import keep
from ..._device import get_cupy
from ...kernels import nn as kn
from .._launch import same_array
from .. import _small as sk

__all__ = ["TAIL_TYPES", "ACTIVATIONS", "takes", "acc_dtype", "tail", "tail_grad", "cross_entropy", "index_weights",
           "add_bias", "add_bias_bound", "head_dots", "head_dots_bound", "head_dots_grad", "head_dots_grad_bound",
           "head_blocks_bound", "head_blocks", "seed_bits", "seed_bits_bound", "seed_stream", "draw",
           "draw_bound", "STREAMS_KEEP", "total", "total_bound", "segment_sum", "csr_mm",
           "row_normalize", "row_normalize_bound", "row_normalize_grad_bound", "row_normalize_grad"]

_F32 = np.dtype(np.float32)

TAIL_TYPES = kn.TAIL_TYPES


ACTIVATIONS = kn.ACTIVATIONS


@functools.cache
def takes(dtype):
    """Whether the elementwise and row-wise kernels take arrays of ``dtype`` (one of :data:`TAIL_TYPES`); asked per
    call, so answered from a cache rather than from the dtype's name."""
    return np.dtype(dtype).name in TAIL_TYPES


@functools.cache
def acc_dtype(dtype):
    """The kernels' compute type for elements of ``dtype``: float64 for float64, float32 otherwise (16-bit
    elements are computed in float32)."""
    return np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32)


def _counted(key, namer, dtype, names, arrays, fixed, count="n"):
    """Launch the grid-stride kernel ``namer(dtype)`` on ``arrays`` (named ``names``; a None one is a null
    pointer), ``fixed`` every other parameter by name, the parameter ``count`` its elements or rows: bound once per
    ``key`` for every value of ``count`` (a sampled or batched step's sizes change every step, and a launch made
    per size would cost more than its kernel)."""
    given = tuple(a is not None for a in arrays)
    _counted_launch(key, namer, dtype, names, given, fixed, count)(fixed[count], *(a for a in arrays if a is not None))


def _counted_launch(key, namer, dtype, names, given, fixed, count):
    """:func:`_counted`'s bound launch ``f(count, *given_arrays)``, kept per ``key`` and the pattern of given arrays
    (``given``: a bool per name)."""
    return sk.bound_once(key + (given,), _counted_bind, namer, dtype, names, given, fixed, count)


def _counted_bind(namer, dtype, names, given, fixed, count):
    """:func:`_counted`'s launch: the given arrays its operands, the others null pointers."""
    operands = tuple(n for n, g in zip(names, given) if g)
    nulls = {n: None for n, g in zip(names, given) if not g}
    return sk.launch(sk.name(namer, dtype), 1, sk.THREADS, operands, **dict(fixed, **nulls)).bind(
        rows=(count, sk.THREADS, sk.MAX_BLOCKS))


def tail(x, b, act, p, seed):
    """``dropout(act(x + b))`` in one pass, a new array of x's dtype: ``b`` one value per column of x or None,
    ``act`` a key of :data:`ACTIVATIONS`, ``seed`` (a float64 device draw) None for no dropout.  Arrays
    C-contiguous, of one dtype in :data:`TAIL_TYPES`."""
    out = get_cupy().ndarray(x.shape, x.dtype)  # x C-contiguous: cupy.empty_like without its wrapper
    if x.size:
        cols = x.shape[-1] if x.ndim else 1
        _counted(("tail", x.dtype, cols, act, p), kn.tail_name, x.dtype, ("x", "b", "out", "seed"), (x, b, out, seed),
                 dict(n=x.size, cols=cols, act=ACTIVATIONS[act], p=p, scale=1 / (1 - p)))
    return out


def tail_grad(g, x, b, act, p, seed):
    """The vjp of :func:`tail`: ``g`` times the recomputed mask and ``act'(x + b)`` (``x`` None without ``act``)."""
    dz = get_cupy().ndarray(g.shape, g.dtype)
    if g.size:
        cols = g.shape[-1] if g.ndim else 1
        _counted(("tail_grad", g.dtype, cols, act, p), kn.tail_grad_name, g.dtype, ("g", "x", "b", "dz", "seed"),
                 (g, x, b, dz, seed), dict(n=g.size, cols=cols, act=ACTIVATIONS[act], p=p, scale=1 / (1 - p)))
    return dz


def cross_entropy(logits, labels, w, w0):
    """``(loss, dlogits)`` of the weighted softmax cross-entropy in one launch: ``loss`` the sum of the rows'
    losses (a 0-d array of logits' dtype, in one fixed order: the same bits on every run), ``labels`` int64 (n,),
    ``w`` one weight per row (of logits' dtype) or None for ``w0`` on every row; logits C-contiguous (n, k), k >= 1.
    The blocks' partial sums and the count of finished blocks are the stream's (:func:`.._small.scratch`)."""
    cp = get_cupy()
    n, k = logits.shape
    loss = cp.ndarray((), logits.dtype)
    grad = cp.ndarray(logits.shape, logits.dtype)
    if n:
        given = (True, True, w is not None, True, True)
        f = sk.bound_once(("cross_entropy", logits.dtype, k, float(w0), given), _loss_bind, logits.dtype, k,
                          float(w0), given)
        f(n, *(a for a in (logits, labels, w, loss, grad) if a is not None))
    else:
        loss.fill(0)
    return loss, grad


def _loss_bind(dtype, k, w0, given):
    """:func:`cross_entropy`'s launch, for every row count: its partial sums and count of finished blocks the
    stream's, found here once (not per call)."""
    fixed = dict(w0=w0, n=0, k=k, P=sk.scratch("loss", (sk.MAX_BLOCKS,), acc_dtype(dtype)),
                 done=sk.scratch("loss done", (1,), np.uint32, zeros=True))
    return _counted_bind(kn.cross_entropy_name, dtype, ("logits", "labels", "w", "total", "grad"), given, fixed, "n")


def index_weights(n, index, value, dtype):
    """``w`` of ``n`` rows of ``dtype``, ``value`` on the rows ``index`` (int64, a negative one counted from the
    end, one outside ``[-n, n)`` skipped) and 0 elsewhere: one fill and one launch (a scatter costs several)."""
    w = get_cupy().zeros(n, dtype)
    if index.size:
        _counted(("index_weights", w.dtype, n, float(value)), kn.index_weights_name, w.dtype, ("w", "index"),
                 (w, index), dict(m=index.size, n=n, value=value), count="m")
    return w


def add_bias(x, b):
    """``x += b`` in place (``x`` C-contiguous of :data:`TAIL_TYPES`, ``b`` one value per column, same dtype,
    contiguous) in one launch bound per signature, no CuPy elementwise call; returns ``x``."""
    if x.size:
        _counted(("add_bias", x.dtype, x.shape[-1]), kn.add_bias_name, x.dtype, ("x", "b"), (x, b),
                 dict(n=x.size, cols=x.shape[-1]))
    return x


def add_bias_bound(x, b):
    """:func:`add_bias` for operands of the signature of these, as ``f(x, b)`` (in place, returns nothing), its
    launch bound now: a bound layer call's."""
    if not x.size:
        return lambda x, b: None
    n, cols = x.size, x.shape[-1]
    f = _counted_launch(("add_bias", x.dtype, cols), kn.add_bias_name, x.dtype, ("x", "b"), (True, True),
                        dict(n=n, cols=cols), "n")
    return lambda x, b: f(n, x, b)


def head_dots(x, a_src, a_dst, heads):
    """``(s_src, s_dst)``, each ``(n, heads)`` in :func:`acc_dtype`: per row of ``x`` (``heads`` heads of D
    features, C-contiguous) and head its dot products with that head's row of ``a_src`` and of ``a_dst``
    (``(heads, D)``, C-contiguous, of the compute type), from one read of x."""
    n = x.shape[0]
    if n and heads:
        return sk.bound_once(("head_dots", x.shape, x.dtype, heads), head_dots_bound, x, heads)(x, a_src, a_dst)
    cp, acc = get_cupy(), acc_dtype(x.dtype)
    return cp.ndarray((n, heads), acc), cp.ndarray((n, heads), acc)


def head_dots_bound(x, heads, recycle=False):
    """``f(x, a_src, a_dst) -> (s_src, s_dst)``: :func:`head_dots` for operands of the signature of these, its
    launch bound now (a bound layer call's, whose results are recycled where ``recycle``); None for an empty x."""
    n = x.shape[0]
    if not (n and heads):
        return None
    acc, shape = acc_dtype(x.dtype), (n, heads)
    make = sk.results(((shape, acc), (shape, acc)), recycle)
    bound = sk.launch(sk.name(kn.head_dots_name, x.dtype), sk.grid(n * heads), sk.THREADS,
                    ("x", "a_src", "a_dst", "s_src", "s_dst"), n=n, heads=heads, D=x.shape[1] // heads).bind()

    def f(x, a_src, a_dst):
        s_src, s_dst = make()
        bound(x, a_src, a_dst, s_src, s_dst)
        return s_src, s_dst

    return f


def head_dots_grad(g, ds_src, ds_dst, a_src, a_dst, heads):
    """``g + ds_src a_src + ds_dst a_dst`` head by head (the vjp of :func:`head_dots` added to ``g``), in the
    compute type and stored in g's dtype; ``g`` ``(n, heads * D)`` and ``ds_*`` ``(n, heads)`` C-contiguous."""
    if g.size:
        return sk.bound_once(("head_dots_grad", g.shape, g.dtype, heads), head_dots_grad_bound, g, heads)(
            g, ds_src, ds_dst, a_src, a_dst)
    return get_cupy().ndarray(g.shape, g.dtype)


def head_dots_grad_bound(g, heads, keep=False):
    """``f(g, ds_src, ds_dst, a_src, a_dst) -> dx``: :func:`head_dots_grad` for operands of the signature of these,
    its launch bound now (a bound layer call's); None for an empty g.  ``keep``: dx is one array made now."""
    if not g.size:
        return None
    shape, dtype = g.shape, g.dtype
    nd = get_cupy().ndarray
    if keep:
        nd = same_array(nd(shape, dtype))
    bound = sk.launch(sk.name(kn.head_dots_grad_name, dtype), sk.grid(g.size), sk.THREADS,
                    ("g", "ds_src", "ds_dst", "a_src", "a_dst", "dx"), n=shape[0], heads=heads,
                    D=shape[1] // heads).bind()

    def f(g, ds_src, ds_dst, a_src, a_dst):
        dx = nd(shape, dtype)
        bound(g, ds_src, ds_dst, a_src, a_dst, dx)
        return dx

    return f


def head_blocks_bound(r_src, heads, recycle=False):
    """``f(r_src, r_dst) -> (a_src, a_dst)``: :func:`head_blocks` for operands of the signature of these, its
    launch bound now (a bound layer call's, whose results are recycled where ``recycle``); None where there is
    nothing to gather."""
    D = r_src.shape[1] // heads
    if not heads * D:
        return None
    shape, dtype = (heads, D), r_src.dtype
    make = sk.results(((shape, dtype), (shape, dtype)), recycle)
    bound = sk.launch(sk.name(kn.head_blocks_name, dtype), sk.grid(2 * heads * D), sk.THREADS,
                    ("r_src", "r_dst", "a_src", "a_dst"), heads=heads, D=D).bind()

    def f(r_src, r_dst):
        a_src, a_dst = make()
        bound(r_src, r_dst, a_src, a_dst)
        return a_src, a_dst

    return f


def head_blocks(r_src, r_dst, heads):
    """``(a_src, a_dst)``, each ``(heads, D)``: the diagonal blocks ``R[h, h * D : (h + 1) * D]`` of two
    C-contiguous ``(heads, heads * D)`` arrays of one dtype, in one launch."""
    D = r_src.shape[1] // heads
    if heads * D:
        key = ("head_blocks", r_src.shape, r_src.dtype, heads)
        return sk.bound_once(key, head_blocks_bound, r_src, heads)(r_src, r_dst)
    cp = get_cupy()
    return cp.ndarray((heads, D), r_src.dtype), cp.ndarray((heads, D), r_src.dtype)


def seed_bits(draw):
    """``(draw * 2**32).astype(uint32)`` of a float64 device draw in ``[0, 1)`` of one element (an attention dropout
    seed), in one launch: CuPy's product and cast are two elementwise calls, several times the host time."""
    return sk.bound_once(("seed_bits",), seed_bits_bound)(draw)


def seed_bits_bound():
    """``f(draw)``: :func:`seed_bits`, its launch bound now."""
    nd, u32 = get_cupy().ndarray, np.dtype(np.uint32)
    bound = sk.launch(kn.SEED_BITS, 1, 32, ("x", "y")).bind()

    def f(draw):
        seed = nd((1,), u32)
        bound(draw, seed)
        return seed

    return f


#: Seed streams kept (per generator and device), oldest dropped: a model draws from a generator or a few, and a
#: captured step's launches hold its stream's state by address, so a stream stays while many others come and go.
STREAMS_KEEP = 1024
_STREAMS = {}


def seed_stream(rng):
    """The device state ``[key, count]`` (uint64) of CuPy generator ``rng``'s seed stream on this device, made at
    its first use from one ``rng.random(1)``; None under a capture where none was made before (what a capture
    records runs again on every replay: a key drawn there would be drawn anew each time)."""
    cp = get_cupy()
    place = (id(rng), cp.cuda.runtime.getDevice())
    entry = _STREAMS.get(place)
    if entry is not None and entry[0] is rng:  # (the entry holds rng: its id is not reused while kept)
        return entry[1]
    if cp.cuda.get_current_stream().is_capturing():
        return None
    state = cp.zeros(2, np.uint64)
    state[:1] = rng.random(1).view(np.uint64)
    keep(_STREAMS, place, (rng, state), STREAMS_KEEP)
    return state


def draw(rng, words=2):
    """A seed from CuPy generator ``rng``: ``words`` (1 or 2) uint32 on the device, the next of its seed stream
    (:func:`seed_stream`; ``tcgnn_draw``, one thread: no host read, and a CUDA-graph replay draws anew).  Under a
    capture before the stream's first use, ``rng.random(1)`` (two words) or its :func:`seed_bits` (one).

    A draw is one small launch: cuRAND's generator fills a grid of its own states for any size, several times
    the time of the dropout it seeds on a small graph."""
    state = seed_stream(rng)
    if state is None:
        x = rng.random(1)
        return x if words == 2 else seed_bits(x)
    return sk.bound_once(("draw", words), draw_bound, words)(rng)


def draw_bound(words):
    """``f(rng)``: :func:`draw`, its launch bound now (a bound layer call's, the stream found per call)."""
    cp = get_cupy()
    nd, u32, streams = cp.ndarray, np.dtype(np.uint32), _STREAMS
    device = cp.cuda.runtime.getDevice()
    bound = sk.launch(kn.DRAW, 1, 32, ("state", "out"), words=words).bind()

    def drawn(rng):
        entry = streams.get((id(rng), device))
        if entry is None or entry[0] is not rng:
            return draw(rng, words)
        out = nd((words,), u32)
        bound(entry[1], out)
        return out

    return drawn


def total(x, shape=()):
    """The sum of a C-contiguous ``x``'s elements in one fixed order (deterministic), as an array of ``shape``
    (one element) and x's dtype on the device, accumulated in :func:`acc_dtype`: one launch."""
    return sk.bound_once(("total", x.size, x.dtype, shape), total_bound, x, shape)(x)


def total_bound(x, shape=()):
    """``f(x)``: :func:`total` for x of the signature of this one, its launch bound now (a bound layer call's)."""
    nd = get_cupy().ndarray
    dtype = x.dtype
    bound = sk.launch(sk.name(kn.sum_name, dtype), 1, kn.SUM_THREADS, ("x", "out"), n=x.size).bind()

    def f(x):
        out = nd(shape, dtype)
        bound(x, out)
        return out

    return f


def segment_sum(x, ptr, scale=None):
    """``out[g] = sum of scale[g] x[r]`` over the rows ``r`` of segment ``g`` (``ptr[g] .. ptr[g + 1] - 1``), each
    column in row order (deterministic), in :func:`acc_dtype`: per-graph sums and means of a batch's node features
    in one launch, where a product with a pooling matrix would build that matrix first.  ``x`` C-contiguous
    ``(n, d)`` float32 or float64, ``ptr`` int64 offsets on the device, ``scale`` one value per segment in x's
    dtype or None (1); a new ``(segments, d)`` array of x's dtype."""
    G, d = ptr.shape[0] - 1, x.shape[1]
    out = get_cupy().ndarray((G, d), x.dtype)
    if G * d:
        launch = sk.planned(("segment_sum", x.dtype, G, d), lambda: sk.launch(
            sk.name(kn.segment_sum_name, x.dtype), sk.grid(G * d), sk.THREADS, ("x", "ptr", "scale", "out"), G=G, d=d))
        launch.run(x, ptr, scale, out)
    return out


def csr_mm(values, indices, indptr, x):
    """``A @ x`` for a CSR ``A`` on the device (``values`` of x's dtype, int32 ``indices`` and ``indptr``) and a
    C-contiguous ``(k, d)`` x, float32 or float64: each output the sum over its row's entries in their order
    (deterministic), in :func:`acc_dtype`, in one launch with nothing planned -- the product of a matrix used once,
    whose translation into tiles would cost more than the product.  A new ``(rows, d)`` array of x's dtype."""
    n, d = indptr.shape[0] - 1, x.shape[1]
    out = get_cupy().ndarray((n, d), x.dtype)
    if n * d:
        sk.bound_once(("csr_mm", x.dtype, d), _csr_mm_bound, x.dtype, d)(n, values, indices, indptr, x, out)
    return out


def _csr_mm_bound(dtype, d):
    """``f(n, values, indices, indptr, x, out)``: :func:`csr_mm`'s launch for one dtype and width, bound once for
    every row count (each sampled block has its own)."""
    lg = min(5, max(0, (d - 1).bit_length() - 1))  # (lanes per row: a power of two about d / 2, at most a warp)
    return sk.launch(sk.name(kn.csr_mm_name, dtype), 1, sk.THREADS, ("values", "indices", "indptr", "x", "out"),
                     n=0, d=d, lg=lg).bind(rows=("n", sk.THREADS >> lg, sk.MAX_BLOCKS))


def _warp_grid(rows, threads=sk.THREADS):
    return min(max(1, -(-rows * 32 // threads)), sk.MAX_BLOCKS)


def row_normalize(x, eps):
    """``(x / max(|x_i|, eps), |x_i|)`` per row of a C-contiguous ``(n, d)`` x: the rows in x's dtype, the norms
    in :func:`acc_dtype`; a warp per row."""
    n = x.shape[0]
    if n:
        return sk.bound_once(("row_normalize", x.shape, x.dtype, float(eps)), row_normalize_bound, x, eps)(x)
    cp = get_cupy()
    return cp.ndarray(x.shape, x.dtype), cp.ndarray((n,), acc_dtype(x.dtype))


def row_normalize_bound(x, eps, recycle=False):
    """``f(x) -> (xn, norm)``: :func:`row_normalize` for x of the signature of this one, its launch bound now (a
    bound layer call's, whose results are recycled where ``recycle``); None for an empty x."""
    n, d = x.shape
    if not n:
        return None
    shape, dtype, acc = x.shape, x.dtype, acc_dtype(x.dtype)
    make = sk.results(((shape, dtype), ((n,), acc)), recycle)
    bound = sk.launch(sk.name(kn.row_normalize_name, dtype), _warp_grid(n), sk.THREADS, ("x", "xn", "norm"), n=n, d=d,
                    eps=eps).bind()

    def f(x):
        xn, norm = make()
        bound(x, xn, norm)
        return xn, norm

    return f


def row_normalize_grad_bound(xn, eps, shares=None, recycle=False):
    """``f(dv, dq, dk, xn, norm) -> dh``: :func:`row_normalize_grad` for operands of the signature of these, its
    launch bound now (a bound layer call's, whose results are recycled where ``recycle``); None for an empty xn.

    With ``shares`` (AGNN's temperature-gradient shares, float32, of the signature of this array), ``f(dv, dq, dk,
    xn, norm, shares) -> (dh, total)``: the same launch also sums the shares, as :func:`total` of shape (1,)."""
    n, d = xn.shape
    if not n:
        return None
    acc = acc_dtype(xn.dtype)
    operands = ("dv", "dq", "dk", "xn", "norm", "dh") + (() if shares is None else ("shares", "total"))
    fixed = dict(n=n, d=d, eps=eps, n_shares=0 if shares is None else shares.size)
    if shares is None:
        fixed.update(shares=None, total=None)
    bound = sk.launch(sk.name(kn.row_normalize_grad_name, xn.dtype), _warp_grid(n, kn.SUM_THREADS), kn.SUM_THREADS,
                    operands, **fixed).bind()
    if shares is not None:
        make = sk.results((((n, d), acc), ((1,), _F32)), recycle)

        def with_total(dv, dq, dk, xn, norm, shares):
            dh, total = make()
            bound(dv, dq, dk, xn, norm, dh, shares, total)
            return dh, total

        return with_total

    nd_dh = sk.result((n, d), acc, recycle)

    def f(dv, dq, dk, xn, norm):
        dh = nd_dh((n, d), acc)
        bound(dv, dq, dk, xn, norm, dh)
        return dh

    return f


def row_normalize_grad(dv, dq, dk, xn, norm, eps, shares=None):
    """``dv + (dn - xn <xn, dn>) / max(norm, eps)`` per row with ``dn = dq + dk`` (the radial part only where
    ``norm > eps``): the vjp of :func:`row_normalize` added to ``dv``.  ``dv``, ``xn`` of x's dtype, ``dq``,
    ``dk``, ``norm`` and the result of the compute type; all C-contiguous.  With ``shares`` (float32), ``(dh,
    total)``: the same launch also sums them (:func:`row_normalize_grad_bound`)."""
    if xn.shape[0]:
        key = ("row_normalize_grad", xn.shape, xn.dtype, float(eps), None if shares is None else shares.size)
        f = sk.bound_once(key, row_normalize_grad_bound, xn, eps, shares)
        return f(dv, dq, dk, xn, norm) if shares is None else f(dv, dq, dk, xn, norm, shares)
    dh = get_cupy().ndarray(xn.shape, acc_dtype(xn.dtype))
    return dh if shares is None else (dh, total(shares, (1,)))
