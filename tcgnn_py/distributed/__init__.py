"""Layer 4: graphs over several GPUs: partitioned for locality, SpMM, SDDMM and full-batch GNN training with NCCL.

A graph is renumbered for locality (:func:`partition`: METIS, or label propagation on the GPU for very large
graphs) and split by rows over the ranks of a group; each rank holds its rows of the matrix (an own part and a
halo part, :class:`DistributedMatrix`), of the features and of every activation.  Products move only halo rows,
with NCCL (CuPy's bindings), overlapped with the own part's product and optionally in 16 bits; weight gradients
are all-reduced.

- :func:`init` joins a group as one process per GPU launched by MPI (``mpirun -n 4 python prog.py``,
  ``mpiexec``, ``srun``), or from another launcher (``rank=``, ``world_size=``, ``nccl_id=``, ``device=``).
- :func:`spmd` runs a rank function once per GPU in one process (threads), or on simulated host ranks
  (``backend="reference"``, no GPU needed).
- :class:`DistributedMatrix`: ``D.matmul(X_rows)`` (``A @ X``), ``D.rmatmul_t(G_rows)`` (``Aᵀ @ G``),
  ``D.sddmm(Xa_rows, Xb_rows)``; ``D.global_rows`` are the rank's vertices.
- :func:`save_rows` / :func:`load_rows`: a graph on disk each rank reads only its rows of.
- :func:`train`: :func:`tcgnn_py.nn.gcn_apply` (or ``agnn_apply``, ``gat_apply``) trained on all ranks.

Under MPI a rank that raises, exits, is killed or stalls ends the job with an error naming it (``MPI_Abort``
after the NCCL abort); in one process, a collective that outlives ``timeout`` raises
:class:`DistributedTimeoutError`.
"""

from ._context import BACKENDS, DEFAULT_TIMEOUT, Context, DistributedError, DistributedTimeoutError, init, spmd, unique_id
from ._matrix import HALO_DTYPES, DistributedMatrix
from ._nn import DistributedEdges, DistTrainResult, allreduce_grads, local_indices, train
from ._partition import METIS_MAX_ENTRIES, PARTITIONERS, Partition, cut_stats, partition
from ._store import load_rows, save_rows

__all__ = [
    "init",
    "spmd",
    "unique_id",
    "Context",
    "DistributedError",
    "DistributedTimeoutError",
    "DEFAULT_TIMEOUT",
    "BACKENDS",
    "partition",
    "Partition",
    "PARTITIONERS",
    "METIS_MAX_ENTRIES",
    "cut_stats",
    "DistributedMatrix",
    "HALO_DTYPES",
    "save_rows",
    "load_rows",
    "DistributedEdges",
    "DistTrainResult",
    "allreduce_grads",
    "local_indices",
    "train",
]
