"""Layer 4: the sparse products as JAX operations -- public function, FFI call, implementation per platform.

As ``jax.experimental.sparse``: :func:`spmm` checks its operands at trace time (the wording of
:func:`tcgnn_py.spmm`) and calls :func:`_spmm` (a ``custom_vjp`` over the raw FFI call); the FFI target has an
implementation per platform, registered by table (:data:`_IMPLEMENTATIONS`): on the GPU the library's product on
XLA's stream over views of XLA's buffers (no copy, no host read once the product's signature is planned), on the
host the reference product (what CI runs).  The matrix is static: a program carries its registry key
(:mod:`._matrices`) and the precision as its one integer attribute.
"""

import functools

import numpy as np

import jax
import jax.numpy as jnp

from .._cache import keep
from .._tiled import spmm as tiled_spmm
from ..products import MISMATCH, result_dtype, sddmm_raw, settle, signature, spmm_raw
from . import _ffi, _matrices

__all__ = ["spmm", "sddmm", "entries", "SPMM_TARGET", "SDDMM_TARGET"]

#: The FFI target of the product ``T @ x`` (or ``T @ x`` with the entries' values given).
SPMM_TARGET = "tcgnn_py_spmm"
#: The FFI target of SDDMM: ``<a_i, b_j>`` for every stored ``(i, j)``, in the matrix's stored order.
SDDMM_TARGET = "tcgnn_py_sddmm"
#: CuPy views of XLA's streams kept (by address), oldest dropped: a process runs on a stream or a few.
STREAMS_KEEP = 16

_STREAMS = {}


#: The precisions a call may carry, by their code in its attribute (``key * 8 + code``): the library's default
#: ("" -- TF32 tensor cores for float32 operands), then :func:`tcgnn_py.spmm`'s names.
_CODES = ("", "tf32", "fp32", "fp16", "bf16")


def _attribute(key, precision):
    """The one integer a call carries (:mod:`._ffi` reads one attribute): the matrix's key and the precision."""
    return np.int64(key * 8 + _CODES.index(precision))


def _spmm_host(stream, args, rets, code):
    """The host implementation: the reference product of the matrix's host copy into XLA's result buffer (with
    two operands, ``values`` in the matrix's stored order and x)."""
    T, precision = _matrices.host_matrix(code >> 3), _CODES[code & 7] or None
    y = _ffi.host_view(rets[0])
    if len(args) == 1:
        tiled_spmm(T, _ffi.host_view(args[0]), out=y, precision=precision)
    else:
        spmm_raw(T.tiling, _ffi.host_view(args[0]), _ffi.host_view(args[1]), y.dtype, precision, out=y)


def _sddmm_host(stream, args, rets, code):
    T, (a, b) = _matrices.host_matrix(code >> 3), (_ffi.host_view(buf) for buf in args)
    y = _ffi.host_view(rets[0])
    y[...] = sddmm_raw(T.tiling, T.values, a, b, y.dtype, precision=_CODES[code & 7] or None)


def _spmm_device(stream, args, rets, code):
    """The GPU implementation: the library's product on XLA's stream, its operand and result XLA's buffers.  Once
    the product's launch is bound, a call of these buffers on this stream is that launch alone (kept in the
    matrix's store of bound calls: :func:`_keep_bound`): no lookup by signature, no view made.
    With the entries' values given, the values are viewed anew each call (the library keeps forms of a values
    array by its identity; XLA writes new values at an address it reuses) and the product goes the general
    way."""
    T = _matrices.device_matrix(code >> 3)
    store = T.tiling.bound()
    key = ("jax", stream, code, args, rets)
    call = store.get(key)
    if call is not None:
        call()
        return
    precision, Y = _CODES[code & 7] or None, _ffi.device_view(rets[0])
    with xla_stream(stream):
        if len(args) == 2:
            V, X = _ffi.device_view(args[0], kept=False), _ffi.device_view(args[1])
            spmm_raw(T.tiling, V, X, Y.dtype, precision, out=Y)
            return
        X = _ffi.device_view(args[0])
        tiled_spmm(T, X, out=Y, precision=precision)
        _keep_bound(store, key, stream, signature(T._values, X, Y, precision), (T._values, T._casts, X, Y))


def _sddmm_device(stream, args, rets, code):
    """The GPU implementation of SDDMM: the library's kernels on XLA's stream, into XLA's result buffer; bound as
    the product is."""
    T = _matrices.device_matrix(code >> 3)
    store = T.tiling.bound()
    key = ("jax", stream, code, args, rets)
    call = store.get(key)
    if call is not None:
        call()
        return
    precision = _CODES[code & 7] or None
    a, b, y = (_ffi.device_view(buf) for buf in args + rets)
    with xla_stream(stream):
        sddmm_raw(T.tiling, T.values, a, b, y.dtype, precision=precision, out=y)
        _keep_bound(store, key, stream, signature(T.values, a, b, precision, ("sddmm", False, True)),
                    (T.values, {}, a, b, y))


def _keep_bound(store, key, stream, signature_, operands):
    """Keep, under ``key``, a call of the bound launch of the plan of ``signature_`` with these operands, once it has
    one (its launch final, the timed choice made; until then the calls go the general way): its replay with every
    kernel slot written now where the plan gives one (the operands are XLA's buffers of ``key``: their addresses
    are the key's), else the bound launch, run with XLA's stream as CuPy's current one (what it makes anew -- a
    values form dropped since -- is made there)."""
    plan = store.get(signature_)
    if plan is None or plan.bound is None or getattr(plan.bound, "countdown", None) is not None:
        return  # (none yet, or the statistics' launch before the timed choice: a replay would keep it for good)
    fixed = getattr(plan.bound, "fixed", None)
    call = fixed(*operands) if fixed is not None else None
    if call is None:
        bound = plan.bound

        def call():
            with xla_stream(stream):
                bound(*operands)

    store.put(key, call, (_device(), stream))


def _device():
    """The current CUDA device's id (a bound call's place in a store is its device and stream)."""
    import cupy as cp

    return cp.cuda.runtime.getDevice()


class _StreamHandle:
    """A stream address under the CUDA stream protocol (``__cuda_stream__``), what CuPy's ``from_external`` takes."""

    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def xla_stream(ptr):
    """A CuPy view of XLA's stream (kept per address): ``Stream.from_external`` where CuPy has it (its
    ``ExternalStream`` is deprecated there), ``ExternalStream`` on older CuPy."""
    s = _STREAMS.get(ptr)
    if s is None:
        import cupy as cp

        external = getattr(cp.cuda.Stream, "from_external", None)
        s = external(_StreamHandle(ptr)) if external is not None else cp.cuda.ExternalStream(ptr)
        keep(_STREAMS, ptr, s, STREAMS_KEEP)
    return s


#: The implementation of each target per platform, registered when the first call is traced.
_IMPLEMENTATIONS = {SPMM_TARGET: {"cpu": _spmm_host, "CUDA": _spmm_device},
                    SDDMM_TARGET: {"cpu": _sddmm_host, "CUDA": _sddmm_device}}


#: JAX's names of a matmul precision (``jax.default_matmul_precision``, ``jax.lax.Precision``) as the library's:
#: float32 where JAX asks for at least it (``"high"`` is bf16_3x there: nearer float32 than TF32), the library's
#: default otherwise (TF32 tensor cores for float32 operands, as XLA's own GEMMs on the GPU).
_JAX_PRECISIONS = {"highest": "fp32", "float32": "fp32", "high": "fp32", "bfloat16_3x": "fp32",
                   "tensorfloat32": "tf32", "default": "", "fastest": "", "bfloat16": ""}
#: The library's names (:func:`tcgnn_py.spmm`'s ``precision``).
_PRECISIONS = ("tf32", "fp32", "fp16", "bf16")


def _precision(precision, what):
    """The library's precision name ("" for its default) of ``precision``: one of the library's names, JAX's (a
    string or ``jax.lax.Precision``), or None -- JAX's default matmul precision where the call is traced (so
    ``with jax.default_matmul_precision("highest")`` makes the products float32, as it does XLA's GEMMs)."""
    if precision is None:
        precision = jax.config.jax_default_matmul_precision
        if precision is None:
            return ""
    name = precision.name if isinstance(precision, jax.lax.Precision) else precision
    if isinstance(name, str):
        if name in _PRECISIONS:
            return name
        if name.lower() in _JAX_PRECISIONS:
            return _JAX_PRECISIONS[name.lower()]
    raise ValueError(f"{what}: precision must be None, one of {_PRECISIONS}, or a JAX matmul precision "
                     f"({', '.join(sorted(_JAX_PRECISIONS))} or jax.lax.Precision), got {precision!r}")


def _call(target, key, shape, dtype, precision, *operands):
    """The FFI call of ``target`` on the matrix of ``key``.  A GPU matrix is made ready here, at trace time (its
    one wait for the device): XLA may record the call into a command buffer, where nothing may wait."""
    if _matrices.matrix(key).device == "cuda":
        _matrices.device_matrix(key)
    name = _ffi.register_target(target, _IMPLEMENTATIONS[target], warm_up=settle)
    call = jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(shape, dtype), vmap_method="sequential")
    return call(*operands, op=_attribute(key, precision))


def _aligned_columns(f, x):
    """``f(x)`` of a 2-D float32 or 16-bit ``x`` whose columns are padded with zeros to a whole number of 16-byte
    vectors (4 floats, 8 16-bit values), the result's padding cut off: the library's vector kernels gather rows
    as 16-byte vectors (cp.async) only where the width is such a multiple, and XLA's buffers are dense, so a
    width off it (a layer's classes) would run the scalar kernel.  XLA fuses the pad and the cut into the
    operations beside them where it can."""
    D = x.shape[1]
    size = np.dtype(x.dtype).itemsize
    pad = -D % (16 // size) if size in (2, 4) else 0
    if not pad:
        return f(x)
    return f(jnp.pad(x, ((0, 0), (0, pad))))[:, :D]


def _raw(key, x, dtype, precision):
    """The FFI call ``T @ x`` for T of ``key`` and a 2-D x, the result of ``dtype``."""
    n = _matrices.matrix(key).shape[0]
    return _aligned_columns(lambda x: _call(SPMM_TARGET, key, (n, x.shape[1]), dtype, precision, x), x)


@functools.cache
def _product(key, dtype, precision):
    """``f(x) = T @ x`` for T of ``key``, a result of ``dtype``: the FFI call, batched under ``jax.vmap`` by
    folding the batch into the feature width (one product of ``B * D`` columns, the kernels' best case, instead of
    B products)."""

    @jax.custom_batching.custom_vmap
    def f(x):
        return _raw(key, x, dtype, precision)

    @f.def_vmap
    def rule(axis_size, in_batched, x):
        if not in_batched[0]:
            return f(x), False
        k, D = x.shape[1:]
        y = f(jnp.moveaxis(x, 0, 1).reshape(k, axis_size * D))
        return jnp.moveaxis(y.reshape(y.shape[0], axis_size, D), 1, 0), True

    return f


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _spmm(key, dtype, x_dtype, precision, x):
    return _product(key, dtype, precision)(x)


def _spmm_fwd(key, dtype, x_dtype, precision, x):
    return _product(key, dtype, precision)(x), None


def _spmm_bwd(key, dtype, x_dtype, precision, _, g):
    """``dx = Tᵀ g``: the transposed matrix's product (its translation cached on T), cast to x's dtype."""
    T = _matrices.matrix(key)
    dtype = result_dtype(T.dtype, np.dtype(g.dtype))
    return (_product(_matrices.key_of(T.T), dtype, precision)(g).astype(x_dtype),)


_spmm.defvjp(_spmm_fwd, _spmm_bwd)


def _dtype(*dtypes):
    """The product's dtype for operands of these dtypes (:func:`tcgnn_py.products.result_dtype`), at JAX's width."""
    out = np.dtype(dtypes[0])
    for d in dtypes[1:]:
        out = result_dtype(out, np.dtype(d))
    return np.dtype(jax.dtypes.canonicalize_dtype(out))


def _with_values(key, precision, values, x):
    """``A(values) @ x``: the matrix of ``key`` with its entries' values given (stored order)."""
    n, dtype = _matrices.matrix(key).shape[0], _dtype(values.dtype, x.dtype)
    return _aligned_columns(lambda x: _call(SPMM_TARGET, key, (n, x.shape[1]), dtype, precision, values, x), x)


def _sampled(key, precision, a, b):
    """``<a_i, b_j>`` for every stored ``(i, j)`` of the matrix of ``key``, in its stored order."""
    return _call(SDDMM_TARGET, key, (_matrices.matrix(key).nnz,), _dtype(a.dtype, b.dtype), precision, a, b)


def _transposed(key, values):
    """``(key of Aᵀ, Aᵀ's values)``: the transpose's registry key and ``values`` in its stored order."""
    return _matrices.key_of(_matrices.matrix(key).T), values[_matrices.entries(key)[2]]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _spmm_values(key, precision, values, x):
    return _with_values(key, precision, values, x)


def _spmm_values_fwd(key, precision, values, x):
    return _with_values(key, precision, values, x), (values, x)


def _spmm_values_bwd(key, precision, res, g):
    """``d values = <g_i, x_j>`` per entry (an SDDMM), ``dx = A(values)ᵀ g`` (the transpose's product)."""
    values, x = res
    kt, vt = _transposed(key, values)
    return (_sampled(key, precision, g, x).astype(values.dtype),
            _with_values(kt, precision, vt, g).astype(x.dtype))


_spmm_values.defvjp(_spmm_values_fwd, _spmm_values_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _sddmm(key, precision, a, b):
    return _sampled(key, precision, a, b)


def _sddmm_fwd(key, precision, a, b):
    return _sampled(key, precision, a, b), (a, b)


def _sddmm_bwd(key, precision, res, g):
    """``da = A(g) b``, ``db = A(g)ᵀ a``: products with the cotangent as the entries' values."""
    a, b = res
    kt, gt = _transposed(key, g)
    return (_with_values(key, precision, g, b).astype(a.dtype),
            _with_values(kt, precision, gt, a).astype(b.dtype))


_sddmm.defvjp(_sddmm_fwd, _sddmm_bwd)


def _features(name, x, what):
    """``x`` as a float JAX array (an integer one as a float of JAX's width), checked at trace time."""
    x = jnp.asarray(x)
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise TypeError(f"{what}: {name} must be a float or integer array, got dtype {x.dtype}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jax.dtypes.canonicalize_dtype(np.float64))
    return x


def entries(T):
    """``(rows, cols)`` of T's stored entries in its stored order (NumPy int32): the order of the ``values`` that
    :func:`spmm` takes and :func:`sddmm` returns, for edge-wise ``jnp`` work between them (a softmax over each
    row's entries: ``jax.ops.segment_max(e, rows, T.shape[0])``).

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> from tcgnn_py import jax as tgj
    >>> T = tg.TiledMatrix(sp.csr_array(np.array([[0, 2], [1, 0]], dtype=np.float32)), device="cpu")
    >>> [a.tolist() for a in tgj.entries(T)]
    [[0, 1], [1, 0]]
    """
    rows, cols, _ = _matrices.entries(_matrices.key_of(T))
    return rows, cols


def sddmm(T, a, b=None, *, precision=None):
    """``e_ij = <a_i, b_j>`` for every stored ``(i, j)`` of T, inside or outside ``jax.jit``, differentiable in
    ``a`` and ``b``: T's sparsity pattern samples the dense product (T's values are not multiplied in).

    Parameters
    ----------
    T : tcgnn_py.TiledMatrix, shape (n, k)
        Static, as in :func:`spmm`.
    a : jax array, shape (n, d) or (n,)
    b : jax array, shape (k, d) or (k,), optional
        Defaults to ``a`` (T must then be square).
    precision : str or jax.lax.Precision, optional
        As in :func:`spmm`.

    Returns
    -------
    jax array, shape (T.nnz,)
        In T's stored order (:func:`entries`), the promotion of a's and b's dtypes; what :func:`spmm` takes as
        ``values``.  Its vjp: ``da = A(g) b``, ``db = A(g)ᵀ a``.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, jax.numpy as jnp, tcgnn_py as tg
    >>> from tcgnn_py import jax as tgj
    >>> T = tg.TiledMatrix(sp.csr_array(np.array([[0, 2], [1, 0]], dtype=np.float32)), device="cpu")
    >>> tgj.sddmm(T, jnp.array([[1.0], [2.0]]), jnp.array([[3.0], [4.0]])).tolist()
    [4.0, 6.0]
    """
    key = _matrices.key_of(T)
    n, k = T.shape
    a = _features("Xa", a, "sddmm")
    b = a if b is None else _features("Xb", b, "sddmm")
    a = a[:, None] if a.ndim == 1 else a
    b = b[:, None] if b.ndim == 1 else b
    for name, x in (("Xa", a), ("Xb", b)):
        if x.ndim != 2:
            raise ValueError(f"sddmm: {name} must be 1-D or 2-D, got {x.ndim}-D with shape {x.shape}")
    if a.shape[0] != n or b.shape[0] != k or a.shape[1] != b.shape[1]:
        raise ValueError(f"sddmm: dimension mismatch with signature (n={n},k={k}),(n={a.shape[0]},d={a.shape[1]}),"
                         f"(k={b.shape[0]},d={b.shape[1]})->(n,k)")
    return _sddmm(key, _precision(precision, "sddmm"), a, b)


def spmm(T, x, values=None, *, precision=None):
    """``T @ x`` inside or outside ``jax.jit``, differentiable in ``x`` (and in ``values``).

    Parameters
    ----------
    T : tcgnn_py.TiledMatrix, shape (n, k)
        Static: a jitted function closes over it or takes it as a static argument; ``T.T`` is a matrix too.
    x : jax array, shape (k,) or (k, D)
        float32, float16, bfloat16 (or an integer array, as a float of the product's type).
    values : jax array, shape (T.nnz,), optional
        The entries' values in T's stored order (:func:`entries`; what :func:`sddmm` returns) in place of T's
        own: attention as matrix operations (scores by SDDMM, a softmax over each row's entries in ``jnp``, the
        aggregation here).  Its gradient is an SDDMM.
    precision : str or jax.lax.Precision, optional
        The product's precision, as :func:`tcgnn_py.spmm`'s (``"tf32"``, ``"fp32"``, ``"fp16"``, ``"bf16"``) or
        JAX's (``"highest"`` and ``"float32"`` are ``"fp32"``).  None follows JAX's default matmul precision
        where the call is traced: the library's default (TF32 tensor cores for float32 operands, as XLA's GEMMs
        on the GPU) unless ``jax.default_matmul_precision`` asks for float32.  Its gradient runs at the same
        precision.

    Returns
    -------
    jax array, shape (n,) or (n, D), of the promotion of T's and x's dtypes (as :func:`tcgnn_py.spmm`).

    Notes
    -----
    On the GPU the product runs on XLA's stream over XLA's buffers (no copy) and takes the tensor-core paths of
    :func:`tcgnn_py.spmm`; on the host the reference product.  Its vjp is ``Tᵀ g``.  Under ``jax.vmap`` over x
    the batch is folded into the feature width: one product of ``B * D`` columns.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, jax, jax.numpy as jnp, tcgnn_py as tg
    >>> from tcgnn_py import jax as tgj
    >>> T = tg.TiledMatrix(sp.csr_array(np.array([[0, 2], [1, 0]], dtype=np.float32)), device="cpu")
    >>> jax.jit(lambda x: tgj.spmm(T, x))(jnp.ones((2, 3))).tolist()
    [[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]]
    """
    key = _matrices.key_of(T)
    precision = _precision(precision, "spmm")
    x = jnp.asarray(x)
    n, k = T.shape
    if x.ndim not in (1, 2):
        raise ValueError(f"matmul: X must be 1-D or 2-D, got {x.ndim}-D with shape {x.shape}")
    if x.shape[0] != k:
        sig = "1?)->(n,1?)" if x.ndim == 1 else "m)->(n,m)"
        raise ValueError(f"{MISMATCH} (n,k={k}),(k={x.shape[0]},{sig}")
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)):
        raise TypeError(f"spmm: x must be a float or integer array, got dtype {x.dtype}")
    out = result_dtype(T.dtype, np.dtype(x.dtype))
    if not jnp.issubdtype(x.dtype, jnp.floating):  # (as a float of the product's type, JAX's width)
        out = jax.dtypes.canonicalize_dtype(out if T.dtype != np.float64 else T.dtype)
        x = x.astype(out)
    if jax.dtypes.canonicalize_dtype(out) != out:
        raise TypeError(f"spmm: a {out} product needs jax_enable_x64 (a float64 matrix: "
                        "TiledMatrix(A, dtype=numpy.float32) for float32 products)")
    if values is not None:
        values = jnp.asarray(values)
        if values.shape != (T.nnz,):
            raise ValueError(f"spmm: values must have shape ({T.nnz},) (one per stored entry), got {values.shape}")
        if not jnp.issubdtype(values.dtype, jnp.floating):
            raise TypeError(f"spmm: values must be a float array, got dtype {values.dtype}")
        y = _spmm_values(key, precision, values, x[:, None] if x.ndim == 1 else x)
        return y[:, 0] if x.ndim == 1 else y
    xd = np.dtype(x.dtype)
    if x.ndim == 1:
        return _spmm(key, out, xd, precision, x[:, None])[:, 0]
    return _spmm(key, out, xd, precision, x)
