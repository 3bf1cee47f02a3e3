"""Layer 4: tcgnn_py inside ``jax.jit`` and ``jax.grad`` -- the products as JAX operations through XLA's FFI.

Optional (``pip install 'tcgnn_py[jax]'``): ``import tcgnn_py`` never imports JAX; this package does.  A
:class:`~tcgnn_py.TiledMatrix` is static in a jitted function (close over it, or pass it as a static argument):
the program refers to it by a key in :mod:`._matrices`, which keeps it alive until :func:`release`.

* :func:`spmm` -- ``T @ x``, differentiable in ``x`` (its vjp ``Tᵀ g``), or with the entries' values given
  (differentiable in them too);
* :func:`sddmm` -- ``<a_i, b_j>`` for every stored ``(i, j)``, in T's stored order (:func:`entries`);
* :func:`graph_attention` -- the fused graph attention of :func:`tcgnn_py.nn.graph_attention` (additive or
  cosine scores, forward and backward kernels) where it reaches, else the same as matrix operations;
* :func:`dropout` -- the library's dropout mask (a hash of each element's index and a seed from a JAX key);
  :func:`linear` -- ``dropout(H) @ W (+ b)``, on the GPU the library's product that reads ``H`` dropped;
* :func:`gcn_conv` -- a GCN layer whose dense parts are ``jnp`` (XLA's own GEMMs) and whose aggregation is
  :func:`spmm`; :func:`agnn_conv` and :func:`gat_conv` -- the attention layers, their scores' operands in
  ``jnp`` and the attention by :func:`graph_attention`.

On the GPU an operation runs the library's kernels on XLA's stream over XLA's buffers; on JAX's CPU backend the
reference path (the same functions, so CI tests them whole).  JAX preallocates most of the GPU at start: set
``XLA_PYTHON_CLIENT_PREALLOCATE=false`` (or a smaller ``XLA_PYTHON_CLIENT_MEM_FRACTION``) so that the library's
CuPy pool has room for its plans.  XLA may record the products into its command buffers (CUDA graphs):
:func:`recorded_nbytes` is what recorded calls hold.
"""

from ._attention import ATTENTION_BWD_TARGET, ATTENTION_TARGET, graph_attention
from ._dense import DROP_ATB_TARGET, DROP_MM_TARGET, dropout, linear
from ._ffi import recorded_nbytes
from ._layers import agnn_conv, gat_conv, gcn_conv
from ._matrices import registered, release
from ._ops import SDDMM_TARGET, SPMM_TARGET, entries, sddmm, spmm

__all__ = ["spmm", "sddmm", "entries", "graph_attention", "dropout", "linear", "gcn_conv", "agnn_conv", "gat_conv",
           "release", "registered", "recorded_nbytes", "SPMM_TARGET", "SDDMM_TARGET", "ATTENTION_TARGET",
           "ATTENTION_BWD_TARGET", "DROP_MM_TARGET", "DROP_ATB_TARGET"]
