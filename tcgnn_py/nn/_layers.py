"""Layer 4: functional GNN layers with explicit backward passes.

Every layer is a function ``f(inputs...) -> (out, vjp)``: ``vjp(g)`` maps the
gradient of a loss with respect to ``out`` to the gradients with respect to
the differentiable inputs, in order (the vector-Jacobian product, as
``jax.vjp`` returns it).  No autograd framework; arrays are NumPy on the CPU
and CuPy on the GPU, and everything runs on the graph's device.
"""

import functools
import numbers

import numpy as np

from .._device import DeviceMismatchError, array_module, is_cupy_array
from .._tiled import bound_spmm
from .._validation import check_bool, is_half, promote
from .._cache import keep
from ..products import dense, pointwise
from . import _bound as bound
from ._edges import edges_of, features_on, floats
from ._record import Op, Tape, bind, general, general_vjp, input_grad_option

__all__ = [
    "gcn_conv",
    "linear",
    "relu",
    "elu",
    "dropout",
    "bias_act_dropout",
    "cross_entropy",
    "accuracy",
]

#: Activations of :func:`bias_act_dropout` (the training family's vocabulary, which its kernels number).
ACTIVATIONS = tuple(pointwise.ACTIVATIONS)
#: Columns of ones kept for :func:`column_sums` (by device, length and dtype): a few, since a model has few widths.
ONES_KEEP = 16
_ones = {}


def probability(name, p):
    """A probability in ``[0, 1)`` (a dropout rate), a real number; errors name it."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"{name} must be a real number in [0, 1), got {type(p).__name__}")
    if not 0 <= p < 1:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
    return float(p)


def dropout_rate(dropout_p):
    """A layer's ``dropout_p`` as :func:`probability` checks it (the default 0.0 without a call: a layer's hot path)."""
    return dropout_p if dropout_p == 0.0 and type(dropout_p) is float else probability("dropout_p", dropout_p)


def check_bias(b, width, what="d_out"):
    """A bias of shape ``(width,)``, or a ``ValueError`` naming ``b`` (a NumPy broadcast would accept others)."""
    if b.shape != (width,):
        raise ValueError(f"b must have shape ({width},) ({what}), got {b.shape}")


def check_2d(name, X, rows=None):
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {X.shape}")
    if rows is not None and X.shape[0] != rows:
        raise ValueError(f"{name} has {X.shape[0]} rows, the graph has {rows} nodes")


def check_rows_index(xp, index, covers):
    """``index`` as a non-empty 1-D integer array of rows (what ``covers`` covers), or an error naming it: an empty
    one would make a mean of nothing (NaN), and a boolean mask would be taken as the row numbers 0 and 1."""
    index = xp.asarray(index)
    if index.ndim != 1 or not index.size:
        raise ValueError(f"index must be a non-empty 1-D array of rows, got shape {index.shape}")
    if index.dtype.kind not in "iu":
        raise TypeError(f"index must be integers (the rows {covers} covers), got dtype {index.dtype}")
    return index


def check_weight(layer, H, W):
    """``W`` 2-D with a row per feature of ``H``, or a ``ValueError`` naming the layer, H's width and W's height."""
    check_2d("W", W)
    if W.shape[0] != H.shape[1]:
        raise ValueError(f"{layer}: H has {H.shape[1]} features, W expects {W.shape[0]}")


def mm(a, b, bias=None):
    """``a @ b (+ bias)``; on the GPU a layer's own products run in bound launches of the training family
    (:func:`tcgnn_py.products.dense.dense_mm` for ``H W``, the bias added there, and
    :func:`~tcgnn_py.products.dense.dense_atb` for a weight's gradient ``Hᵀ G``), the others through
    :func:`tcgnn_py.kernels.blas.matmul` (cuBLAS that CUDA graphs can capture): cuBLAS costs more on the host
    per call than such a product takes on the GPU.

    16-bit operands accumulate in float32 and are rounded once, on both devices (cuBLAS's compute type on the
    GPU; on the host NumPy would accumulate float16 in float16, and 20-60x slower than float32).
    """
    if array_module(a) is np:
        if is_half(a.dtype) or is_half(b.dtype):
            out = promote(a.dtype, b.dtype)
            c = (a.astype(np.float32) @ b.astype(np.float32)).astype(out)
        else:
            c = a @ b
        if bias is not None:
            c += bias
        return c
    if dense.dense_takes(a, b):
        if _bias_in_epilogue(a, bias):
            return dense.dense_mm(a, b, bias)
        c = dense.dense_mm(a, b)
    elif a.ndim == 2 and dense.dense_atb_takes(a.T, b):  # a weight's gradient Hᵀ G: a sum over the rows
        c = dense.dense_atb(a.T, b)
    else:
        from ..kernels.blas import matmul

        c = matmul(a, b)
    if bias is not None:
        c += bias
    return c


def _bias_in_epilogue(a, bias):
    """Whether the training family's product ``a @ b`` adds ``bias`` in its epilogue: none, or one of a's dtype,
    contiguous (the kernel reads it so)."""
    return bias is None or bias.dtype == a.dtype and bias.flags.c_contiguous


def _bias_kernel_takes(x, b):
    """Whether :func:`tcgnn_py.products.pointwise.add_bias` adds ``b`` to ``x`` in place: on the GPU, one dtype the
    kernel takes, both contiguous, x 2-D."""
    return (array_module(x) is not np and x.dtype == b.dtype and pointwise.takes(x.dtype) and x.flags.c_contiguous
            and b.flags.c_contiguous and x.ndim == 2)


def add_bias(x, b):
    """``x += b`` (one value per column); on the GPU one bound launch where the dtypes match and both are
    contiguous (:func:`tcgnn_py.products.pointwise.add_bias`), else the broadcast add."""
    if _bias_kernel_takes(x, b):
        return pointwise.add_bias(x, b)
    x += b
    return x


def column_sums(g):
    """``g.sum(axis=0)``; on the GPU as ``1ᵀ g`` (:func:`tcgnn_py.products.dense.dense_atb`, else cuBLAS),
    since CuPy reduces a tall, narrow array along its long axis with one block per column (milliseconds at a
    million rows)."""
    xp = array_module(g)
    if xp is np:
        return g.sum(axis=0)
    if dense.dense_atb_takes(None, g):
        return dense.dense_atb(None, g)
    return mm(_ones_row(xp, g.shape[0], g.dtype), g).reshape(g.shape[1])


def _ones_row(xp, n, dtype):
    """A ``(1, n)`` row of ones on the current device, made once per device, length and dtype (at most
    :data:`ONES_KEEP`, oldest dropped).  Not kept when made under a capture, where only a replay would fill it;
    complete before it is kept, as another stream may read it next."""
    key = (xp.cuda.runtime.getDevice(), n, np.dtype(dtype).str)
    value = _ones.get(key)
    if value is None:
        value = xp.ones((1, n), dtype=dtype)
        stream = xp.cuda.get_current_stream()
        if not stream.is_capturing():
            stream.synchronize()
            keep(_ones, key, value, ONES_KEEP)
    return value


def gcn_conv(A, H, W, b=None, *, precision=None, dropout_p=0.0, rng=None):
    """Graph convolution (Kipf & Welling): ``out = A @ dropout(H) @ W (+ b)``.

    Parameters
    ----------
    A : TiledMatrix, shape (n, n)
        The propagation matrix, usually :func:`gcn_norm` of the adjacency.
    H : array, shape (n, d_in)
    W : array, shape (d_in, d_out)
    b : array, shape (d_out,), optional
    precision : {None, "tf32", "fp32", "fp16", "bf16"}, optional
        For the sparse products (see :func:`tcgnn_py.spmm`).
    dropout_p : float in [0, 1), default 0
        Inverted dropout on ``H`` (as :func:`dropout`, the same mask for
        the same seed), 0 for none: an input layer's dropout.
    rng : numpy.random.Generator or cupy.random.Generator, optional
        On H's device; needed when ``dropout_p > 0``.

    Returns
    -------
    out : array, shape (n, d_out)
    vjp : callable
        ``vjp(g, input_grad=True) -> (dH, dW, db)``; ``dH`` is None when
        ``input_grad`` is False (an input layer) and ``db`` when ``b`` is.
        The backward pass multiplies by ``Aᵀ`` (translated once per matrix),
        so directed graphs get the right gradient.

    Notes
    -----
    The sparse product runs on the narrower side: ``A @ (H @ W)`` when
    ``d_out <= d_in``, else ``(A @ H) @ W``.  There, on the GPU, a wide
    float32 ``H`` is dropped as the product reads it
    (:func:`tcgnn_py.products.dense.drop_takes`,
    :func:`~tcgnn_py.products.dense.drop_mm`, and ``dW`` by
    :func:`~tcgnn_py.products.dense.drop_atb`): it is read once per pass
    and no dropped copy is written.  Those products run on tensor cores in
    3xTF32 (within a few float32 roundings); elsewhere the dropout runs
    first.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> A = tg.nn.gcn_norm(sp.csr_array(np.array([[0, 1], [1, 0]])), dtype=np.float64)
    >>> out, vjp = tg.nn.gcn_conv(A, np.eye(2), np.array([[1.0], [3.0]]))
    >>> print(out.ravel().round(6).tolist())
    [2.0, 2.0]
    >>> dH, dW, db = vjp(np.ones((2, 1)))
    >>> print(dW.ravel().round(6).tolist(), db)
    [1.0, 1.0] None
    """
    p = dropout_rate(dropout_p)
    key = None
    if precision is None or type(precision) is str:
        key, call = bound.lookup(A, (H, W, b), ("gcn_conv", precision, p))
        if call is not None:
            return call(H, W, b, _layer_seed(rng) if p else None)
    E = edges_of(A, precision)
    H, W = features_on(E, H, "H"), features_on(E, W, "W")
    check_2d("H", H, E.shape[1])
    check_weight("gcn_conv", H, W)
    if b is not None:
        b = features_on(E, b, "b")
        check_bias(b, W.shape[1])
    narrow_first = W.shape[1] <= W.shape[0]
    first = bool(p) and not _reads_dropped(H, W)  # (the product does not read H dropped: the dropout runs first)
    if first and not _seeded_dropout(H):
        return _dropped_first(A, H, W, b, precision, p, rng)
    seed = _layer_seed(rng) if p else None
    tape = general if key is None else Tape()
    out, mid = _gcn(tape, E, narrow_first, H, W, b, seed, p, first)
    grads = functools.partial(_gcn_grads, E, narrow_first, p, first)
    inputs = (H, W, b, seed)
    if key is not None:
        bound.seen(A, key, lambda: bind(E, tape, inputs, (out, mid), grads, input_grad_option))
    return out, functools.partial(general_vjp, E, grads, input_grad_option, inputs + (out, mid), len(inputs))


def _drops_on_read(H, W):
    """Whether ``H W`` can read ``dropout(H)`` itself: CuPy arrays that
    :func:`tcgnn_py.products.dense.drop_takes` takes; else the dropout runs first."""
    return is_cupy_array(H) and is_cupy_array(W) and dense.drop_takes(H, W)


def _reads_dropped(H, W):
    """Whether :func:`gcn_conv`'s product reads ``dropout(H)`` itself: it runs ``H W`` first (the narrower side)
    and :func:`_drops_on_read`."""
    return W.ndim == 2 and W.shape[1] <= W.shape[0] and _drops_on_read(H, W)


def _layer_seed(rng):
    """A dropout seed on the device from ``rng`` (:func:`tcgnn_py.products.pointwise.draw`): a CuPy generator's."""
    if rng is None:
        raise ValueError("dropout in training needs rng (tcgnn_py.nn.default_rng(seed, like=A))")
    if isinstance(rng, np.random.Generator):
        raise TypeError("dropout on a device array needs a cupy.random.Generator (cupy.random.default_rng)")
    return pointwise.draw(rng)


def _seeded_dropout(H):
    """Whether the dropout of ``H`` runs on the device from a seed (the training family's kernel for its dtype):
    then a layer's tape holds it (:data:`DROPOUT`, its mask recomputed in the vjp), and a bound call replays it."""
    return array_module(H) is not np and pointwise.takes(H.dtype)


def _dropped_first(A, H, W, b, precision, p, rng):
    """:func:`gcn_conv` of ``dropout(H)`` where the dropout runs first off the device's seeded kernel (on the host,
    or a dtype it does not take): its vjp's ``dH`` through the dropout's."""
    Hd, d_vjp = dropout(H, p, rng)  # (H on the graph's device: the caller's conversion)
    return _through_dropout(*gcn_conv(A, Hd, W, b, precision=precision), d_vjp)


def _through_dropout(out, vjp, d_vjp):
    """``(out, vjp)`` of a layer of a dropped input whose dropout ran first: its ``dH`` through ``d_vjp``."""

    def dropped_vjp(g, input_grad=True):
        dH, dW, db = vjp(g, input_grad=input_grad)
        return (None if dH is None else d_vjp(dH)), dW, db

    return out, dropped_vjp


def _gcn(t, E, narrow_first, H, W, b, seed=None, p=0.0, first=False):
    """:func:`gcn_conv`'s forward on tape ``t`` (:mod:`._record`): ``(out, mid)``, ``mid = A H`` where the product
    runs wide first (the vjp reads it), ``dropout(H)`` where it runs narrow first on H dropped ``first``, else
    None.  ``seed``: H dropped at rate ``p``, as the product reads it, or ``first`` by the dropout's kernel."""
    if first:
        H = t(DROPOUT, H, seed, p)
    if narrow_first:
        out = t(SPMM, E, t(MM, H, W) if seed is None or first else t(DROP_MM, H, W, seed, p))
        if b is not None:
            out = t(ADD_BIAS, out, b)
        return out, (H if first else None)
    mid = t(SPMM, E, H)
    return t(MM, mid, W, b), mid


def _gcn_grads(E, narrow_first, p, first, t, H, W, b, seed, out, mid, g, input_grad=True):
    """:func:`gcn_conv`'s vjp on tape ``t``: ``(dH, dW, db)``; ``dH`` through the dropout's mask where there is
    one (``seed``)."""
    if narrow_first:
        dZ = t(SPMM_T, E, g)
        if first or seed is None:
            dW = t(ATB, mid if first else H, dZ)
        else:
            dW = t(DROP_ATB, H, dZ, seed, p)
        dH = t(MM_T, dZ, W) if input_grad else None
    else:
        dW = t(ATB, mid, g)
        dH = t(SPMM_T, E, t(MM_T, g, W)) if input_grad else None
    if dH is not None and seed is not None:
        dH = t(DROP_GRAD, dH, seed, p)
    return dH, dW, (t(SUMS, g) if b is not None else None)


def mm_bound(a, b, bias=None, keep=False):
    """``f(a, b[, bias])``: :func:`mm` for operands of the signature of these, bound where the training family's
    kernel runs it (a bound layer call's), else :func:`mm` itself.  ``keep``: a bound product's result is one array,
    written by every call (an intermediate of the bound call)."""
    if array_module(a) is not np and dense.dense_takes(a, b) and _bias_in_epilogue(a, bias):
        f = dense.dense_mm_bound(a, b, bias, keep=keep)
        if f is not None:
            return f
    return mm


def mm_t_bound(a, w, keep=False):
    """``f(a, w) -> a @ w.T`` for operands of the signature of these (``w`` passed, not its transposed view: the
    bound kernel reads its address with the view's strides fixed); ``keep`` as in :func:`mm_bound`."""
    if array_module(a) is not np and dense.dense_takes(a, w.T):
        f = dense.dense_mm_bound(a, w.T, keep=keep)
        if f is not None:
            return f
    return lambda a, w: mm(a, w.T)


def atb_bound(a, b, keep=False):
    """``f(a, b) -> aᵀ b`` (a weight's gradient) for operands of the signature of these: :func:`mm` of ``a.T``,
    bound where it runs the training family's sums over rows; ``keep`` as in :func:`mm_bound`."""
    if array_module(a) is not np and not dense.dense_takes(a.T, b) and dense.dense_atb_takes(a, b):
        return dense.dense_atb_bound(a, b, keep=keep)
    return lambda a, b: mm(a.T, b)


def sums_bound(g):
    """``f(g)``: :func:`column_sums` for ``g`` of the signature of this one."""
    if array_module(g) is not np and dense.dense_atb_takes(None, g):
        return dense.dense_atb_bound(None, g)
    return column_sums


def bias_bound(x, b):
    """``f(x, b)``: :func:`add_bias` (in place) for operands of the signature of these."""
    if _bias_kernel_takes(x, b):
        return pointwise.add_bias_bound(x, b)
    return add_bias


def _spmm(E, X):
    return E.spmm(X)


def _spmm_bound(E, X, keep=False):
    return bound_spmm(E.matrix, X, E.precision, keep=keep)


def _spmm_t(E, X):
    return E.spmm_t(X)


def _spmm_t_bound(E, X, keep=False):
    return bound_spmm(E.matrix.T, X, E.precision, keep=keep)


def _mm_op_bound(a, b, bias=None, keep=False):
    return mm_bound(a, b, bias, keep=keep)


def _atb(a, b):
    return mm(a.T, b)


def _mm_t(a, w):
    return mm(a, w.T)


def _sums_bound(g, keep=False):
    return sums_bound(g)


def _add_bias_bound(x, b, keep=False):
    f = bias_bound(x, b)

    def add(x, b):  # (in place: the step's result is x)
        f(x, b)
        return x

    return add


def _drop_mm_bound(a, w, seed, p, keep=False):
    return dense.drop_bound("mm", a, w, p, keep)


def _drop_atb_bound(a, g, seed, p, keep=False):
    return dense.drop_bound("atb", a, g, p, keep)


def _drop_grad(g, seed, p):
    """The dropout's vjp: ``g`` times the mask of ``seed`` and the scale."""
    g = array_module(g).ascontiguousarray(g)
    return pointwise.tail_grad(g, None, None, None, p, seed)


def _drop_grad_bound(g, seed, p, keep=False):
    return lambda g, seed: _drop_grad(g, seed, p)


def _dropout(h, seed, p):
    """``dropout(h)`` by the mask of ``seed`` and the scale (:func:`dropout`'s kernel, the same mask)."""
    return pointwise.tail(array_module(h).ascontiguousarray(h), None, None, p, seed)


def _dropout_bound(h, seed, p, keep=False):
    return lambda h, seed: _dropout(h, seed, p)


#: The layers' primitives (:class:`._record.Op`): each general form beside its bound form.
MM = Op(mm, _mm_op_bound)  # a @ b (+ bias)
ATB = Op(_atb, atb_bound)  # aᵀ b
MM_T = Op(_mm_t, mm_t_bound)  # a wᵀ
SUMS = Op(column_sums, _sums_bound)  # the sums over rows
ADD_BIAS = Op(add_bias, _add_bias_bound)  # x += b, in place
SPMM = Op(_spmm, _spmm_bound)  # A X on an edge view E
SPMM_T = Op(_spmm_t, _spmm_t_bound)  # Aᵀ X
DROP_MM = Op(dense.drop_mm, _drop_mm_bound)  # dropout(a) @ w, the mask of (seed, p) applied as a is read
DROP_ATB = Op(dense.drop_atb, _drop_atb_bound)  # dropout(a)ᵀ g, the mask recomputed
DROP_GRAD = Op(_drop_grad, _drop_grad_bound)  # g * mask
DROPOUT = Op(_dropout, _dropout_bound)  # h * mask, a new array


def linear(H, W, b=None, *, dropout_p=0.0, rng=None):
    """Dense layer ``out = dropout(H) @ W (+ b)``; ``vjp(g, input_grad=True) -> (dH, dW, db)``.

    ``dropout_p`` and ``rng`` as in :func:`gcn_conv`: on the GPU a wide float32 ``H`` is dropped as the product
    reads it (:func:`tcgnn_py.products.dense.drop_mm`, ``dW`` by :func:`~tcgnn_py.products.dense.drop_atb`),
    elsewhere the dropout runs first.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> out, vjp = tg.nn.linear(np.ones((2, 3)), np.ones((3, 1)), np.array([1.0]))
    >>> print(out.ravel().tolist())
    [4.0, 4.0]
    """
    p = dropout_rate(dropout_p)
    H, W = floats(H, "H"), floats(W, "W")
    check_2d("H", H)
    check_weight("linear", H, W)
    if b is not None:
        b = floats(b, "b")
        check_bias(b, W.shape[1])
    if p and not _drops_on_read(H, W):
        Hd, d_vjp = dropout(H, p, rng)
        return _through_dropout(*linear(Hd, W, b), d_vjp)
    if p:
        seed = _layer_seed(rng)
        out = dense.drop_mm(H, W, seed, p)
        if b is not None:
            out = add_bias(out, b.astype(out.dtype, copy=False))
    else:
        out = mm(H, W, b)

    def vjp(g, input_grad=True):
        if not p:
            return mm(g, W.T) if input_grad else None, mm(H.T, g), column_sums(g) if b is not None else None
        g = array_module(g).ascontiguousarray(g, dtype=np.float32)  # (the dropped product's kernel reads it so)
        if g.shape != out.shape:
            raise ValueError(f"g must have the output's shape {out.shape}, got {g.shape}")
        dH = _drop_grad(mm(g, W.T), seed, p) if input_grad else None
        return dH, dense.drop_atb(H, g, seed, p), column_sums(g) if b is not None else None

    return out, vjp


def relu(H):
    """``max(H, 0)``; ``vjp(g) -> g * (H > 0)``.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> out, vjp = tg.nn.relu(np.array([-1.0, 2.0]))
    >>> print(out.tolist(), vjp(np.array([5.0, 5.0])).tolist())
    [0.0, 2.0] [0.0, 5.0]
    """
    H = floats(H, "H")
    xp = array_module(H)
    if xp is not np and pointwise.takes(H.dtype):
        return _device_tail(xp, H, None, "relu", 0.0, None)
    keep = H > 0
    return xp.where(keep, H, 0).astype(H.dtype, copy=False), lambda g: g * keep


def elu(H):
    """``H`` where positive, ``exp(H) - 1`` elsewhere (GAT's activation); ``vjp(g) -> g * (1 or exp(H))``.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> out, vjp = tg.nn.elu(np.array([0.0, 2.0]))
    >>> print(out.tolist(), vjp(np.array([5.0, 5.0])).tolist())
    [0.0, 2.0] [5.0, 5.0]
    """
    H = floats(H, "H")
    xp = array_module(H)
    if xp is not np and pointwise.takes(H.dtype):
        return _device_tail(xp, H, None, "elu", 0.0, None)
    keep = H > 0
    e = xp.exp(xp.minimum(H, 0))
    return xp.where(keep, H, e - 1).astype(H.dtype, copy=False), lambda g: g * xp.where(keep, 1, e).astype(g.dtype)


def dropout(H, p, rng, *, training=True):
    """Inverted dropout: zero each entry with probability ``p``, scale the rest by ``1/(1-p)``.

    Parameters
    ----------
    H : array
    p : float in [0, 1)
    rng : numpy.random.Generator or cupy.random.Generator
        On H's device (``numpy.random.default_rng`` / ``cupy.random.default_rng``).  On the GPU each call
        takes the next seed of rng's seed stream on the device (:func:`tcgnn_py.products.pointwise.draw`: one
        number drawn from rng at its first use keys it) and the mask is a hash of the seed and each element's
        index, so the backward pass recomputes the mask instead of keeping an array of H's size.
    training : bool, default True
        False (or ``p == 0``) returns H unchanged.

    Returns
    -------
    out, vjp
        ``vjp(g)`` applies the same mask and scale to g.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> out, vjp = tg.nn.dropout(np.ones(10000), 0.5, np.random.default_rng(0))
    >>> sorted(set(out.tolist())), bool(abs(out.mean() - 1) < 0.05)
    ([0.0, 2.0], True)
    """
    p = probability("dropout probability p", p)
    H = floats(H, "H")
    if not check_bool("training", training) or p == 0:
        return H, lambda g: g
    if rng is None:
        raise ValueError("dropout in training needs rng (tcgnn_py.nn.default_rng(seed, like=A))")
    xp = array_module(H)
    if xp is not np and isinstance(rng, np.random.Generator):
        raise TypeError("dropout on a device array needs a cupy.random.Generator (cupy.random.default_rng)")
    if xp is not np and pointwise.takes(H.dtype):
        return _device_tail(xp, H, None, None, p, pointwise.draw(rng))
    keep = rng.random(H.shape, dtype=np.float32) >= p
    scale = H.dtype.type(1 / (1 - p))
    mask = keep.astype(H.dtype) * scale
    return H * mask, lambda g: g * mask


def bias_act_dropout(H, b=None, act=None, p=0.0, rng=None, *, training=True):
    """A layer's elementwise tail, ``dropout(act(H + b), p)``, in one pass on the GPU (forward and backward).

    ``gcn_conv(A, H, W)`` followed by ``bias_act_dropout(Z, b, "relu", 0.5, rng)`` is GCN's hidden layer and
    the next layer's input dropout: one kernel instead of four elementwise passes, and the backward pass
    recomputes the dropout mask (a hash, as :func:`dropout`) instead of reading a stored one.

    Parameters
    ----------
    H : array, shape (n, d)
    b : array, shape (d,), optional
    act : {None, "relu", "elu"}
    p : float in [0, 1)
        Dropout probability after the activation; 0 (or ``training`` False) for none.
    rng : numpy.random.Generator or cupy.random.Generator, optional
        On H's device; needed when ``p > 0`` in training.
    training : bool, default True

    Returns
    -------
    out : array, shape (n, d), of H's (float) dtype
    vjp : callable
        ``vjp(g) -> (dH, db)``; ``db`` is None without ``b``.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> out, vjp = tg.nn.bias_act_dropout(np.array([[-2.0, 1.0]]), np.array([1.0, 1.0]), "relu")
    >>> print(out.tolist(), [x.tolist() for x in vjp(np.array([[5.0, 5.0]]))])
    [[0.0, 2.0]] [[[0.0, 5.0]], [0.0, 5.0]]
    """
    if act not in ACTIVATIONS:
        raise ValueError(f"act must be one of {ACTIVATIONS}, got {act!r:.60}")
    p = probability("dropout probability p", p)
    if not check_bool("training", training):
        p = 0.0
    H = floats(H, "H")
    check_2d("H", H)
    xp = array_module(H)
    if b is not None:
        b = floats(b, "b")
        if array_module(b) is not xp:
            raise DeviceMismatchError("b must be on H's device")
        check_bias(b, H.shape[1], "H's columns")
    if p and rng is None:
        raise ValueError("dropout in training needs rng (tcgnn_py.nn.default_rng(seed, like=A))")
    if xp is not np and pointwise.takes(H.dtype):
        if p and isinstance(rng, np.random.Generator):
            raise TypeError("dropout on a device array needs a cupy.random.Generator (cupy.random.default_rng)")
        out, tail_vjp = _device_tail(xp, H, b, act, p, pointwise.draw(rng) if p else None)

        def vjp(g):
            dz = tail_vjp(g)
            return dz, None if b is None else column_sums(dz)

        return out, vjp
    Z = H if b is None else H + b.astype(H.dtype, copy=False)
    Z, a_vjp = (Z, lambda g: g) if act is None else (relu if act == "relu" else elu)(Z)
    out, d_vjp = dropout(Z, p, rng)

    def host_vjp(g):
        dz = a_vjp(d_vjp(g))
        return dz, None if b is None else column_sums(dz)

    return out, host_vjp


def _device_tail(xp, H, b, act, p, seed):
    """``(out, vjp)`` of ``dropout(act(H + b))`` by the training family's kernels (``seed`` None: no dropout).

    ``vjp(g)`` recomputes the mask from the seed and the activation's slope from ``H`` and ``b``, in ``g``'s dtype
    (as ``g * mask`` would be).
    """
    x = xp.ascontiguousarray(H)
    if b is not None:
        b = xp.ascontiguousarray(b, dtype=x.dtype)
    out = pointwise.tail(x, b, act, p, seed)

    def vjp(g):
        g = xp.asarray(g)
        if g.shape != out.shape:
            raise ValueError(f"g must have the output's shape {out.shape}, got {g.shape}")
        g = xp.ascontiguousarray(g)
        if not pointwise.takes(g.dtype):
            g = g.astype(x.dtype)
        xs, bs = (x, b) if act is not None else (None, None)
        if g.dtype != x.dtype and act is not None:
            xs, bs = x.astype(g.dtype), None if b is None else b.astype(g.dtype)
        return pointwise.tail_grad(g, xs, bs, act, p, seed)

    return out, vjp


def cross_entropy(logits, labels, index=None):
    """Mean softmax cross-entropy over the nodes in ``index``, and its gradient.

    Parameters
    ----------
    logits : array, shape (n, classes)
    labels : int array, shape (n,)
        Integers in ``[0, classes)`` on the rows of ``index`` (checked on the
        host; on the device, where checking would cost a synchronisation, a
        label out of range matches no class: its row adds its log-sum-exp).
    index : int array, optional
        The nodes the loss covers (a training split), 1-D and non-empty; all nodes by default.

    Returns
    -------
    loss : float-valued 0-d array (on logits' device: no synchronisation)
    dlogits : array, shape (n, classes)
        Zero outside ``index``.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> loss, g = tg.nn.cross_entropy(np.zeros((2, 4)), np.array([0, 3]))
    >>> round(float(loss), 6) == round(float(np.log(4)), 6), g[0].tolist()
    (True, [-0.375, 0.125, 0.125, 0.125])
    """
    xp = array_module(logits)
    check_2d("logits", logits)
    n, k = logits.shape
    labels = xp.asarray(labels).reshape(n, 1)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"labels must be integers, got dtype {labels.dtype}")
    if index is not None:
        index = check_rows_index(xp, index, "the loss")
    if xp is not np and k and pointwise.takes(logits.dtype):
        # one kernel: each row's softmax, loss and gradient in one pass (a dozen array passes otherwise)
        if index is None:
            w, w0 = None, 1 / n if n else 0.0
        else:  # the rows' weights by one launch (a scatter costs several)
            w = pointwise.index_weights(n, index.astype(np.int64, copy=False), 1 / index.shape[0], logits.dtype)
            w0 = 0.0
        # the loss summed in one fixed order by the same launch
        return pointwise.cross_entropy(xp.ascontiguousarray(logits), labels.reshape(n).astype(np.int64, copy=False),
                                       w, w0)
    if xp is np:
        y = labels if index is None else labels[np.asarray(index)]
        if y.size and (y.min() < 0 or y.max() >= k):
            raise ValueError(f"labels must be in [0, {k}) on the rows the loss covers")
    # Every row is computed and weighted (1/len(index) inside, 0 outside): elementwise
    # passes only, no gathers and scatters of rows (cheap to launch on small graphs).
    if index is None:
        w = xp.full((n, 1), 1 / n, dtype=logits.dtype)
    else:
        w = xp.zeros((n, 1), dtype=logits.dtype)
        w[index] = 1 / index.shape[0]
    z = logits - logits.max(axis=1, keepdims=True)
    ez = xp.exp(z)
    s = ez.sum(axis=1, keepdims=True)
    onehot = xp.arange(k) == labels
    loss = (w * (xp.log(s) - (z * onehot).sum(axis=1, keepdims=True))).sum()
    return loss, (ez / s - onehot) * w


def accuracy(logits, labels, index=None):
    """Fraction of nodes in ``index`` whose arg-max logit is the label (a Python float).

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> tg.nn.accuracy(np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([1, 1]))
    0.5
    """
    xp = array_module(logits)
    check_2d("logits", logits)
    idx = xp.arange(logits.shape[0]) if index is None else check_rows_index(xp, index, "the accuracy")
    labels = xp.asarray(labels)
    if labels.shape != (logits.shape[0],):
        raise ValueError(f"labels has {labels.size} entries, logits has {logits.shape[0]} rows")
    return float((logits[idx].argmax(axis=1) == labels[idx]).mean())  # synchronize!
