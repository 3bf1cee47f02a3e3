"""Layer 4: a graph on disk that each rank reads its own rows of: ``.npy`` arrays, memory-mapped.

A folder holds the CSR arrays of the (partitioned) matrix -- ``indptr.npy`` (int64), ``indices.npy`` (int32),
``data.npy`` -- with ``bounds.npy`` (each rank's row block), ``perm.npy`` (the partition's ``perm[new] = old``)
and ``meta.json``.  :func:`load_rows` memory-maps them and copies out one rank's slices: a rank's host memory
peaks at its share of the entries plus the O(n) row pointers and permutation, so a graph larger than one
host's memory loads across hosts.  Writing is one pass over the matrix (:func:`save_rows`).
"""

import json
import pathlib

import numpy as np

from .._validation import check_count, coerce_graph
from ._matrix import DistributedMatrix, host_array, take_rows
from ._partition import Partition, balanced_bounds, partition as find_partition

__all__ = ["save_rows", "load_rows", "FORMAT"]

#: The folder's format tag (``meta.json``'s ``"format"``).
FORMAT = "tcgnn_py.rows/1"


def save_rows(A, folder, parts, *, partition=None):
    """Write ``A`` as a folder of ``.npy`` arrays that ``parts`` ranks read their rows of (:func:`load_rows`).

    Parameters
    ----------
    A : sparse array or matrix, TiledMatrix, or ``(data, indices, indptr)``
        A square graph (``n x n`` with ``n = len(indptr) - 1`` for a triple).
    folder : str or path
        Created if missing; the arrays in it are replaced.
    parts : int
        The ranks that will read it.
    partition : {None, "auto", "metis", "lp"} or Partition, optional
        Renumber the vertices for locality first (:func:`~tcgnn_py.distributed.partition`): the rows are then
        stored in the partition's order, and ``perm.npy`` maps them back.

    Returns
    -------
    Partition
        The row blocks written (the identity permutation without ``partition``).
    """
    parts = check_count("parts", parts, 1)
    data, indices, indptr, n = coerce_graph(A, "a row-partitioned graph")
    data, indices, indptr = (host_array(v) for v in (data, indices, indptr))
    if partition is not None and not isinstance(partition, Partition):
        partition = find_partition((data, indices, indptr), parts, partition)
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    indptr = indptr.astype(np.int64)
    if partition is None:
        from ..orders import Permutation

        partition = Partition(Permutation(np.arange(n, dtype=np.int64)), balanced_bounds(indptr, parts), "none", 0.0)
    elif partition.parts != parts or len(partition.permutation) != n:
        raise ValueError(f"the partition is of {len(partition.permutation)} vertices into {partition.parts} parts, "
                         f"not {n} into {parts}")
    perm, inv = partition.permutation.perm, partition.permutation.inverse_perm
    lengths = np.diff(indptr)[perm]
    new_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=new_ptr[1:])
    nnz = int(new_ptr[-1])
    out_ind = np.lib.format.open_memmap(folder / "indices.npy", "w+", np.int32, (nnz,))
    out_dat = np.lib.format.open_memmap(folder / "data.npy", "w+", data.dtype, (nnz,))
    step = 1 << 20  # rows at a time: the writer's memory stays bounded too
    for a in range(0, n, step):
        d, c, _ = take_rows(data, indices, indptr, perm[a:a + step])
        lo = int(new_ptr[a])
        out_ind[lo:lo + c.shape[0]] = inv[c]
        out_dat[lo:lo + c.shape[0]] = d
    out_ind.flush()
    out_dat.flush()
    del out_ind, out_dat
    np.save(folder / "indptr.npy", new_ptr)
    np.save(folder / "bounds.npy", partition.bounds.astype(np.int64))
    np.save(folder / "perm.npy", perm)
    (folder / "meta.json").write_text(json.dumps({
        "format": FORMAT, "n": n, "nnz": nnz, "parts": parts, "dtype": np.dtype(data.dtype).name,
        "partition": partition.method, "partition_seconds": partition.seconds}, indent=1))
    return partition


def load_rows(folder, ctx, *, dtype=None, layout=None, halo_dtype=None):
    """This rank's :class:`DistributedMatrix` from a folder written by :func:`save_rows`, reading only its rows.

    The rank's original vertex ids are ``D.global_rows`` (its rows of the features and labels).

    Examples
    --------
    >>> import tempfile, numpy as np, tcgnn_py as tg
    >>> from tcgnn_py import distributed as dist
    >>> A = tg.power_law_graph(500, 3000, seed=1)
    >>> folder = tempfile.mkdtemp()
    >>> _ = dist.save_rows(A, folder, 2)
    >>> X = np.ones((500, 1), np.float32)
    >>> def rank(ctx):
    ...     D = dist.load_rows(folder, ctx)  # this rank's rows only
    ...     return D.global_rows, D.matmul(X[D.global_rows])
    >>> rows, ys = zip(*dist.spmd(rank, 2, backend="reference"))
    >>> bool((np.concatenate(ys) == (A @ X)[np.concatenate(rows)]).all())
    True
    """
    folder = pathlib.Path(folder)
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{folder} holds no rows written by tcgnn_py.distributed.save_rows "
                                "(meta.json is missing)") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{folder}: format {meta.get('format')!r}, expected {FORMAT!r}")
    bounds = np.load(folder / "bounds.npy")
    if bounds.shape[0] - 1 != ctx.world_size:
        raise ValueError(f"{folder} was written for {bounds.shape[0] - 1} ranks; this group has {ctx.world_size}")
    lo, hi = int(bounds[ctx.rank]), int(bounds[ctx.rank + 1])
    indptr = np.load(folder / "indptr.npy", mmap_mode="r")
    a, b = int(indptr[lo]), int(indptr[hi])
    rows = (np.array(np.load(folder / "data.npy", mmap_mode="r")[a:b]),
            np.array(np.load(folder / "indices.npy", mmap_mode="r")[a:b]),
            np.array(indptr[lo:hi + 1]) - a)
    perm = np.load(folder / "perm.npy", mmap_mode="r")
    global_rows = np.array(perm[lo:hi])
    return DistributedMatrix.from_rows(rows, ctx, bounds, global_rows=global_rows, dtype=dtype, layout=layout,
                                       halo_dtype=halo_dtype)
