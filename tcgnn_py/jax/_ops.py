"""Layer 4: the sparse products as JAX operations -- public function, FFI call, implementation per platform.

As ``jax.experimental.sparse``: :func:`spmm` checks its operands at trace time (the wording of
:func:`tcgnn_py.spmm`) and calls :func:`_spmm` (a ``custom_vjp`` over the raw FFI call); the FFI target has an
implementation per platform, registered by table (:data:`_IMPLEMENTATIONS`): on the GPU the library's product on
XLA's stream over views of XLA's buffers (no copy, no host read once the product's signature is planned), on the
host the reference product (what CI runs).  The matrix is static: a program carries its registry key
(:mod:`._matrices`) as an attribute.
"""

import functools

import numpy as np

import jax
import jax.numpy as jnp

from .._cache import keep
from .._tiled import spmm as tiled_spmm
from ..products import MISMATCH, result_dtype, sddmm_raw, spmm_raw
from . import _ffi, _matrices

__all__ = ["spmm", "sddmm", "entries", "SPMM_TARGET", "SDDMM_TARGET"]

#: The FFI target of the product ``T @ x`` (or ``T @ x`` with the entries' values given).
SPMM_TARGET = "tcgnn_py_spmm"
#: The FFI target of SDDMM: ``<a_i, b_j>`` for every stored ``(i, j)``, in the matrix's stored order.
SDDMM_TARGET = "tcgnn_py_sddmm"
#: CuPy views of XLA's streams kept (by address), oldest dropped: a process runs on a stream or a few.
STREAMS_KEEP = 16

_STREAMS = {}


def _spmm_host(stream, args, rets, attrs):
    """The host implementation: the reference product of the matrix's host copy into XLA's result buffer (with
    two operands, ``values`` in the matrix's stored order and x)."""
    T, (y,) = _matrices.host_matrix(attrs["matrix"]), rets
    if len(args) == 1:
        tiled_spmm(T, args[0].numpy(), out=y.numpy())
    else:
        spmm_raw(T.tiling, args[0].numpy(), args[1].numpy(), y.dtype, out=y.numpy())


def _sddmm_host(stream, args, rets, attrs):
    T, (a, b), (y,) = _matrices.host_matrix(attrs["matrix"]), args, rets
    y.numpy()[...] = sddmm_raw(T.tiling, T.values, a.numpy(), b.numpy(), y.dtype)


def _spmm_device(stream, args, rets, attrs):
    """The GPU implementation: the library's product on XLA's stream, its operand and result XLA's buffers."""
    T = _matrices.device_matrix(attrs["matrix"])
    with _stream(stream):
        if len(args) == 1:
            tiled_spmm(T, args[0].cupy(), out=rets[0].cupy())
        else:
            spmm_raw(T.tiling, args[0].cupy(), args[1].cupy(), rets[0].dtype, out=rets[0].cupy())


def _sddmm_device(stream, args, rets, attrs):
    """The GPU implementation of SDDMM: the library's kernels on XLA's stream, into XLA's result buffer."""
    T = _matrices.device_matrix(attrs["matrix"])
    with _stream(stream):
        sddmm_raw(T.tiling, T.values, args[0].cupy(), args[1].cupy(), rets[0].dtype, out=rets[0].cupy())


def _stream(ptr):
    """A CuPy view of XLA's stream (kept per address)."""
    s = _STREAMS.get(ptr)
    if s is None:
        import cupy as cp

        s = keep(_STREAMS, ptr, cp.cuda.ExternalStream(ptr), STREAMS_KEEP)
    return s


#: The implementation of each target per platform, registered when the first call is traced.
_IMPLEMENTATIONS = {SPMM_TARGET: {"cpu": _spmm_host, "CUDA": _spmm_device},
                    SDDMM_TARGET: {"cpu": _sddmm_host, "CUDA": _sddmm_device}}


@functools.cache
def _registered(target):
    for platform, run in _IMPLEMENTATIONS[target].items():
        try:
            _ffi.register(target, platform, run)
        except Exception as exc:  # (a JAX without that platform's plugin: its calls never lower there)
            if platform == "cpu":
                raise
            del exc
    return target


def _call(target, key, shape, dtype, *operands):
    call = jax.ffi.ffi_call(_registered(target), jax.ShapeDtypeStruct(shape, dtype), vmap_method="sequential")
    return call(*operands, matrix=np.int64(key))


def _raw(key, x, dtype):
    """The FFI call ``T @ x`` for T of ``key`` and a 2-D x, the result of ``dtype``."""
    return _call(SPMM_TARGET, key, (_matrices.matrix(key).shape[0], x.shape[1]), dtype, x)


@functools.cache
def _product(key, dtype):
    """``f(x) = T @ x`` for T of ``key``, a result of ``dtype``: the FFI call, batched under ``jax.vmap`` by
    folding the batch into the feature width (one product of ``B * D`` columns, the kernels' best case, instead of
    B products)."""

    @jax.custom_batching.custom_vmap
    def f(x):
        return _raw(key, x, dtype)

    @f.def_vmap
    def rule(axis_size, in_batched, x):
        if not in_batched[0]:
            return f(x), False
        k, D = x.shape[1:]
        y = f(jnp.moveaxis(x, 0, 1).reshape(k, axis_size * D))
        return jnp.moveaxis(y.reshape(y.shape[0], axis_size, D), 1, 0), True

    return f


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _spmm(key, dtype, x_dtype, x):
    return _product(key, dtype)(x)


def _spmm_fwd(key, dtype, x_dtype, x):
    return _product(key, dtype)(x), None


def _spmm_bwd(key, dtype, x_dtype, _, g):
    """``dx = Tᵀ g``: the transposed matrix's product (its translation cached on T), cast to x's dtype."""
    T = _matrices.matrix(key)
    return (_product(_matrices.key_of(T.T), result_dtype(T.dtype, np.dtype(g.dtype)))(g).astype(x_dtype),)


_spmm.defvjp(_spmm_fwd, _spmm_bwd)


def _dtype(*dtypes):
    """The product's dtype for operands of these dtypes (:func:`tcgnn_py.products.result_dtype`), at JAX's width."""
    out = np.dtype(dtypes[0])
    for d in dtypes[1:]:
        out = result_dtype(out, np.dtype(d))
    return np.dtype(jax.dtypes.canonicalize_dtype(out))


def _with_values(key, values, x):
    """``A(values) @ x``: the matrix of ``key`` with its entries' values given (stored order)."""
    return _call(SPMM_TARGET, key, (_matrices.matrix(key).shape[0], x.shape[1]), _dtype(values.dtype, x.dtype),
                values, x)


def _sampled(key, a, b):
    """``<a_i, b_j>`` for every stored ``(i, j)`` of the matrix of ``key``, in its stored order."""
    return _call(SDDMM_TARGET, key, (_matrices.matrix(key).nnz,), _dtype(a.dtype, b.dtype), a, b)


def _transposed(key, values):
    """``(key of Aᵀ, Aᵀ's values)``: the transpose's registry key and ``values`` in its stored order."""
    return _matrices.key_of(_matrices.matrix(key).T), values[_matrices.entries(key)[2]]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _spmm_values(key, values, x):
    return _with_values(key, values, x)


def _spmm_values_fwd(key, values, x):
    return _with_values(key, values, x), (values, x)


def _spmm_values_bwd(key, res, g):
    """``d values = <g_i, x_j>`` per entry (an SDDMM), ``dx = A(values)ᵀ g`` (the transpose's product)."""
    values, x = res
    kt, vt = _transposed(key, values)
    return _sampled(key, g, x).astype(values.dtype), _with_values(kt, vt, g).astype(x.dtype)


_spmm_values.defvjp(_spmm_values_fwd, _spmm_values_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _sddmm(key, a, b):
    return _sampled(key, a, b)


def _sddmm_fwd(key, a, b):
    return _sampled(key, a, b), (a, b)


def _sddmm_bwd(key, res, g):
    """``da = A(g) b``, ``db = A(g)ᵀ a``: products with the cotangent as the entries' values."""
    a, b = res
    kt, gt = _transposed(key, g)
    return _with_values(key, g, b).astype(a.dtype), _with_values(kt, gt, a).astype(b.dtype)


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


def sddmm(T, a, b=None):
    """``e_ij = <a_i, b_j>`` for every stored ``(i, j)`` of T, inside or outside ``jax.jit``, differentiable in
    ``a`` and ``b``: T's sparsity pattern samples the dense product (T's values are not multiplied in).

    Parameters
    ----------
    T : tcgnn_py.TiledMatrix, shape (n, k)
        Static, as in :func:`spmm`.
    a : jax array, shape (n, d) or (n,)
    b : jax array, shape (k, d) or (k,), optional
        Defaults to ``a`` (T must then be square).

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
    return _sddmm(key, a, b)


def spmm(T, x, values=None):
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
        y = _spmm_values(key, values, x[:, None] if x.ndim == 1 else x)
        return y[:, 0] if x.ndim == 1 else y
    xd = np.dtype(x.dtype)
    if x.ndim == 1:
        return _spmm(key, out, xd, x[:, None])[:, 0]
    return _spmm(key, out, xd, x)
