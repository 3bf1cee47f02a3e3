"""Layer 2: the training family on the GPU -- a layer's elementwise tail (bias, activation, dropout) and its vjp,
the softmax cross-entropy, GAT's per-head scores and AGNN's row normalisation (each with its vjp), a sum in one
fixed order, and Adam over many tensors in one launch.

The one place the ``"nn"`` kernels' arguments are written (:mod:`tcgnn_py.kernels.nn`), each by its parameter's
name (:func:`tcgnn_py.kernels.launches.make`); launches go straight through the driver, since a training step
makes dozens of small ones and CuPy's argument handling would cost more than the kernels.  :mod:`tcgnn_py.nn` validates, keeps the host
path and writes the vjps.
"""

import functools

import numpy as np

from ..._device import get_cupy
from ...kernels import nn as kn
from ..._cache import BOUND
from ...kernels.driver import resident_blocks, slot_value
from ...kernels.launches import Scratch, make
from ...kernels.registry import background_compiles, compile_in_background, get_kernel
from .._launch import recycled, same_array

__all__ = ["TAIL_TYPES", "ACTIVATIONS", "ADAM_MULTI", "takes", "acc_dtype", "tail", "tail_grad", "cross_entropy",
           "index_weights", "dense_takes", "dense_mm", "dense_scores_take", "DENSE_MAX_K", "DENSE_MAX_N",
           "DENSE_SHORT_ROWS", "DENSE_SHORT_K", "DENSE_ATB_MAX_WIDE", "DENSE_ATB_FEW",
           "dense_atb_takes", "dense_atb", "add_bias", "dense_mm_bound", "dense_atb_bound", "add_bias_bound",
           "DENSE_ATB_MAX", "DENSE_ATB_MAX_ROWS",
           "head_dots", "head_dots_grad", "head_blocks", "row_normalize", "row_normalize_grad",
           "total", "adam_tick", "head_dots_bound", "head_dots_grad_bound", "head_blocks_bound",
           "total_bound", "row_normalize_bound", "row_normalize_grad_bound", "seed_bits", "seed_bits_bound",
           "adam_table", "adam_multi"]

TAIL_TYPES = kn.TAIL_TYPES
ACTIVATIONS = kn.ACTIVATIONS
ADAM_MULTI = kn.ADAM_MULTI
#: Threads per block of the grid-stride kernels, and the most blocks (enough to fill any GPU; more only loop).
THREADS = 256
MAX_BLOCKS = 4096


def _grid(n):
    return min(max(1, -(-n // THREADS)), MAX_BLOCKS)


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


@functools.cache
def _name(namer, dtype):
    return namer(np.dtype(dtype).name)


def _function(name):
    """The loaded ``CUfunction`` of the ``"nn"`` kernel ``name`` on the current device (compiled on first use)."""
    return get_kernel("nn", name).kernel.ptr


def _launch(name, grid, block, operands, **fixed):
    """The :class:`~tcgnn_py.kernels.launches.Launch` of the ``"nn"`` kernel ``name``: ``operands`` what a call
    passes, ``fixed`` every other parameter by name."""
    return make("nn", name, grid, block, operands, fixed)


def _planned(key, build):
    """``build()`` -- the :class:`~tcgnn_py.kernels.launches.Launch` of one signature ``key`` -- made once and
    kept in the store of bound calls (a launch holds no stream or device; its kernel is looked up per call)."""
    f = BOUND.get(key)
    if f is None:
        f = BOUND.put(key, build(), "nn launches")
    return f


def _kept(key, bind, *sample):
    """``bind(*sample)`` -- a bound form of one signature ``key`` -- made once per device and stream and kept in
    the store of bound calls (not under a capture): the general functions launch through their bound forms, so
    each kernel's arguments are written in one place."""
    cp = get_cupy()
    stream = cp.cuda.get_current_stream()
    place = (cp.cuda.runtime.getDevice(), stream.ptr)
    key += place
    f = BOUND.get(key)
    if f is None:
        f = BOUND.put(key, bind(*sample), place, stream.is_capturing())
    return f


def tail(x, b, act, p, seed):
    """``dropout(act(x + b))`` in one pass, a new array of x's dtype: ``b`` one value per column of x or None,
    ``act`` a key of :data:`ACTIVATIONS`, ``seed`` (a float64 device draw) None for no dropout.  Arrays
    C-contiguous, of one dtype in :data:`TAIL_TYPES`."""
    out = get_cupy().ndarray(x.shape, x.dtype)  # x C-contiguous: cupy.empty_like without its wrapper
    if x.size:
        n, cols = x.size, x.shape[-1] if x.ndim else 1
        _planned(("tail", x.dtype, n, cols, act, p), lambda: _launch(
            _name(kn.tail_name, x.dtype), _grid(n), THREADS, ("x", "b", "out", "seed"), n=n, cols=cols,
            act=ACTIVATIONS[act], p=p, scale=1 / (1 - p))).run(x, b, out, seed)
    return out


def tail_grad(g, x, b, act, p, seed):
    """The vjp of :func:`tail`: ``g`` times the recomputed mask and ``act'(x + b)`` (``x`` None without ``act``)."""
    dz = get_cupy().ndarray(g.shape, g.dtype)
    if g.size:
        n, cols = g.size, g.shape[-1] if g.ndim else 1
        _planned(("tail_grad", g.dtype, n, cols, act, p), lambda: _launch(
            _name(kn.tail_grad_name, g.dtype), _grid(n), THREADS, ("g", "x", "b", "dz", "seed"), n=n, cols=cols,
            act=ACTIVATIONS[act], p=p, scale=1 / (1 - p))).run(g, x, b, dz, seed)
    return dz


def cross_entropy(logits, labels, w, w0):
    """``(loss per row, dlogits)`` of the weighted softmax cross-entropy: ``labels`` int64 (n,), ``w`` one weight
    per row (of logits' dtype) or None for ``w0`` on every row; logits C-contiguous (n, k), k >= 1."""
    cp = get_cupy()
    n, k = logits.shape
    loss = cp.ndarray((n,), logits.dtype)
    grad = cp.ndarray(logits.shape, logits.dtype)
    if n:
        _planned(("cross_entropy", logits.dtype, n, k, float(w0)), lambda: _launch(
            _name(kn.cross_entropy_name, logits.dtype), _grid(n), THREADS, ("logits", "labels", "w", "loss", "grad"),
            w0=w0, n=n, k=k)).run(logits, labels, w, loss, grad)
    return loss, grad


def index_weights(n, index, value, dtype):
    """``w`` of ``n`` rows of ``dtype``, ``value`` on the rows ``index`` (int64, a negative one counted from the
    end, one outside ``[-n, n)`` skipped) and 0 elsewhere: one fill and one launch (a scatter costs several)."""
    w = get_cupy().zeros(n, dtype)
    if index.size:
        m = index.size
        _planned(("index_weights", w.dtype, m, n, float(value)), lambda: _launch(
            _name(kn.index_weights_name, w.dtype), _grid(m), THREADS, ("w", "index"), m=m, n=n, value=value)).run(
            w, index)
    return w


#: The widest inner dimension ``k`` of a product :func:`dense_mm` runs: up to it the kernel takes at most about as
#: long as cuBLAS on the GPU; wider ones (a first layer's input features) go to cuBLAS.
DENSE_MAX_K = 128
#: The widest output :func:`dense_mm` runs: up to it its 64-column tiles take about as long as cuBLAS (wide ones
#: less).  Widths that leave over a quarter of the last 64-column tile idle go to cuBLAS, whose narrower tiles run
#: them faster (33 to 47, 65 to 95, ...; up to 32 the kernel's own narrower tiles serve).
DENSE_MAX_N = 512
#: Products over at most this many rows (a small graph's layers) run here up to :data:`DENSE_SHORT_K` too: the
#: kernel's time for them stays below the host time of a cuBLAS call, which a layer this small waits on.
DENSE_SHORT_ROWS = 4096
DENSE_SHORT_K = 256
_F32 = np.dtype(np.float32)


@functools.lru_cache(maxsize=256)
def _dense_signature(dt_a, dt_b, shape_a, shape_b, strides_a):
    if not (dt_a == dt_b == _F32 and len(shape_a) == len(shape_b) == 2 and shape_a[1] == shape_b[0]):
        return False
    m, k = shape_a
    n = shape_b[1]
    return (0 < k <= (DENSE_SHORT_K if m <= DENSE_SHORT_ROWS else DENSE_MAX_K) and 0 < n <= DENSE_MAX_N
            and (n <= 32 or 4 * (-n % 64) <= -(-n // 64) * 64) and strides_a[1] == 4 and strides_a[0] % 4 == 0)


def dense_takes(a, b):
    """Whether :func:`dense_mm` runs ``a @ b``: float32 (cuBLAS's tensor cores serve float64 and 16 bits faster
    than this kernel's CUDA cores), ``a`` 2-D with unit column stride (rows of any stride), ``b`` 2-D of any
    strides (a transposed view too), ``k`` within :data:`DENSE_MAX_K` (:data:`DENSE_SHORT_K` over at most
    :data:`DENSE_SHORT_ROWS` rows) and the output's width within :data:`DENSE_MAX_N`, its last tile at least
    three quarters used.  Answered from a cache of signatures, as it is asked per product."""
    return _dense_signature(a.dtype, b.dtype, a.shape, b.shape, a.strides)


def dense_scores_take(D):
    """Whether :func:`dense_mm` computes GAT's scores for heads of ``D`` features: its lanes sum a head, so a head
    is a power of two of 4-column groups within a 64-column tile."""
    return D % 4 == 0 and D // 4 <= 16 and (D // 4) & (D // 4 - 1) == 0


def _dense_tile(n):
    """``(BN, TM, NT)`` of ``tcgnn_dense_mm`` for a result of ``n`` columns: the narrowest tile that holds them."""
    return kn.DENSE_TILES[0 if n <= 16 else 1 if n <= 32 else 2]


def _warm_dense():
    """Queue the layers' dense kernels on the background compiler when one is first bound: a layer's backward
    needs the siblings of its forward's kernel (the transposed-B product, the sums over rows, the bias), and
    they compile while the forward runs instead of one by one when the backward asks."""
    if background_compiles() and not get_cupy().cuda.get_current_stream().is_capturing():  # (no module loads then)
        compile_in_background("nn", kn.DENSE_NAMES + (kn.add_bias_name("float32"),))


def _dense_bind(a, b, bias, scores, key, place):
    _warm_dense()
    m, k = a.shape
    n = b.shape[1]
    bn, tm, nt = _dense_tile(n)
    bt = _transposed(b)
    vec = int(a.strides[0] % 16 == 0 and k % 4 == 0 and a.data.ptr % 16 == 0)
    if b.data.ptr % 16 == 0 and ((b.strides[1] % 16 == 0 and k % 4 == 0) if bt else
                                 (b.strides[1] == 4 and b.strides[0] % 16 == 0 and n % 4 == 0)):
        vec |= 2
    operands = ("A", "B") + (("bias",) if bias is not None else ()) + ("C",)
    fixed = dict(m=m, n=n, k=k, lda=a.strides[0] // 4, sb=b.strides[0] // 4, tb=b.strides[1] // 4, vec=vec,
                 D=n // max(scores, 1), **({} if bias is not None else {"bias": None}))
    if scores:
        operands += ("a_src", "a_dst", "s_src", "s_dst")
    else:
        fixed.update(a_src=None, a_dst=None, s_src=None, s_dst=None)
    grid = (-(-m // (nt // (bn // 4) * tm)), -(-n // bn))
    bound = _launch(kn.dense_mm_name(bn, tm, nt, bt), grid, nt, operands, **fixed).bind()
    return BOUND.put(key, bound, place, get_cupy().cuda.get_current_stream().is_capturing())


def _transposed(b):
    """Whether ``b`` is a transposed view (unit row stride): the kernel then keeps its slices by columns."""
    return b.strides[0] == 4 and b.strides[1] != 4 and b.shape[1] > 1


def dense_mm(a, b, bias=None, a_src=None, a_dst=None, heads=1):
    """``a @ b (+ bias)`` in one launch, for operands :func:`dense_takes` takes: a new C-contiguous float32 array,
    each element summed one product at a time (cuBLAS's float32 compute, no TF32).

    A layer's product costs its launch: the launch is bound once per signature and later calls write only the
    operands' addresses (less host time than a ``cublasLtMatmul`` call).  With ``a_src`` and ``a_dst``
    (``(heads, D)`` float32, C-contiguous; :func:`dense_scores_take` of D) it also returns GAT's scores, as
    :func:`head_dots` of the result: ``(out, s_src, s_dst)``.
    """
    cp = get_cupy()
    m = a.shape[0]
    n = b.shape[1]
    scores = 0 if a_src is None else heads
    if scores and _transposed(b):  # the scores' lanes sum adjacent columns: a layer's W is C-contiguous anyway
        b = cp.ascontiguousarray(b)
    c = cp.ndarray((m, n), _F32)
    if scores:
        s_src, s_dst = cp.ndarray((m, heads), _F32), cp.ndarray((m, heads), _F32)
    if m:
        bound = _dense_launch(cp, a, b, bias, scores)
        operands = (a, b) + ((bias,) if bias is not None else ()) + (c,)
        bound(*operands, a_src, a_dst, s_src, s_dst) if scores else bound(*operands)
    return (c, s_src, s_dst) if scores else c


def _dense_launch(cp, a, b, bias, scores):
    """The bound launch of ``tcgnn_dense_mm`` for operands of this signature on the current stream (kept)."""
    place = (cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr)
    key = ("dense", a.shape, b.shape, a.strides[0], b.strides, (a.data.ptr & 15) << 4 | b.data.ptr & 15,
           bias is None, scores) + place
    return BOUND.get(key) or _dense_bind(a, b, bias, scores, key, place)


def dense_mm_bound(a, b, bias=None, a_src=None, a_dst=None, heads=1, keep=False):
    """:func:`dense_mm` for operands of the signature of these, as ``f(a, b[, bias])`` (``f(a, b, a_src, a_dst)``
    with scores), its launch bound now: a bound layer call's, whose key proves the signature, so a call allocates
    and launches only.  ``b`` may be passed as any array at ``b``'s address (``W`` for a bound ``W.T``: the launch
    reads the address, its strides are fixed).  None where a call does more than launch: an empty ``a``, scores
    of a transposed ``b`` (copied) or with a bias.

    ``keep``: without scores, every call writes and returns one array made now (``same_array``), for a caller
    that reads it before its next call on this stream; else the results are :func:`recycled`."""
    cp = get_cupy()
    m, n = a.shape[0], b.shape[1]
    scores = 0 if a_src is None else heads
    if not m or scores and (_transposed(b) or bias is not None):
        return None
    bound = _dense_launch(cp, a, b, bias, scores)
    shape, s_shape = (m, n), (m, scores)
    nd = same_array(cp.ndarray(shape, _F32)) if keep and not scores else recycled(shape, _F32)
    if scores:
        nd_src, nd_dst = recycled(s_shape, _F32), recycled(s_shape, _F32)

        def scored(a, b, a_src, a_dst):
            c, s_src, s_dst = nd(shape, _F32), nd_src(s_shape, _F32), nd_dst(s_shape, _F32)
            bound(a, b, c, a_src, a_dst, s_src, s_dst)
            return c, s_src, s_dst

        return scored
    if bias is not None:
        def biased(a, b, bias):
            c = nd(shape, _F32)
            bound(a, b, bias, c)
            return c

        return biased

    def plain(a, b):
        c = nd(shape, _F32)
        bound(a, b, c)
        return c

    return plain


#: The most rows and columns of ``Aᵀ B`` :func:`dense_atb` computes (a tile of 64 x 64; wider go to cuBLAS).
DENSE_ATB_MAX = 64
#: The most columns of ``Aᵀ B`` :func:`dense_atb` computes where it has at most :data:`DENSE_ATB_FEW` rows (GAT's
#: score gradients, a row per head), or where N is at most :data:`DENSE_SHORT_ROWS`: there its time is about
#: cuBLAS's (at most 1.2x), and over so few rows within the host time of a cuBLAS call.
DENSE_ATB_MAX_WIDE = 512
DENSE_ATB_FEW = 8
#: The longest dimension :func:`dense_atb` takes: up to it the kernel runs about as long as cuBLAS and costs less on
#: the host; beyond it cuBLAS's faster sums save more GPU time than its host cost.
DENSE_ATB_MAX_ROWS = 65536
#: Rows of the long dimension a block of ``tcgnn_dense_atb`` sums at least: fewer would cost more in partial sums
#: written and added than in products.
DENSE_ATB_MIN_ROWS = 64
#: Blocks per SM ``tcgnn_dense_atb`` aims at (its slices of the long dimension): enough to hide the copies.
DENSE_ATB_BLOCKS_PER_SM = 2
_atb_scratch = {}


@functools.lru_cache(maxsize=256)
def _atb_signature(dt_a, dt_b, shape_a, shape_b, strides_a, strides_b):
    if (dt_b != _F32 or len(shape_b) != 2 or strides_b[1] != 4 or strides_b[0] % 4 or shape_b[0] > DENSE_ATB_MAX_ROWS
            or not 0 < shape_b[1] <= DENSE_ATB_MAX_WIDE):
        return False
    N, q = shape_b
    p = 1 if dt_a is None else shape_a[1] if len(shape_a) == 2 else 0
    if q > DENSE_ATB_MAX and not (N <= DENSE_SHORT_ROWS or 1 < p <= DENSE_ATB_FEW):
        return False
    if dt_a is None:
        return True
    return (dt_a == _F32 and len(shape_a) == 2 and shape_a[0] == N and 0 < p <= DENSE_ATB_MAX
            and strides_a[1] == 4 and strides_a[0] % 4 == 0)


def dense_atb_takes(a, b):
    """Whether :func:`dense_atb` runs ``aᵀ b`` (``a`` None: ``b``'s column sums): float32, both ``(N, ·)`` with
    unit column stride, at most :data:`DENSE_ATB_MAX` columns each (``b`` up to :data:`DENSE_ATB_MAX_WIDE` where
    ``a`` has at most :data:`DENSE_ATB_FEW` or N is at most :data:`DENSE_SHORT_ROWS`) and N at most
    :data:`DENSE_ATB_MAX_ROWS`.  Answered from a cache of signatures."""
    if a is None:
        return _atb_signature(None, b.dtype, None, b.shape, None, b.strides)
    return _atb_signature(a.dtype, b.dtype, a.shape, b.shape, a.strides, b.strides)


def _atb_bind(a, b, key, stream, capturing):
    _warm_dense()
    cp = get_cupy()
    N, q = b.shape
    p = 1 if a is None else a.shape[1]
    bq, ti, nt = kn.DENSE_ATB_TILES[0 if p > 8 else 1]
    bp = nt // (bq // 4) * ti
    tiles = -(-p // bp) * -(-q // bq)
    device = cp.cuda.Device().attributes
    sms = device["MultiProcessorCount"]
    chunk = max(DENSE_ATB_MIN_ROWS, -(-N * tiles // (DENSE_ATB_BLOCKS_PER_SM * sms)))
    chunk = -(-chunk // 32) * 32
    slices = max(1, -(-N // chunk))
    vec = int(b.strides[0] % 16 == 0 and q % 4 == 0 and b.data.ptr % 16 == 0)
    grid = (slices, -(-p // bp), -(-q // bq))
    lda = 0 if a is None else a.strides[0] // 4
    name = kn.dense_atb_name(bq, ti, nt)
    fixed = dict(N=N, p=p, q=q, lda=lda, ldb=b.strides[0] // 4, chunk=chunk, vec=vec)
    operands = ("A",) if a is not None else ()
    if a is None:
        fixed["A"] = None
    if slices == 1:  # one slice: the sums go straight to the result (P)
        return _launch(name, grid, nt, operands + ("B", "P"), C=None, barrier=None, **fixed).bind(), p

    def scratch(kind, shape, dtype, zeros=False):  # the graph's own under a capture, else kept per stream
        if capturing:
            return (cp.zeros if zeros else cp.ndarray)(shape, dtype)
        return Scratch(kind, shape, dtype, zeros).get(_atb_scratch, stream)

    fixed["P"] = partial = scratch("atb", (slices * p * q,), _F32)  # the slices' partial sums
    if device.get("CooperativeLaunch") and slices * tiles <= sms * _resident(_function(name), nt):  # blocks add them
        coop = make("nn", name, grid, nt, operands + ("B", "C"),
                    dict(barrier=scratch("atb barrier", (2,), np.uint32, zeros=True), **fixed), cooperative=True)
        return coop.bind(), p
    first = _launch(name, grid, nt, operands + ("B",), C=None, barrier=None, **fixed).bind()
    total = _launch(kn.DENSE_ATB_SUM, -(-p * q // 32), 256, ("C",), P=partial, S=slices, pq=p * q).bind()

    def two(*arrays):  # the operands, then C
        first(*arrays[:-1])
        total(arrays[-1])

    return two, p


@functools.cache
def _resident(function, threads):
    """:func:`~tcgnn_py.kernels.driver.resident_blocks`, asked once per kernel and block size."""
    return resident_blocks(function, threads)


def dense_atb(a, b):
    """``aᵀ b`` for operands :func:`dense_atb_takes` takes, a new ``(p, q)`` float32 array; ``a`` None: ``b``'s
    column sums, shape ``(q,)``.

    The long dimension is cut into slices that blocks sum in parallel and then add in slice order, so the result
    is the same on every run: in one cooperative launch whose blocks wait for each other where the GPU holds them
    all at once (a second launch costs more host time than the wait), else by a second launch.  The launches are
    bound per signature (less host time than a ``cublasLtMatmul`` call).
    """
    cp = get_cupy()
    run, p = _atb_launches(cp, a, b)
    if a is None:
        c = cp.ndarray((b.shape[1],), _F32)
        run(b, c)
    else:
        c = cp.ndarray((p, b.shape[1]), _F32)
        run(a, b, c)
    return c


def _atb_launches(cp, a, b):
    """``(run, p)`` of :func:`dense_atb` for operands of this signature on the current stream, ``run(*operands,
    C)`` its launch (or launches): kept, but under a capture, whose partial sums are the graph's own."""
    stream = cp.cuda.get_current_stream()
    ptr = stream.ptr
    place = (cp.cuda.runtime.getDevice(), ptr)
    key = ("atb", None if a is None else (a.shape, a.strides[0]), b.shape, b.strides[0], b.data.ptr & 15) + place
    hit = BOUND.get(key)
    if hit is None:
        capturing = stream.is_capturing()
        hit = BOUND.put(key, _atb_bind(a, b, key, ptr, capturing), place, capturing)
    return hit


def dense_atb_bound(a, b, keep=False):
    """:func:`dense_atb` for operands of the signature of these, as ``f(a, b)`` (``f(b)`` for ``a`` None), its
    launches bound now: a bound layer call's (not under a capture, whose partial sums are the graph's own).
    ``keep``: the result is one array made now; else it is :func:`recycled`."""
    cp = get_cupy()
    run, p = _atb_launches(cp, a, b)
    out = (b.shape[1],) if a is None else (p, b.shape[1])
    nd = same_array(cp.ndarray(out, _F32)) if keep else recycled(out, _F32)
    if a is None:
        shape = (b.shape[1],)

        def sums(b):
            c = nd(shape, _F32)
            run(b, c)
            return c

        return sums
    shape = (p, b.shape[1])

    def product(a, b):
        c = nd(shape, _F32)
        run(a, b, c)
        return c

    return product


def add_bias(x, b):
    """``x += b`` in place (``x`` C-contiguous of :data:`TAIL_TYPES`, ``b`` one value per column, same dtype,
    contiguous) in one launch bound per signature, no CuPy elementwise call; returns ``x``."""
    if x.size:
        _kept(("add_bias", x.shape, x.dtype), _bias_bind, x)(x, b)
    return x


def _bias_bind(x):
    return _launch(_name(kn.add_bias_name, x.dtype), _grid(x.size), THREADS, ("x", "b"), n=x.size,
                   cols=x.shape[-1]).bind()


def add_bias_bound(x, b):
    """:func:`add_bias` for operands of the signature of these, as ``f(x, b)`` (in place, returns nothing), its
    launch bound now: a bound layer call's."""
    if not x.size:
        return lambda x, b: None
    return _kept(("add_bias", x.shape, x.dtype), _bias_bind, x)


def head_dots(x, a_src, a_dst, heads):
    """``(s_src, s_dst)``, each ``(n, heads)`` in :func:`acc_dtype`: per row of ``x`` (``heads`` heads of D
    features, C-contiguous) and head its dot products with that head's row of ``a_src`` and of ``a_dst``
    (``(heads, D)``, C-contiguous, of the compute type), from one read of x."""
    n = x.shape[0]
    if n and heads:
        return _kept(("head_dots", x.shape, x.dtype, heads), head_dots_bound, x, heads)(x, a_src, a_dst)
    cp, acc = get_cupy(), acc_dtype(x.dtype)
    return cp.ndarray((n, heads), acc), cp.ndarray((n, heads), acc)


def _results(shape, dtype, recycle):
    """The maker of a bound form's result: :func:`recycled` for a bound layer call's (``recycle``), else
    ``cupy.ndarray`` (the general functions launch through the same forms, under a capture too)."""
    return recycled(shape, dtype) if recycle else get_cupy().ndarray


def head_dots_bound(x, heads, recycle=False):
    """``f(x, a_src, a_dst) -> (s_src, s_dst)``: :func:`head_dots` for operands of the signature of these, its
    launch bound now (a bound layer call's, whose results are recycled where ``recycle``); None for an empty x."""
    n = x.shape[0]
    if not (n and heads):
        return None
    acc, shape = acc_dtype(x.dtype), (n, heads)
    nd_src, nd_dst = _results(shape, acc, recycle), _results(shape, acc, recycle)
    bound = _launch(_name(kn.head_dots_name, x.dtype), _grid(n * heads), THREADS,
                    ("x", "a_src", "a_dst", "s_src", "s_dst"), n=n, heads=heads, D=x.shape[1] // heads).bind()

    def f(x, a_src, a_dst):
        s_src, s_dst = nd_src(shape, acc), nd_dst(shape, acc)
        bound(x, a_src, a_dst, s_src, s_dst)
        return s_src, s_dst

    return f


def head_dots_grad(g, ds_src, ds_dst, a_src, a_dst, heads):
    """``g + ds_src a_src + ds_dst a_dst`` head by head (the vjp of :func:`head_dots` added to ``g``), in the
    compute type and stored in g's dtype; ``g`` ``(n, heads * D)`` and ``ds_*`` ``(n, heads)`` C-contiguous."""
    if g.size:
        return _kept(("head_dots_grad", g.shape, g.dtype, heads), head_dots_grad_bound, g, heads)(
            g, ds_src, ds_dst, a_src, a_dst)
    return get_cupy().ndarray(g.shape, g.dtype)


def head_dots_grad_bound(g, heads, keep=False):
    """``f(g, ds_src, ds_dst, a_src, a_dst) -> dx``: :func:`head_dots_grad` for operands of the signature of these,
    its launch bound now (a bound layer call's); None for an empty g.  ``keep``: dx is one array made now."""
    if not g.size:
        return None
    nd = get_cupy().ndarray
    shape, dtype = g.shape, g.dtype
    if keep:
        nd = same_array(nd(shape, dtype))
    bound = _launch(_name(kn.head_dots_grad_name, dtype), _grid(g.size), THREADS,
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
    nd_src, nd_dst = _results(shape, dtype, recycle), _results(shape, dtype, recycle)
    bound = _launch(_name(kn.head_blocks_name, dtype), _grid(2 * heads * D), THREADS,
                    ("r_src", "r_dst", "a_src", "a_dst"), heads=heads, D=D).bind()

    def f(r_src, r_dst):
        a_src, a_dst = nd_src(shape, dtype), nd_dst(shape, dtype)
        bound(r_src, r_dst, a_src, a_dst)
        return a_src, a_dst

    return f


def head_blocks(r_src, r_dst, heads):
    """``(a_src, a_dst)``, each ``(heads, D)``: the diagonal blocks ``R[h, h * D : (h + 1) * D]`` of two
    C-contiguous ``(heads, heads * D)`` arrays of one dtype, in one launch."""
    D = r_src.shape[1] // heads
    if heads * D:
        return _kept(("head_blocks", r_src.shape, r_src.dtype, heads), head_blocks_bound, r_src, heads)(r_src, r_dst)
    cp = get_cupy()
    return cp.ndarray((heads, D), r_src.dtype), cp.ndarray((heads, D), r_src.dtype)


def seed_bits(draw):
    """``(draw * 2**32).astype(uint32)`` of a float64 device draw in ``[0, 1)`` of one element (an attention dropout
    seed), in one launch: CuPy's product and cast are two elementwise calls, several times the host time."""
    return _kept(("seed_bits",), seed_bits_bound)(draw)


def seed_bits_bound():
    """``f(draw)``: :func:`seed_bits`, its launch bound now (a bound layer call's)."""
    nd, u32 = get_cupy().ndarray, np.dtype(np.uint32)
    bound = _launch(kn.SEED_BITS, 1, 32, ("x", "y")).bind()

    def f(draw):
        seed = nd((1,), u32)
        bound(draw, seed)
        return seed

    return f


def total(x, shape=()):
    """The sum of a C-contiguous ``x``'s elements in one fixed order (deterministic), as an array of ``shape``
    (one element) and x's dtype on the device, accumulated in :func:`acc_dtype`: one launch."""
    return _kept(("total", x.size, x.dtype, shape), total_bound, x, shape)(x)


def total_bound(x, shape=()):
    """``f(x)``: :func:`total` for x of the signature of this one, its launch bound now (a bound layer call's)."""
    nd = get_cupy().ndarray
    dtype = x.dtype
    bound = _launch(_name(kn.sum_name, dtype), 1, kn.SUM_THREADS, ("x", "out"), n=x.size).bind()

    def f(x):
        out = nd(shape, dtype)
        bound(x, out)
        return out

    return f


def _warp_grid(rows, threads=THREADS):
    return min(max(1, -(-rows * 32 // threads)), MAX_BLOCKS)


def row_normalize(x, eps):
    """``(x / max(|x_i|, eps), |x_i|)`` per row of a C-contiguous ``(n, d)`` x: the rows in x's dtype, the norms
    in :func:`acc_dtype`; a warp per row."""
    n = x.shape[0]
    if n:
        return _kept(("row_normalize", x.shape, x.dtype, float(eps)), row_normalize_bound, x, eps)(x)
    cp = get_cupy()
    return cp.ndarray(x.shape, x.dtype), cp.ndarray((n,), acc_dtype(x.dtype))


def row_normalize_bound(x, eps, recycle=False):
    """``f(x) -> (xn, norm)``: :func:`row_normalize` for x of the signature of this one, its launch bound now (a
    bound layer call's, whose results are recycled where ``recycle``); None for an empty x."""
    n, d = x.shape
    if not n:
        return None
    shape, dtype, acc = x.shape, x.dtype, acc_dtype(x.dtype)
    nd_xn, nd_norm = _results(shape, dtype, recycle), _results((n,), acc, recycle)
    bound = _launch(_name(kn.row_normalize_name, dtype), _warp_grid(n), THREADS, ("x", "xn", "norm"), n=n, d=d,
                    eps=eps).bind()

    def f(x):
        xn, norm = nd_xn(shape, dtype), nd_norm((n,), acc)
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
    nd_dh = _results((n, d), acc, recycle)
    operands = ("dv", "dq", "dk", "xn", "norm", "dh") + (() if shares is None else ("shares", "total"))
    fixed = dict(n=n, d=d, eps=eps, n_shares=0 if shares is None else shares.size)
    if shares is None:
        fixed.update(shares=None, total=None)
    bound = _launch(_name(kn.row_normalize_grad_name, xn.dtype), _warp_grid(n, kn.SUM_THREADS), kn.SUM_THREADS,
                    operands, **fixed).bind()
    if shares is not None:
        one = (1,)
        nd_total = _results(one, _F32, recycle)

        def with_total(dv, dq, dk, xn, norm, shares):
            dh, total = nd_dh((n, d), acc), nd_total(one, _F32)
            bound(dv, dq, dk, xn, norm, dh, shares, total)
            return dh, total

        return with_total

    def f(dv, dq, dk, xn, norm):
        dh = nd_dh((n, d), acc)
        bound(dv, dq, dk, xn, norm, dh)
        return dh

    return f


def row_normalize_grad(dv, dq, dk, xn, norm, eps):
    """``dv + (dn - xn <xn, dn>) / max(norm, eps)`` per row with ``dn = dq + dk`` (the radial part only where
    ``norm > eps``): the vjp of :func:`row_normalize` added to ``dv``.  ``dv``, ``xn`` of x's dtype, ``dq``,
    ``dk``, ``norm`` and the result of the compute type; all C-contiguous."""
    if xn.shape[0]:
        return _kept(("row_normalize_grad", xn.shape, xn.dtype, float(eps)), row_normalize_grad_bound, xn, eps)(
            dv, dq, dk, xn, norm)
    return get_cupy().ndarray(xn.shape, acc_dtype(xn.dtype))


def adam_tick(t, coef, lr, b1, b2):
    """Advance the device step count ``t`` and write the bias corrections ``coef`` (one thread)."""
    _planned(("adam_tick", float(lr), float(b1), float(b2)), lambda: _launch(
        kn.TICK, 1, 1, ("t", "coef"), lr=lr, b1=b1, b2=b2)).run(t, coef)


def adam_table(params, moments, decays):
    """The device table of :func:`adam_multi`: per parameter its address, its moments' addresses, its size and its
    weight decay (made once per set of arrays; a host-to-device copy, so not under a capture)."""
    rows = [(p.data.ptr, m.data.ptr, v.data.ptr, p.size, slot_value(float(wd)))
            for p, (m, v), wd in zip(params, moments, decays)]
    return get_cupy().asarray(np.array(rows, dtype=np.int64).reshape(len(rows), kn.ADAM_SLOTS))


def adam_multi(table, sizes, grads, coef, b1, b2, eps):
    """One Adam step of the tensors in ``table`` (:func:`adam_table`; ``sizes`` their element counts) with
    ``grads`` (C-contiguous, of the parameters' dtype, in the table's order): one launch per 8 tensors."""
    dtype = grads[0].dtype
    t = dtype.type
    name = _name(kn.adam_multi_name, dtype)
    row = kn.ADAM_SLOTS * 8
    for start in range(0, len(grads), ADAM_MULTI):
        chunk = grads[start:start + ADAM_MULTI]
        gs = {f"g{i}": chunk[i] if i < len(chunk) else None for i in range(ADAM_MULTI)}
        blocks = _grid(max(sizes[start:start + ADAM_MULTI]))
        _launch(name, (blocks, len(chunk)), THREADS, (), table=table.data.ptr + row * start, coef=coef, b1=t(b1),
                b2=t(b2), eps=t(eps), **gs).run()
