"""Layer 2: the dense family on the GPU -- a layer's own dense products, ``H W`` (the bias and GAT's
per-head scores in its epilogue) and ``Hᵀ G`` summed over the long dimension in slices, each bound per operand
signature in the store of bound calls: less host time than a cuBLAS call, which a small layer waits on.
:mod:`tcgnn_py.nn` decides where they run (:func:`dense_takes`, :func:`dense_atb_takes`); the kernels are the
``"nn"`` family's (:mod:`tcgnn_py.kernels.nn`), their arguments named here.
"""

import functools

import numpy as np

from ..._cache import BOUND, keep
from ..._device import device_attributes, get_cupy
from ...kernels import nn as kn
from ...kernels.driver import resident_blocks
from ...kernels.launches import make
from ...kernels.registry import background_compiles, compile_in_background
from .._launch import made, recycled, same_array
from .. import _small as sk

__all__ = ["DENSE_MAX_K", "DENSE_MAX_N", "DENSE_SHORT_ROWS", "DENSE_SHORT_K", "dense_takes", "dense_scores_take",
           "dense_mm", "dense_mm_bound", "DENSE_ATB_MAX", "DENSE_ATB_MAX_WIDE", "DENSE_ATB_FEW", "DENSE_ATB_MAX_ROWS",
           "DENSE_ATB_MIN_ROWS", "DENSE_ATB_BLOCKS_PER_SM", "NARROW_BLOCKS_PER_SM", "dense_atb_takes", "dense_atb",
           "dense_atb_bound", "DROP_MAX_N", "DROP_MM_BLOCKS_PER_SM", "DROP_ATB_BLOCKS_PER_SM",
           "DROP_ATB_MAX_SLICES", "DROP_SCRATCH_KEEP", "drop_takes", "drop_atb_takes", "drop_mm", "drop_atb",
           "drop_bound"]

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
    per = nt // (bn // 4) * tm  # (rows of C per block)
    bound = sk.launch(kn.dense_mm_name(bn, tm, nt, bt), (-(-m // per), -(-n // bn)), nt, operands,
                      **fixed).bind(rows=("m", per))
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
        bound(m, *operands, a_src, a_dst, s_src, s_dst) if scores else bound(m, *operands)
    return (c, s_src, s_dst) if scores else c


def _dense_launch(cp, a, b, bias, scores):
    """The bound launch ``f(m, *operands)`` of ``tcgnn_dense_mm`` for operands of this signature on the current
    stream (kept): every row count of ``a`` shares it, as a layer's products over a new batch's nodes each step do
    (binding per shape would cost each new one more host time than a cuBLAS call)."""
    place = (cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr)
    key = ("dense", a.shape[1], b.shape, a.strides[0], b.strides, (a.data.ptr & 15) << 4 | b.data.ptr & 15,
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
    if scores:
        make = made(((shape, _F32), (s_shape, _F32), (s_shape, _F32)), "recycle")

        def scored(a, b, a_src, a_dst):
            c, s_src, s_dst = make()
            bound(m, a, b, c, a_src, a_dst, s_src, s_dst)
            return c, s_src, s_dst

        return scored
    nd = same_array(cp.ndarray(shape, _F32)) if keep else recycled(shape, _F32)
    if bias is not None:
        def biased(a, b, bias):
            c = nd(shape, _F32)
            bound(m, a, b, bias, c)
            return c

        return biased

    def plain(a, b):
        c = nd(shape, _F32)
        bound(m, a, b, c)
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


@functools.lru_cache(maxsize=256)
def _atb_tile(p, q, device):
    """``(name, threads, (tiles along p, tiles along q), most, rowless)`` of ``tcgnn_dense_atb`` for a ``(p, q)``
    result on ``device``: its kernel and block size, the grid's y and z, the most slices of the long dimension
    (:data:`DENSE_ATB_BLOCKS_PER_SM` blocks per SM in all), and whether one cooperative launch holds that many
    slices (then a launch bound once serves every N)."""
    bq, ti, nt = kn.DENSE_ATB_TILES[0 if p > 8 else 1]
    bp = nt // (bq // 4) * ti
    tiles = -(-p // bp) * -(-q // bq)
    attributes = device_attributes()
    sms = attributes["MultiProcessorCount"]
    name = kn.dense_atb_name(bq, ti, nt)
    most = max(1, DENSE_ATB_BLOCKS_PER_SM * sms // tiles)
    rowless = bool(attributes.get("CooperativeLaunch")) and most * tiles <= sms * _resident(sk.function(name), nt)
    return name, nt, (-(-p // bp), -(-q // bq)), most, rowless


def _atb_bind(a, b, rowless):
    """``run(N, *operands, C)`` of :func:`dense_atb`'s launches: a narrow result's one launch
    (:func:`_narrow_bind`), else ``ceil(N / DENSE_ATB_MIN_ROWS)`` slices of the long dimension (at most the tile's
    most; the rows split evenly among them, 32 at a time): for every N where ``rowless`` (one cooperative launch,
    so a new batch's row count binds nothing), else for b's N (the slices summed by a second launch, in the same
    order).  Partial sums and counters are the stream's (the graph's own under a capture)."""
    _warm_dense()
    cp = get_cupy()
    N, q = b.shape
    p = 1 if a is None else a.shape[1]
    if p * q <= kn.NARROW_ATB_MAX:
        return _narrow_bind(a, b), p
    name, nt, tiles_yz, most, _ = _atb_tile(p, q, cp.cuda.runtime.getDevice())
    vec = int(b.strides[0] % 16 == 0 and q % 4 == 0 and b.data.ptr % 16 == 0)
    lda = 0 if a is None else a.strides[0] // 4
    fixed = dict(N=N, p=p, q=q, lda=lda, ldb=b.strides[0] // 4, vec=vec)
    operands = ("A",) if a is not None else ()
    if a is None:
        fixed["A"] = None
    fixed["chunk"] = 0  # (the kernel splits N evenly among the slices: both ways slice N alike)
    if rowless:  # (the blocks add the slices themselves, after a grid barrier)
        fixed.update(P=sk.scratch("atb", (most * p * q,), _F32),
                     barrier=sk.scratch("atb barrier", (2,), np.uint32, zeros=True))
        coop = make("nn", name, (most,) + tiles_yz, nt, operands + ("B", "C"), fixed, cooperative=True)
        return coop.bind(rows=("N", DENSE_ATB_MIN_ROWS, most)), p
    slices = min(most, max(1, -(-N // DENSE_ATB_MIN_ROWS)))
    grid = (slices,) + tiles_yz
    if slices == 1:  # one slice: the sums go straight to the result (P)
        one = sk.launch(name, grid, nt, operands + ("B", "P"), C=None, barrier=None, **fixed).bind()
        return (lambda N, *arrays: one(*arrays)), p
    fixed["P"] = partial = sk.scratch("atb", (slices * p * q,), _F32)  # the slices' partial sums
    first = sk.launch(name, grid, nt, operands + ("B",), C=None, barrier=None, **fixed).bind()
    total = _slice_sum(partial, slices, p * q)

    def two(N, *arrays):  # the operands, then C
        first(*arrays[:-1])
        total(arrays[-1])

    return two, p


#: Blocks per SM of a narrow product (:data:`tcgnn_py.kernels.nn.NARROW_ATB_MAX` outputs or fewer), each of at
#: least 8 rows per row group: with a block's thousand threads, loads enough in flight, and partials few enough for
#: the last block to add in one pass.
NARROW_BLOCKS_PER_SM = 1


def _narrow_bind(a, b):
    """``run(N, [a,] b, C)``: ``tcgnn_narrow_atb`` for every N (one launch: its last block adds the blocks'
    partials)."""
    q = b.shape[1]
    p = 1 if a is None else a.shape[1]
    groups = 1
    while 2 * groups * p * q <= kn.NARROW_THREADS:
        groups *= 2
    most = NARROW_BLOCKS_PER_SM * device_attributes()["MultiProcessorCount"]
    fixed = dict(N=b.shape[0], p=p, q=q, lda=0 if a is None else a.strides[0] // 4, ldb=b.strides[0] // 4,
                 P=sk.scratch("narrow", (most * p * q,), _F32), done=sk.scratch("narrow done", (1,), np.uint32, True))
    operands = ("B", "C") if a is None else ("A", "B", "C")
    if a is None:
        fixed["A"] = None
    launch = sk.launch(kn.NARROW_ATB, most, kn.NARROW_THREADS, operands, **fixed)
    return launch.bind(rows=("N", 8 * groups, most))


def _slice_sum(P, slices, size):
    """``f(C)``: the bound ``tcgnn_dense_atb_sum`` adding ``slices`` partial sums of ``size`` outputs each (in
    ``P``, slice after slice) into C in slice order."""
    t = kn.slice_sum_threads(slices)
    per = kn.SLICE_SUM_THREADS // t  # (outputs per block)
    return sk.launch(kn.DENSE_ATB_SUM, -(-size // per), kn.SLICE_SUM_THREADS, ("C",), P=P, S=slices, pq=size,
                     T=t).bind()


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
    N = b.shape[0]
    if a is None:
        c = cp.ndarray((b.shape[1],), _F32)
        run(N, b, c)
    else:
        c = cp.ndarray((p, b.shape[1]), _F32)
        run(N, a, b, c)
    return c


def _atb_launches(cp, a, b):
    """``(run, p)`` of :func:`dense_atb` for operands of this signature on the current stream, ``run(N, *operands,
    C)`` its launch (or launches): kept, but under a capture, whose partial sums are the graph's own; one for every
    N where one launch serves them all (a narrow result's, or one cooperative launch: :func:`_atb_tile`)."""
    stream = cp.cuda.get_current_stream()
    ptr = stream.ptr
    device = cp.cuda.runtime.getDevice()
    place = (device, ptr)
    q = b.shape[1]
    p = 1 if a is None else a.shape[1]
    rowless = p * q <= kn.NARROW_ATB_MAX or _atb_tile(p, q, device)[4]
    key = ("atb", None if a is None else (p, a.strides[0]), q, b.strides[0], b.data.ptr & 15,
           None if rowless else b.shape[0]) + place
    hit = BOUND.get(key)
    if hit is None:
        capturing = stream.is_capturing()
        hit = BOUND.put(key, _atb_bind(a, b, rowless), place, capturing)
    return hit


def dense_atb_bound(a, b, keep=False):
    """:func:`dense_atb` for operands of the signature of these, as ``f(a, b)`` (``f(b)`` for ``a`` None), its
    launches bound now: a bound layer call's (not under a capture, whose partial sums are the graph's own).
    ``keep``: the result is one array made now; else it is :func:`recycled`."""
    cp = get_cupy()
    run, p = _atb_launches(cp, a, b)
    out = (b.shape[1],) if a is None else (p, b.shape[1])
    nd = same_array(cp.ndarray(out, _F32)) if keep else recycled(out, _F32)
    N = b.shape[0]
    if a is None:
        shape = (b.shape[1],)

        def sums(b):
            c = nd(shape, _F32)
            run(N, b, c)
            return c

        return sums
    shape = (p, b.shape[1])

    def product(a, b):
        c = nd(shape, _F32)
        run(N, a, b, c)
        return c

    return product


#: The widest output of a dropped input's product (:func:`drop_mm`) and its weight's gradient (:func:`drop_atb`):
#: a hidden layer's width (8-column tiles of :data:`tcgnn_py.kernels.nn.DROP_TILES`).
DROP_MAX_N = 8 * kn.DROP_TILES[-1]
#: Blocks per SM a dropped input's kernels aim at (slices of the long dimension): enough loads in flight to read
#: the input at the memory's speed.  The product's blocks hold over 200 registers a thread, so two fit on an SM:
#: one wave of them, whose fewer slices also leave fewer partial sums to add, runs faster than two.
DROP_MM_BLOCKS_PER_SM = 2
DROP_ATB_BLOCKS_PER_SM = 4
#: The most slices :func:`drop_atb` cuts the rows into (a second launch adds their partial sums, as it does
#: :func:`drop_mm`'s slices of k).
DROP_ATB_MAX_SLICES = 128

_drop_scratch = {}


def drop_takes(a, b):
    """Whether :func:`drop_mm` runs ``dropout(a) @ b``: float32, ``a`` 2-D with unit column stride (rows of any
    stride a multiple of 4 bytes) and wider than :data:`DENSE_MAX_K` (a narrower one is dropped first and
    multiplied by :func:`dense_mm`, whose kernels serve it faster), ``b`` 2-D of any strides, at most
    :data:`DROP_MAX_N` columns."""
    return (a.dtype == b.dtype == _F32 and a.ndim == b.ndim == 2 and a.shape[1] == b.shape[0]
            and a.shape[1] > DENSE_MAX_K
            and 0 < b.shape[1] <= DROP_MAX_N and a.strides[1] == 4 and a.strides[0] % 4 == 0
            and b.strides[0] % 4 == 0 and b.strides[1] % 4 == 0)


def drop_atb_takes(a, g):
    """Whether :func:`drop_atb` runs ``dropout(a)ᵀ g``: float32, both ``(N, ·)`` with unit column stride, ``g`` of
    at most :data:`DROP_MAX_N` columns."""
    return (a.dtype == g.dtype == _F32 and a.ndim == g.ndim == 2 and a.shape[0] == g.shape[0] and a.shape[1] > 0
            and 0 < g.shape[1] <= DROP_MAX_N and a.strides[1] == 4 and a.strides[0] % 4 == 0
            and g.strides[1] == 4 and g.strides[0] % 4 == 0)


def _drop_nj(n):
    return next(nj for nj in kn.DROP_TILES if 8 * nj >= n)


def _slices(blocks, long, step, most, per_sm):
    """``(slices, width)`` of a long dimension cut into at most ``most`` slices so that ``blocks`` per slice fill
    the GPU (``per_sm`` blocks per SM), each slice ``width`` long, a multiple of ``step`` and at least 4 steps."""
    sms = device_attributes()["MultiProcessorCount"]
    s = max(1, min(most, -(-long // (4 * step)), per_sm * sms // blocks))
    width = -(-(-(-long // s)) // step) * step
    return -(-long // width), width


#: Devices and streams whose partial sums are kept (one buffer each, the largest asked for), oldest dropped.
DROP_SCRATCH_KEEP = 16


def _partials(stream, capturing, size):
    """The partial sums of a sliced launch (``size`` floats): the graph's own under a capture, else a view of the
    stream's one buffer (calls on one stream run in order), replaced by one twice as large where too small, so
    new row counts each step keep one buffer, not one per count (a launch holds the buffer it was bound to)."""
    cp = get_cupy()
    if capturing:
        return cp.ndarray((size,), _F32)
    key = (cp.cuda.runtime.getDevice(), stream)
    buf = _drop_scratch.get(key)
    if buf is None or buf.size < size:
        buf = cp.ndarray((max(size, 0 if buf is None else 2 * buf.size),), _F32)
    keep(_drop_scratch, key, buf, DROP_SCRATCH_KEEP)
    return buf[:size]


def _drop_bind(kind, a, b, p):
    """``f(a, b, c, seed)``: the launch of ``tcgnn_drop_mm`` (``kind`` "mm") or ``tcgnn_drop_atb`` ("atb") for
    operands of this signature on the current stream, kept in the store of bound calls."""
    cp = get_cupy()
    stream = cp.cuda.get_current_stream()
    place = (cp.cuda.runtime.getDevice(), stream.ptr)
    key = ("drop", kind, a.shape, a.strides, a.data.ptr & 15, b.shape, b.strides, b.data.ptr & 15, p) + place
    hit = BOUND.get(key)
    if hit is not None:
        return hit
    capturing = stream.is_capturing()
    m, k = a.shape
    n = b.shape[1]
    nj = _drop_nj(n)
    fixed = dict(m=m, n=n, k=k, lda=a.strides[0] // 4, drop_p=p, drop_scale=1 / (1 - p))
    if kind == "mm":
        blocks = -(-m // 256)  # (4 warps of 64 rows a block)
        slices, width = _slices(blocks, k, 16, k, DROP_MM_BLOCKS_PER_SM)
        vec = int(a.strides[0] % 16 == 0 and k % 4 == 0 and a.data.ptr % 16 == 0)
        fixed.update(sb=b.strides[0] // 4, tb=b.strides[1] // 4, vec=vec, kc=width)
        name, operands, out = kn.drop_mm_name(nj), ("A", "B"), m * n
    else:
        blocks = -(-k // 256)  # (4 warps of 64 columns a block)
        slices, width = _slices(blocks, m, 16, DROP_ATB_MAX_SLICES, DROP_ATB_BLOCKS_PER_SM)
        vec = int(a.strides[0] % 8 == 0 and k % 2 == 0 and a.data.ptr % 8 == 0)
        fixed.update(ldg=b.strides[0] // 4, vec=vec, rc=width)
        name, operands, out = kn.drop_atb_name(nj), ("A", "G"), k * n
    if slices == 1:
        one = sk.launch(name, (blocks, 1), 128, operands + ("C", "seed"), P=None, **fixed)
        return BOUND.put(key, one.bind(), place, capturing)
    # the slices' partial sums, then their sum in slice order (tcgnn_dense_atb_sum)
    P = _partials(stream.ptr, capturing, slices * out)
    first = sk.launch(name, (blocks, slices), 128, operands + ("seed",), C=None, P=P, **fixed).bind()
    total = _slice_sum(P, slices, out)

    def two(a, b, c, seed):
        first(a, b, seed)
        total(c)

    return BOUND.put(key, two, place, capturing)


def _result(out, shape):
    """``out`` (a C-contiguous float32 array of ``shape``, which the kernel writes whole), or a new one."""
    if out is None:
        return get_cupy().ndarray(shape, _F32)
    if out.shape != shape or out.dtype != _F32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {shape}, got {out.dtype} {out.shape}")
    return out


def drop_mm(a, b, seed, p, out=None):
    """``dropout(a, p) @ b`` for operands :func:`drop_takes` takes, a C-contiguous float32 array (``out``, or a new
    one): each value of ``a`` masked in registers as the dropout kernel masks it (``seed``, a dropout seed on the
    device, :func:`tcgnn_py.products.pointwise.draw`), so a dropped input is read once and never written masked.

    On TF32 tensor cores in three products per pair of operands (each split into a TF32 value and its TF32
    remainder), so the sums stay within a few float32 roundings, in a fraction of float32 cores' time.  A wide
    ``a`` is cut into slices of its columns that fill the GPU, whose partial sums a second launch adds in slice
    order (the same bits on every run)."""
    c = _result(out, (a.shape[0], b.shape[1]))
    if a.shape[0]:
        _drop_bind("mm", a, b, float(p))(a, b, c, seed)
    return c


def drop_atb(a, g, seed, p, out=None):
    """``dropout(a, p)ᵀ g`` for operands :func:`drop_atb_takes` takes (a dropped input's weight gradient, the mask
    recomputed from ``seed`` as :func:`drop_mm` applies it), a ``(a.shape[1], g.shape[1])`` float32 array (``out``,
    or a new one); 3xTF32 as :func:`drop_mm`, the rows cut into slices whose partial sums a second launch adds in
    slice order."""
    c = _result(out, (a.shape[1], g.shape[1]))
    if a.shape[0]:
        _drop_bind("atb", a, g, float(p))(a, g, c, seed)
    else:
        c.fill(0)
    return c


def drop_bound(kind, a, b, p, keep=False):
    """:func:`drop_mm` (``kind`` "mm") or :func:`drop_atb` ("atb") for operands of the signature of these, as
    ``f(a, b, seed)``, its launch bound now (a bound layer call's); ``keep`` as in :func:`dense_mm_bound`.  None for
    an empty ``a``."""
    if not a.shape[0]:
        return None
    cp = get_cupy()
    run = _drop_bind(kind, a, b, float(p))
    shape = (a.shape[0], b.shape[1]) if kind == "mm" else (a.shape[1], b.shape[1])
    nd = same_array(cp.ndarray(shape, _F32)) if keep else recycled(shape, _F32)

    def dropped(a, b, seed):
        c = nd(shape, _F32)
        run(a, b, c, seed)
        return c

    return dropped
