"""Layer 4: GNN layers in JAX whose sparse products are the library's (:mod:`._ops`), their dense parts ``jnp``.

The attention layers compute their scores' operands in ``jnp`` and attend by :func:`._attention.graph_attention`
(the fused kernels where they reach, else matrix operations) -- the semantics of :func:`tcgnn_py.nn.agnn_conv` and
:func:`tcgnn_py.nn.gat_conv` (A's values weight the softmax: ``P_ij ∝ a_ij exp(z_ij)``).  Their products run at
JAX's default matmul precision where they are traced (:func:`._ops.spmm`), as their ``jnp`` GEMMs do.
"""

import jax.numpy as jnp

from ._attention import graph_attention
from ._dense import dropout as dropped, linear
from ._ops import spmm

__all__ = ["gcn_conv", "agnn_conv", "gat_conv"]

#: The norm below which a row of AGNN's features counts as zero (as tcgnn_py.nn's).
NORM_EPS = 1e-12


def gcn_conv(T, H, W, b=None, *, dropout=0.0, key=None):
    """A GCN layer (Kipf & Welling 2017) in JAX: ``T @ (H @ W) + b``, or ``(T @ H) @ W + b`` where W widens the
    features (the product then runs on the narrower side).

    ``T`` is the normalised adjacency (:func:`tcgnn_py.nn.gcn_norm`), static as in :func:`spmm`; ``H @ W`` is
    ``jnp`` (XLA's GEMM, fused as XLA likes); ``jax.grad`` differentiates through every part.  ``dropout``: the
    layer's input dropped first at that rate (drawn from ``key``), as :func:`tcgnn_py.nn.gcn_conv`'s
    ``dropout_p``: by :func:`linear`, which on the GPU reads a wide float32 ``H`` dropped in the product.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, jax.numpy as jnp, tcgnn_py as tg
    >>> from tcgnn_py import jax as tgj
    >>> T = tg.TiledMatrix(sp.csr_array(np.eye(2, dtype=np.float32)), device="cpu")
    >>> tgj.gcn_conv(T, jnp.ones((2, 3)), jnp.ones((3, 1))).tolist()
    [[3.0], [3.0]]
    """
    H, W = jnp.asarray(H), jnp.asarray(W)
    if H.ndim != 2 or W.ndim != 2 or H.shape[1] != W.shape[0]:
        raise ValueError(f"gcn_conv: H {H.shape} and W {W.shape} do not multiply (H must be (n, f), W (f, d))")
    if W.shape[1] <= W.shape[0]:
        out = spmm(T, linear(H, W, dropout=dropout, key=key))
    else:
        out = spmm(T, dropped(H, dropout, key)) @ W
    return out if b is None else out + jnp.asarray(b)


def agnn_conv(T, H, beta):
    """Attention-based propagation (AGNN) in JAX, as :func:`tcgnn_py.nn.agnn_conv`.

    ``out_i = sum_j P_ij h_j``, ``P_ij ∝ a_ij exp(beta cos(h_i, h_j))`` over row i's stored entries, by
    :func:`graph_attention` (cosine scores).  ``T`` square, static; ``beta`` a
    scalar (learnable: differentiable, as H is).

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, jax.numpy as jnp, tcgnn_py as tg
    >>> from tcgnn_py import jax as tgj
    >>> T = tg.nn.add_self_loops(sp.csr_array(np.array([[0, 1], [1, 0]])), device="cpu")
    >>> tgj.agnn_conv(T, jnp.eye(2), 0.0).tolist()
    [[0.5, 0.5], [0.5, 0.5]]
    """
    H = jnp.asarray(H)
    if T.shape[0] != T.shape[1]:
        raise ValueError(f"agnn_conv needs a square graph, got shape {T.shape}")
    if H.ndim != 2 or H.shape[0] != T.shape[0]:
        raise ValueError(f"agnn_conv: H must have shape ({T.shape[0]}, d), got {H.shape}")
    # The norms in float32 (a float16 eps is 0), of the squares clamped before the root: the root's gradient at a
    # zero row is infinite, and JAX multiplies it by the clamp's zero (NaN); the clamped square's gradient is 0.
    squares = jnp.sum(jnp.square(H.astype(jnp.float32)), axis=1, keepdims=True)
    Hn = (H / jnp.sqrt(jnp.maximum(squares, NORM_EPS * NORM_EPS))).astype(H.dtype)
    return graph_attention(T, H, score="cosine", Q=Hn, K=Hn, beta=jnp.reshape(jnp.asarray(beta, H.dtype), (1,)))


def gat_conv(T, H, W, a_src, a_dst, b=None, *, heads=1, concat=True, negative_slope=0.2, dropout=0.0, key=None):
    """Graph attention (GAT) in JAX, as :func:`tcgnn_py.nn.gat_conv`.

    ``X = H @ W`` split into ``heads`` heads of D features; per head
    ``out_i = sum_j softmax_j(LeakyReLU(a_dst·X_i + a_src·X_j)) X_j`` over row i's
    stored entries (weighted by A's values); heads concatenated or averaged; ``+ b``.  ``dropout`` on the
    attention, drawn from the JAX PRNG ``key`` (needed where ``dropout > 0``).  The attention is
    :func:`graph_attention` (additive scores).

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, jax.numpy as jnp, tcgnn_py as tg
    >>> from tcgnn_py import jax as tgj
    >>> T = tg.nn.add_self_loops(sp.csr_array(np.array([[0, 1], [1, 0]])), device="cpu")
    >>> z = jnp.zeros((1, 2))
    >>> tgj.gat_conv(T, jnp.eye(2), jnp.eye(2), z, z).tolist()
    [[0.5, 0.5], [0.5, 0.5]]
    """
    H, W = jnp.asarray(H), jnp.asarray(W)
    n = T.shape[0]
    if T.shape[0] != T.shape[1]:
        raise ValueError(f"gat_conv needs a square graph (X = H W is both sides), got shape {T.shape}")
    if H.ndim != 2 or W.ndim != 2 or H.shape[0] != n or H.shape[1] != W.shape[0]:
        raise ValueError(f"gat_conv: H {H.shape} and W {W.shape} do not multiply (H must be ({n}, f), W (f, d))")
    if type(heads) is not int or heads < 1 or W.shape[1] % heads:
        raise ValueError(f"W's {W.shape[1]} columns are not {heads} heads of equal width")
    D = W.shape[1] // heads
    a_src, a_dst = jnp.asarray(a_src), jnp.asarray(a_dst)
    for name, a in (("a_src", a_src), ("a_dst", a_dst)):
        if a.shape != (heads, D):
            raise ValueError(f"{name} must have shape {(heads, D)}, got {a.shape}")
    if dropout and key is None:
        raise ValueError("attention dropout needs key (a jax.random key)")
    X = H @ W
    X3 = X.reshape(n, heads, D)
    s_src, s_dst = (X3 * a_src).sum(axis=2), (X3 * a_dst).sum(axis=2)  # (n, heads)
    out = graph_attention(T, X, heads=heads, s_src=s_src, s_dst=s_dst, negative_slope=negative_slope,
                          dropout=dropout, key=key)
    if not concat and heads > 1:
        out = out.reshape(n, heads, D).mean(axis=1)
    return out if b is None else out + jnp.asarray(b)
