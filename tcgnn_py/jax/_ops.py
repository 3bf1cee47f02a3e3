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
from ..products import MISMATCH, result_dtype
from . import _ffi, _matrices

__all__ = ["spmm", "SPMM_TARGET"]

#: The FFI target of the product ``T @ x``.
SPMM_TARGET = "tcgnn_py_spmm"
#: CuPy views of XLA's streams kept (by address), oldest dropped: a process runs on a stream or a few.
STREAMS_KEEP = 16

_STREAMS = {}


def _spmm_host(stream, args, rets, attrs):
    """The host implementation: the reference product of the matrix's host copy into XLA's result buffer."""
    (x,), (y,) = args, rets
    tiled_spmm(_matrices.host_matrix(attrs["matrix"]), x.numpy(), out=y.numpy())


def _spmm_device(stream, args, rets, attrs):
    """The GPU implementation: the library's product on XLA's stream, its operand and result XLA's buffers."""
    import cupy as cp

    T = _matrices.device_matrix(attrs["matrix"])
    s = _STREAMS.get(stream)
    if s is None:
        s = keep(_STREAMS, stream, cp.cuda.ExternalStream(stream), STREAMS_KEEP)
    with s:
        tiled_spmm(T, args[0].cupy(), out=rets[0].cupy())


#: The implementation of each target per platform, registered when the first call is traced.
_IMPLEMENTATIONS = {SPMM_TARGET: {"cpu": _spmm_host, "CUDA": _spmm_device}}


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


def _raw(key, x, dtype):
    """The FFI call ``T @ x`` for T of ``key`` and a 2-D x, the result of ``dtype``."""
    n = _matrices.matrix(key).shape[0]
    call = jax.ffi.ffi_call(_registered(SPMM_TARGET), jax.ShapeDtypeStruct((n, x.shape[1]), dtype),
                            vmap_method="sequential")
    return call(x, matrix=np.int64(key))


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


def spmm(T, x):
    """``T @ x`` inside or outside ``jax.jit``, differentiable in ``x``.

    Parameters
    ----------
    T : tcgnn_py.TiledMatrix, shape (n, k)
        Static: a jitted function closes over it or takes it as a static argument; ``T.T`` is a matrix too.
    x : jax array, shape (k,) or (k, D)
        float32, float16, bfloat16 (or an integer array, as a float of the product's type).

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
    xd = np.dtype(x.dtype)
    if x.ndim == 1:
        return _spmm(key, out, xd, x[:, None])[:, 0]
    return _spmm(key, out, xd, x)
