"""Layer 4: the fused graph attention (:func:`tcgnn_py.nn.graph_attention`) as JAX operations through XLA's FFI.

Two FFI targets: the forward (``V`` and the scores' operands -> ``out`` and one log-sum-exp per row and head)
and the backward (``V``, the cotangent, ``out``, the log-sum-exp and the scores' operands -> their gradients and
the working array of the GPU's passes), tied by a ``custom_vjp`` whose residuals are the forward's outputs, so the
backward recomputes the attention from them as the library's does.  A call's parameters (the matrix, heads,
score, slope, dropout) are static: a program carries their key in :data:`_PARAMS` as its one integer attribute.
On the GPU the targets run the fused kernels (:mod:`tcgnn_py.products.attention`) on XLA's stream, writing
XLA's buffers (a 16-bit backward's float32 gradients are cast into them); on the host they run
:func:`tcgnn_py.nn.graph_attention` (the backward recomputes the forward there: its log-sum-exp output is zeros,
and the working array is left as XLA made it).  Where the fused kernels do not reach (more than 8 heads, wider
heads, other dtypes), :func:`graph_attention` is the unfused sequence of matrix operations.
"""

import functools
import itertools
import threading

import numpy as np

import jax
import jax.numpy as jnp

from .. import nn
from ..products import attention as engine
from ..products import pointwise
from . import _ffi, _matrices
from ._ops import entries, sddmm, spmm, xla_stream

__all__ = ["graph_attention", "ATTENTION_TARGET", "ATTENTION_BWD_TARGET"]

#: The FFI targets of the fused attention's forward and backward.
ATTENTION_TARGET = "tcgnn_py_attention"
ATTENTION_BWD_TARGET = "tcgnn_py_attention_bwd"
SCORES = ("additive", "cosine")

_PARAMS = {}  # key -> (matrix key, heads, score, slope, dropout)
_KEYS = {}
_COUNTER = itertools.count(1)
_LOCK = threading.Lock()


def _params_key(*params):
    """The integer a call carries for its static parameters (the same parameters, the same key)."""
    with _LOCK:
        key = _KEYS.get(params)
        if key is None:
            key = _KEYS[params] = next(_COUNTER)
            _PARAMS[key] = params
        return key


def _arrays(args, view):
    return [view(b) for b in args]


def _score_args(score, ops):
    """``dict(s_src, s_dst)`` or ``dict(Q, K, beta)`` of the scores' operands."""
    if score == "additive":
        return dict(s_src=ops[0], s_dst=ops[1], Q=None, K=None, beta=None)
    return dict(s_src=None, s_dst=None, Q=ops[0], K=ops[1], beta=ops[2])


def _host_attention(T, heads, score, slope, dropout, V, ops, seed):
    return nn.graph_attention(T, V, heads=heads, score=score, negative_slope=slope, dropout=dropout,
                              seed=seed if dropout else None, **_score_args(score, ops))


def _forward_host(stream, args, rets, code):
    mkey, heads, score, slope, dropout = _PARAMS[code]
    V, *ops, seed = _arrays(args, _ffi.host_view)
    out, _ = _host_attention(_matrices.host_matrix(mkey), heads, score, slope, dropout, V, ops, seed)
    out_buf, lse_buf = _arrays(rets, _ffi.host_view)
    out_buf[...] = out
    lse_buf[...] = 0  # (the host's backward recomputes the forward)


def _backward_host(stream, args, rets, code):
    mkey, heads, score, slope, dropout = _PARAMS[code]
    V, g, _, _, *ops, seed = _arrays(args, _ffi.host_view)
    _, vjp = _host_attention(_matrices.host_matrix(mkey), heads, score, slope, dropout, V, ops, seed)
    for buf, grad in zip(_arrays(rets, _ffi.host_view)[:-1], vjp(g)):  # (not the GPU's working array)
        buf[...] = np.reshape(grad, buf.shape)


def _forward_device(stream, args, rets, code):
    mkey, heads, score, slope, dropout = _PARAMS[code]
    T = _matrices.device_matrix(mkey)
    with xla_stream(stream):
        V, *ops, seed = _arrays(args, _ffi.device_view)
        into = _arrays(rets, _ffi.device_view)  # (out of V's dtype, lse float32, as the pass writes them)
        engine.fused(T, V, heads, score, slope=slope, dropout=dropout, seed=seed, into=into, **_score_args(score, ops))


def _backward_device(stream, args, rets, code):
    mkey, heads, score, slope, dropout = _PARAMS[code]
    T = _matrices.device_matrix(mkey)
    with xla_stream(stream):
        V, g, out, lse, *ops, seed = _arrays(args, _ffi.device_view)
        *bufs, work = _arrays(rets, _ffi.device_view)  # (the gradients, then the factors' working array)
        width = heads if score == "additive" else V.shape[1]  # (of ds_src and ds_dst, or dQ and dK)
        into = None
        if all(b.dtype == np.float32 for b in bufs[:3]):  # (the passes write float32: a 16-bit dV is cast after)
            into = (bufs[0], *(b.reshape(b.size // width, width) for b in bufs[1:3]))
        grads = engine.fused_backward(T, V, g, out, lse, heads, score, slope=slope, dropout=dropout, seed=seed,
                                      into=into, work=work, **_score_args(score, ops))
        if score == "cosine":
            grads = (*grads[:3], pointwise.total(grads[3], (1,)))  # the temperature's shares, summed in order
        done = 0 if into is None else 3  # (the passes wrote the first three in place)
        for buf, grad in zip(bufs[done:], grads[done:]):
            buf[...] = grad.reshape(buf.shape)


_IMPLEMENTATIONS = {ATTENTION_TARGET: {"cpu": _forward_host, "CUDA": _forward_device},
                    ATTENTION_BWD_TARGET: {"cpu": _backward_host, "CUDA": _backward_device}}


def _call(target, shapes, key, *operands):
    name = _ffi.register_target(target, _IMPLEMENTATIONS[target])
    call = jax.ffi.ffi_call(name, [jax.ShapeDtypeStruct(s, d) for s, d in shapes],
                            vmap_method="sequential")
    return call(*operands, op=np.int64(key))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(key, V, ops, seed):
    return _forward(key, V, ops, seed)[0]


def _forward(key, V, ops, seed):
    mkey, heads = _PARAMS[key][:2]
    n = _matrices.matrix(mkey).shape[0]
    return _call(ATTENTION_TARGET, [((n, V.shape[1]), V.dtype), ((n, heads), jnp.float32)], key, V, *ops, seed)


def _fused_fwd(key, V, ops, seed):
    out, lse = _forward(key, V, ops, seed)
    return out, (V, ops, seed, out, lse)


def _fused_bwd(key, res, g):
    V, ops, seed, out, lse = res
    mkey, heads = _PARAMS[key][:2]
    # the gradients, then the backward's working array (two factors per entry and head), which XLA allocates
    # with the program's other temporaries rather than the handler beside them
    work = ((_matrices.matrix(mkey).nnz * heads, 2), jnp.float32)
    shapes = [(V.shape, V.dtype)] + [(x.shape, x.dtype) for x in ops] + [work]
    *grads, _ = _call(ATTENTION_BWD_TARGET, shapes, key, V, g.astype(V.dtype), out, lse, *ops, seed)
    return grads[0], tuple(grads[1:]), np.zeros(seed.shape, jax.dtypes.float0)


_fused.defvjp(_fused_fwd, _fused_bwd)


def edge_softmax(T, z):
    """``P_e ∝ a_e exp(z_e)`` over each row's entries (``z`` ``(nnz,)`` or ``(nnz, heads)``, T's stored order),
    stable (each row's maximum subtracted); an entry of weight 0 takes no part."""
    rows, _ = entries(T)
    n = T.shape[0]
    # (the registry's host copy, which entries() made: a GPU matrix's values are not read back at each trace)
    w = jnp.asarray(np.asarray(_matrices.host_matrix(_matrices.key_of(T)).values, np.float32))
    w = w if z.ndim == 1 else w[:, None]
    z = jnp.where(w != 0, z, -jnp.inf)
    top = jax.ops.segment_max(z, rows, num_segments=n)
    ex = jnp.where(w != 0, w * jnp.exp(z - top[rows]), 0)
    total = jax.ops.segment_sum(ex, rows, num_segments=n)
    return ex / jnp.where(total > 0, total, 1)[rows]


def _unfused(T, V, heads, score, ops, slope, dropout, key):
    """The sequence the fused kernels replace, as matrix operations (the library's SDDMM and products with the
    attention as the entries' values, a softmax over each row's entries in ``jnp``)."""
    rows, cols = entries(T)
    if score == "additive":
        s_src, s_dst = ops
        z = jax.nn.leaky_relu(s_dst[rows] + s_src[cols], slope)
    else:
        Q, K, beta = ops
        z = (jnp.reshape(beta, ()) * sddmm(T, Q, K))[:, None]
    P = edge_softmax(T, z)
    if dropout:
        P = jnp.where(jax.random.bernoulli(key, 1 - dropout, P.shape), P / (1 - dropout), 0)
    P = P.astype(V.dtype)
    D = V.shape[1] // heads
    return jnp.concatenate([spmm(T, V[:, h * D:(h + 1) * D], values=P[:, h]) for h in range(heads)], axis=1)


def graph_attention(T, V, *, heads=1, score="additive", s_src=None, s_dst=None, Q=None, K=None, beta=None,
                    negative_slope=0.2, dropout=0.0, key=None):
    """:func:`tcgnn_py.nn.graph_attention` as a JAX operation: ``out_i = sum_j softmax_j(score(i, j)) V_j`` over
    row i's stored entries (weighted by T's values, which must be >= 0), per head; differentiable in V and the
    scores' operands.

    On the GPU where the fused kernels reach (float32, float16 and bfloat16 V, at most 8 heads of at most 256
    features, Q and K of V's dtype and width), the fused forward and backward: the scores never reach global
    memory, and the backward recomputes the attention from each row's log-sum-exp.  Elsewhere (and on JAX's
    CPU backend for the unreached) the same attention as matrix operations.  ``dropout`` drops attention entries
    (drawn from ``key``: a hash of each entry, head and a seed from the key on the fused path, JAX's bernoulli
    on the other).  ``T`` is static, as in :func:`spmm`.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, jax.numpy as jnp, tcgnn_py as tg
    >>> from tcgnn_py import jax as tgj
    >>> T = tg.TiledMatrix(sp.csr_array(np.ones((2, 2), np.float32)), device="cpu")
    >>> s = jnp.array([[0.0], [np.log(3.0)]])  # the second node draws 3x the attention
    >>> tgj.graph_attention(T, jnp.eye(2), s_src=s, s_dst=jnp.zeros((2, 1))).round(4).tolist()
    [[0.25, 0.75], [0.25, 0.75]]
    """
    mkey = _matrices.key_of(T)
    n, k = T.shape
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"heads must be a positive int, got {heads!r}")
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r:.60}")
    V = jnp.asarray(V)
    if not jnp.issubdtype(V.dtype, jnp.floating):
        V = V.astype(jax.dtypes.canonicalize_dtype(np.float64))
    if V.ndim != 2 or V.shape[0] != k or V.shape[1] % heads:
        raise ValueError(f"graph_attention: V must have shape ({k}, heads * D) with heads={heads}, got {V.shape}")
    fd = jnp.float32 if V.dtype in (jnp.float16, jnp.bfloat16) else V.dtype
    if score == "additive":
        if s_src is None or s_dst is None or Q is not None or K is not None or beta is not None:
            raise TypeError("score='additive' takes s_src and s_dst (and no Q, K, beta)")
        ops = (jnp.asarray(s_src, fd), jnp.asarray(s_dst, fd))
        for name, x, rows in (("s_src", ops[0], k), ("s_dst", ops[1], n)):
            if x.shape != (rows, heads):
                raise ValueError(f"{name} must have shape {(rows, heads)}, got {x.shape}")
    else:
        if Q is None or K is None or beta is None or s_src is not None or s_dst is not None:
            raise TypeError("score='cosine' takes Q, K and beta (and no s_src, s_dst)")
        if heads != 1:
            raise ValueError(f"score='cosine' has one head, got heads={heads}")
        ops = (jnp.asarray(Q), jnp.asarray(K), jnp.reshape(jnp.asarray(beta, fd), (1,)))
        if ops[0].ndim != 2 or ops[1].ndim != 2 or ops[0].shape[0] != n or ops[1].shape[0] != k \
                or ops[0].shape[1] != ops[1].shape[1]:
            raise ValueError(f"Q and K must have shapes ({n}, d) and ({k}, d), got {ops[0].shape} and {ops[1].shape}")
    if not 0 <= dropout < 1:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
    if T.nnz and bool((T.values < 0).any()):  # synchronize! (when traced: T is static)
        raise ValueError("graph_attention: T holds negative values; its values are the softmax's weights "
                         "(a_ij exp(z_ij)), which must be >= 0 (use A.astype(bool) for an unweighted graph)")
    if dropout and key is None:
        raise ValueError("attention dropout needs key (a jax.random key)")
    fused = jax.default_backend() == "cpu" or engine.reach(V, heads, score, ops[0] if score == "cosine" else None) \
        is None
    if not fused:
        return _unfused(T, V, heads, score, ops, float(negative_slope), float(dropout), key)
    seed = jax.random.bits(key, (1,), jnp.uint32) if dropout else jnp.zeros((1,), jnp.uint32)
    params = _params_key(mkey, heads, score, float(negative_slope), float(dropout))
    return _fused(params, V, ops, seed)
