"""Layer 4: the library's dropout, and a dense layer that reads its input dropped, as JAX operations.

The mask is the library's feature dropout (:func:`tcgnn_py.nn.dropout` on the GPU): element ``i`` of a 2-D array
is kept where a hash of ``i`` and a seed passes the rate, so nothing random is drawn per element and a backward
pass recomputes the mask from the seed.  :func:`dropout` computes it in ``jnp`` (one elementwise fusion; JAX's
``bernoulli`` draws a random array first).  :func:`linear` of a wide float32 input on the GPU runs the library's
dropped product (:func:`tcgnn_py.products.dense.drop_mm`, through XLA's FFI on XLA's stream and buffers): the
mask applied as the input is read, so the dropped input is never written; its weight gradient likewise
(:func:`~tcgnn_py.products.dense.drop_atb`), and the input's gradient by the mask in ``jnp`` (which XLA drops
where nothing needs it, as for features).  Elsewhere the same layer in ``jnp``, with the same mask.
"""

import functools

import numpy as np

import jax
import jax.numpy as jnp

from .._reference import hash_keeps
from ..products import dense
from . import _ffi
from ._ops import xla_stream

__all__ = ["dropout", "linear", "DROP_MM_TARGET", "DROP_ATB_TARGET"]

#: The FFI targets of ``dropout(a) @ b`` and of its weight gradient ``dropout(a)ᵀ g``.
DROP_MM_TARGET = "tcgnn_py_drop_mm"
DROP_ATB_TARGET = "tcgnn_py_drop_atb"


def _rate(rate, what):
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.floating)) or not 0 <= rate < 1:
        raise ValueError(f"{what}: rate must be a float in [0, 1), got {rate!r:.60}")
    return float(rate)


def _seed(key):
    """The library's dropout seed from a JAX key: two 32-bit words (the kernels mix their xor)."""
    if key is None:
        raise ValueError("dropout needs key (a jax.random key)")
    return jax.random.bits(key, (2,), jnp.uint32)


def _keep(shape, seed, p):
    """Whether each element of an array of ``shape`` is kept: the kernels' ``nn_keep`` of its row-major index
    (fewer than 2**32 elements, whose index's high word is 0) and ``seed``."""
    x = jax.lax.iota(jnp.uint32, int(np.prod(shape, dtype=np.int64))).reshape(shape)
    return hash_keeps(x ^ ((seed[0] ^ seed[1]) * jnp.uint32(0x9E3779B9)), p)


def _dropped(x, seed, p):
    """``x`` masked by the seed's mask, the kept values scaled by ``1 / (1 - p)`` (in float32 for 16-bit x)."""
    fd = np.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else x.dtype.type
    return jnp.where(_keep(x.shape, seed, p), x.astype(fd) * fd(1 / (1 - p)), 0).astype(x.dtype)


def _check_size(x, what):
    if x.size >= 2 ** 32:
        raise ValueError(f"{what}: the dropout's mask indexes fewer than 2**32 elements, got {x.size}")


def dropout(x, rate, key):
    """Inverted dropout by the library's mask: each element zeroed with probability ``rate``, the rest scaled by
    ``1 / (1 - rate)``; the mask a hash of the element's index and a seed drawn from ``key`` (the same mask as
    :func:`linear` with the same ``rate`` and ``key``, and as the library's kernels with that seed), so no random
    array is drawn.  Differentiable (the same mask on the gradient).

    Examples
    --------
    >>> import jax, jax.numpy as jnp
    >>> from tcgnn_py import jax as tgj
    >>> y = tgj.dropout(jnp.ones((100, 100)), 0.5, jax.random.key(0))
    >>> sorted(set(y.ravel().tolist())), bool(abs(y.mean() - 1) < 0.05)
    ([0.0, 2.0], True)
    """
    p = _rate(rate, "dropout")
    x = jnp.asarray(x)
    if not p:
        return x
    _check_size(x, "dropout")
    return _dropped(x, _seed(key), p)


def _on_device(product):
    """The FFI implementation of ``product(a, b, seed, p, out=)`` (:func:`tcgnn_py.products.dense.drop_mm` or
    ``drop_atb``) on XLA's stream and buffers, the rate ``p`` the bits of the call's int64 attribute."""
    def run(stream, args, rets, code):
        p = float(np.int64(code).view(np.float64))
        with xla_stream(stream):
            a, b, seed = (_ffi.device_view(x) for x in args)
            product(a, b, seed, p, out=_ffi.device_view(rets[0]))

    return run


_IMPLEMENTATIONS = {DROP_MM_TARGET: {"CUDA": _on_device(dense.drop_mm)},
                    DROP_ATB_TARGET: {"CUDA": _on_device(dense.drop_atb)}}


def _call(target, shape, p, *operands):
    name = _ffi.register_target(target, _IMPLEMENTATIONS[target])
    call = jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(shape, jnp.float32), vmap_method="sequential")
    return call(*operands, op=np.float64(p).view(np.int64))  # (the rate's bits: the call's one int64 attribute)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _drop_mm(p, a, b, seed):
    return _call(DROP_MM_TARGET, (a.shape[0], b.shape[1]), p, a, b, seed)


def _drop_mm_fwd(p, a, b, seed):
    return _drop_mm(p, a, b, seed), (a, b, seed)


def _drop_mm_bwd(p, res, g):
    a, b, seed = res
    g = g.astype(jnp.float32)
    da = _dropped(jnp.matmul(g, b.T, precision="highest"), seed, p)  # (dropped by XLA where a is not differentiated)
    return da, _call(DROP_ATB_TARGET, b.shape, p, a, g, seed), np.zeros(seed.shape, jax.dtypes.float0)


_drop_mm.defvjp(_drop_mm_fwd, _drop_mm_bwd)


def _reaches(a, b):
    """Whether :func:`linear` runs the library's dropped product: JAX's GPU backend and operands
    :func:`tcgnn_py.products.dense.drop_takes` takes (XLA's buffers are C-contiguous)."""
    return (jax.default_backend() == "gpu" and a.dtype == b.dtype == jnp.float32 and a.shape[0] > 0
            and a.shape[1] > dense.DENSE_MAX_K and 0 < b.shape[1] <= dense.DROP_MAX_N)


def linear(H, W, b=None, *, dropout=0.0, key=None, precision=None):
    """``dropout(H) @ W (+ b)``, the dropout by :func:`dropout`'s mask (``rate`` ``dropout``, drawn from ``key``);
    differentiable in ``H``, ``W`` and ``b``.

    On the GPU, for a float32 ``H`` wider than the dense kernels' narrow case and a ``W`` of at most
    :data:`tcgnn_py.products.dense.DROP_MAX_N` columns (a layer's input features to its hidden width), the
    library's dropped product, which applies the mask as it reads ``H`` (in 3xTF32, about float32's precision):
    the dropped ``H`` is never written, and the weight's gradient recomputes the mask.  Elsewhere the dropout in
    ``jnp`` and XLA's GEMM at ``precision`` (as :func:`jax.numpy.matmul`'s).

    Examples
    --------
    >>> import jax, jax.numpy as jnp
    >>> from tcgnn_py import jax as tgj
    >>> tgj.linear(jnp.ones((2, 3)), jnp.ones((3, 1)), jnp.array([1.0])).ravel().tolist()
    [4.0, 4.0]
    """
    p = _rate(dropout, "linear: dropout")
    H, W = jnp.asarray(H), jnp.asarray(W)
    if H.ndim != 2 or W.ndim != 2 or H.shape[1] != W.shape[0]:
        raise ValueError(f"linear: H (n, k) and W (k, m) must be 2-D and agree, got {H.shape} and {W.shape}")
    if b is not None and jnp.shape(b) != (W.shape[1],):
        raise ValueError(f"linear: b must have shape ({W.shape[1]},), got {jnp.shape(b)}")
    if p:
        _check_size(H, "linear")
        seed = _seed(key)
        out = _drop_mm(p, H, W, seed) if _reaches(H, W) else jnp.matmul(_dropped(H, seed, p), W, precision=precision)
    else:
        out = jnp.matmul(H, W, precision=precision)
    return out if b is None else out + b
