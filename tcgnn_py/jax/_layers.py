"""Layer 4: GNN layers in JAX whose aggregation is the library's product (:func:`._ops.spmm`)."""

import jax.numpy as jnp

from ._ops import spmm

__all__ = ["gcn_conv"]


def gcn_conv(T, H, W, b=None):
    """A GCN layer (Kipf & Welling 2017) in JAX: ``T @ (H @ W) + b``, or ``(T @ H) @ W + b`` where W widens the
    features (the product then runs on the narrower side).

    ``T`` is the normalised adjacency (:func:`tcgnn_py.nn.gcn_norm`), static as in :func:`spmm`; ``H @ W`` is
    ``jnp`` (XLA's GEMM, fused as XLA likes); ``jax.grad`` differentiates through every part.

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
    out = spmm(T, H @ W) if W.shape[1] <= W.shape[0] else spmm(T, H) @ W
    return out if b is None else out + jnp.asarray(b)
