"""Layer 4: row-partitioned graphs over several GPUs: SpMM, SDDMM and full-batch GNN training with NCCL.

A graph is split by rows over the ranks of a group (balanced by nonzeros);
each rank holds its rows of the matrix (a :class:`~tcgnn_py.TiledMatrix` over
its own and halo columns), of the features and of every activation.  Products
move only halo rows, with NCCL (CuPy's bindings); weight gradients are
all-reduced.

- :func:`spmd` runs a rank function once per GPU in one process (threads), or
  on simulated host ranks (``backend="reference"``, no GPU needed).
- :func:`init` joins a group as one process per GPU (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``);
  ``python -m tcgnn_py.distributed --nproc-per-node N program.py`` starts them.
- :class:`DistributedMatrix`: ``D.matmul(X_rows)`` (``A @ X``),
  ``D.rmatmul_t(G_rows)`` (``Aᵀ @ G``), ``D.sddmm(Xa_rows, Xb_rows)``.
- :func:`train`: :func:`tcgnn_py.nn.gcn_apply` (or ``agnn_apply``) trained on all ranks.

A collective that outlives ``timeout`` (a rank died or stalled) aborts the
group with :class:`DistributedTimeoutError`; under the launcher, a rank that
exits with an error stops the others.
"""

from ._context import DEFAULT_TIMEOUT, Context, DistributedError, DistributedTimeoutError, init, spmd
from ._matrix import HALO_MODES, DistributedMatrix
from ._nn import DistributedEdges, DistTrainResult, allreduce_grads, train

__all__ = [
    "spmd",
    "init",
    "Context",
    "DistributedError",
    "DistributedTimeoutError",
    "DEFAULT_TIMEOUT",
    "DistributedMatrix",
    "HALO_MODES",
    "DistributedEdges",
    "DistTrainResult",
    "allreduce_grads",
    "train",
]
