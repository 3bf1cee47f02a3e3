"""Layer 4: how a graph is cut into the ranks' rows -- partitioners for locality, row bounds, halos -- and the
NumPy oracle of the partitioned product.

Partitioners (:func:`partition`) renumber the vertices so that each rank's rows form a contiguous block whose
edges stay inside it as far as they can: ``"metis"`` (METIS through pymetis, on the symmetrised pattern,
vertices weighted by their entries), ``"lp"`` (size-capped label propagation on the GPU or the host -- sorts and
scans -- coarsens the graph into clusters, METIS cuts the cluster graph, and label propagation refines the cut),
or ``None`` (the graph's own order).  The default picks by size from the measurements in the distributed guide:
METIS cuts real graphs best and takes seconds up to tens of millions of entries; label-propagation coarsening
keeps METIS's cut on community graphs at a fraction of its time where the graph is larger.

A graph's adjacency ``A`` (``n x n``) and its features ``X`` are split by rows
over ``P`` parts, balanced by nonzeros.  Part ``p`` owns rows
``bounds[p]:bounds[p + 1]`` of ``A``, ``X`` and ``Y = A @ X``.  Its rows read
``X`` at their columns: those it owns, and a *halo* of rows other parts own.
The plan compacts each part's columns to ``[own rows | halo rows, grouped by
owner]``, so the part multiplies a local matrix of ``rows x (own + halo)``
with ``concat(X_own, X_halo)``; ``sends[q][p]`` lists the local rows of part
``q`` that part ``p`` needs, in the order ``p`` stores them.

This module is the plan and its NumPy oracle (:func:`spmm_reference`);
:func:`compact_columns` is the one step a part runs for itself (NumPy or CuPy),
and :mod:`tcgnn_py.distributed` moves the halo rows between GPUs with NCCL.
"""

import dataclasses
import time

import numpy as np
import scipy.sparse as sp

from .._device import get_cupy, to_host, use_gpu
from ..orders import Permutation, run_heads, symmetric_pattern
from .._validation import check_count, coerce_graph

__all__ = ["RowPartition", "balanced_bounds", "compact_columns", "plan", "spmm_reference", "Partition", "partition",
           "PARTITIONERS", "METIS_MAX_ENTRIES", "cut_stats"]

#: The partitioners :func:`partition` offers (``None``: the graph's own order, cut into balanced row blocks).
PARTITIONERS = ("auto", "metis", "lp", None)
#: ``"auto"`` runs METIS up to this many entries of the symmetrised pattern (about 10 s of METIS on one core,
#: measured), label-propagation coarsening beyond (seconds on a GPU at 480M entries; see the distributed guide).
METIS_MAX_ENTRIES = 1 << 24
#: Label propagation: its rounds, the cap of a cluster (this share of a part's weight: clusters small enough
#: that METIS can balance the cluster graph), and the refinement's rounds and balance tolerance.
LP_ROUNDS, LP_CLUSTER_SHARE, LP_REFINE_ROUNDS, LP_IMBALANCE = 8, 1 / 64, 6, 0.03


def balanced_bounds(indptr, parts):
    """Row bounds of ``parts`` contiguous parts with about ``nnz / parts`` entries each (``parts + 1`` ints).

    Cuts fall at row boundaries, so a part may be empty when one row holds more than its share.
    """
    indptr = np.asarray(indptr, np.int64)
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    n, nnz = indptr.shape[0] - 1, int(indptr[-1])
    targets = (np.arange(1, parts, dtype=np.int64) * nnz) // parts
    cuts = np.searchsorted(indptr, targets, side="left")
    return np.concatenate(([0], np.minimum(cuts, n), [n])).astype(np.int64)


def compact_columns(cols, lo, hi, bounds, xp=np):
    """One part's columns compacted to ``[own rows | halo rows, grouped by owner]``.

    ``cols``: the column of each entry in rows ``lo:hi``; ``bounds``: every part's row bounds (on
    the host).  Returns ``(mapped, halo, halo_ptr)``: the entries' local columns, the halo's global
    rows (ascending, so grouped by owner) and where owner ``q``'s group starts (``parts + 1``).
    ``xp`` is NumPy or CuPy (one sort of the part's off-part columns; CuPy reads the halo's size
    back to the host).
    """
    own = (cols >= lo) & (cols < hi)
    halo = xp.unique(cols[~own])
    halo_ptr = xp.searchsorted(halo, xp.asarray(bounds, dtype=halo.dtype))
    mapped = xp.where(own, cols - lo, (hi - lo) + xp.searchsorted(halo, cols))
    return mapped, halo, halo_ptr.astype(np.int64)


@dataclasses.dataclass(frozen=True)
class RowPartition:
    """The plan of a row partition: per part its local matrix, halo and what it sends.

    ``bounds``: row bounds (``parts + 1``); ``local[p]``: part ``p``'s rows as a CSR matrix over
    ``own + halo`` compacted columns; ``halo[p]``: the global rows of its halo, grouped by owner (ascending
    owner, ascending row); ``halo_ptr[p]``: where each owner's group starts in ``halo[p]`` (``parts + 1``);
    ``sends[q][p]``: the local rows of part ``q`` that part ``p`` needs (``halo[p]``'s group from ``q``, minus
    ``bounds[q]``).
    """

    bounds: np.ndarray
    local: list
    halo: list
    halo_ptr: list
    sends: list

    @property
    def parts(self):
        return self.bounds.shape[0] - 1

    def halo_rows(self):
        """Rows each part receives (the communication volume, in rows)."""
        return np.array([h.shape[0] for h in self.halo], np.int64)


def plan(A, parts=None, bounds=None):
    """The :class:`RowPartition` of a square scipy sparse matrix, by ``parts`` (balanced) or explicit ``bounds``."""
    A = sp.csr_array(A)
    n = A.shape[0]
    if A.shape[1] != n:
        raise ValueError(f"a row partition of a graph needs a square matrix, got shape {A.shape}")
    if not A.has_canonical_format:
        A = A.copy()  # the caller's arrays stay as they were
        A.sum_duplicates()
    if bounds is None:
        bounds = balanced_bounds(A.indptr, 1 if parts is None else parts)
    bounds = np.asarray(bounds, np.int64)
    if bounds[0] != 0 or bounds[-1] != n or np.any(np.diff(bounds) < 0):
        raise ValueError("bounds must rise from 0 to the number of rows")
    P = bounds.shape[0] - 1
    local, halo, halo_ptr = [], [], []
    sends = [[np.zeros(0, np.int64) for _ in range(P)] for _ in range(P)]
    for p in range(P):
        lo, hi = int(bounds[p]), int(bounds[p + 1])
        rows = A[lo:hi]
        mapped, h, hp = compact_columns(rows.indices.astype(np.int64), lo, hi, bounds)
        local.append(sp.csr_array((rows.data, mapped, rows.indptr), shape=(hi - lo, (hi - lo) + h.shape[0])))
        halo.append(h)
        halo_ptr.append(hp)
        for q in range(P):
            if q != p:
                sends[q][p] = h[hp[q]:hp[q + 1]] - bounds[q]
    return RowPartition(bounds, local, halo, halo_ptr, sends)


def spmm_reference(part, X_parts):
    """``[Y_p]`` with ``Y_p = local[p] @ concat(X_p, halo of p)``: ``A @ X`` by parts, the exchange simulated.

    ``X_parts[q]`` holds part ``q``'s rows of X; part ``p``'s halo is gathered, group by group, from
    ``X_parts[q][sends[q][p]]`` -- what a GPU would receive from each peer.
    """
    P = part.parts
    out = []
    for p in range(P):
        recv = [X_parts[q][part.sends[q][p]] for q in range(P) if q != p]
        Xl = np.concatenate([np.asarray(X_parts[p])] + recv, axis=0)
        out.append(part.local[p] @ Xl)
    return out


# --- partitioners for locality ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Partition:
    """A renumbering of the vertices into ``parts`` contiguous row blocks, and how it was found.

    ``permutation``: a :class:`~tcgnn_py.Permutation` (``perm[new] = old``); part ``p`` owns the new rows
    ``bounds[p]:bounds[p + 1]``, i.e. the original vertices ``permutation.perm[bounds[p]:bounds[p + 1]]``.
    ``method``, ``seconds``: the partitioner and its time.  Features, labels and results follow the
    permutation (``DistributedMatrix.global_rows`` gives each rank's original vertex ids).
    """

    permutation: Permutation
    bounds: np.ndarray
    method: str
    seconds: float

    @property
    def parts(self):
        return self.bounds.shape[0] - 1

    def part_of(self):
        """Part of every original vertex (int64)."""
        out = np.empty(len(self.permutation), np.int64)
        for p in range(self.parts):
            out[self.permutation.perm[self.bounds[p]:self.bounds[p + 1]]] = p
        return out


def cut_stats(A, part_of, parts):
    """``(cut, halo_rows, nnz)``: the share of A's entries whose row and column fall in different parts, the
    distinct halo rows each part receives, and each part's entries (host arrays; any square scipy matrix)."""
    A = sp.csr_array(A)
    part_of = np.asarray(part_of, np.int64)
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    pr, pc = part_of[rows], part_of[A.indices]
    cross = pr != pc
    halo = np.zeros(parts, np.int64)
    if cross.any():
        key = np.unique(pr[cross] * A.shape[0] + A.indices[cross])
        halo = np.bincount(key // A.shape[0], minlength=parts)
    return (float(cross.mean()) if A.nnz else 0.0), halo, np.bincount(pr, minlength=parts)


def _counts(xp, keys):
    """Distinct sorted ``keys`` and how often each occurs."""
    starts = xp.flatnonzero(run_heads(xp, keys))
    cnt = xp.diff(xp.concatenate([starts, xp.asarray([keys.shape[0]], dtype=starts.dtype)]))
    return keys[starts], cnt


def _argmax_per_row(xp, r, score):
    """Index of each distinct ``r``'s highest ``score`` (``r`` sorted; ties to the first)."""
    o = xp.lexsort(xp.stack([-score, r]))
    return o[run_heads(xp, r[o])]


def _metis(parts, n, xadj, adjncy, vweights, eweights=None):
    try:
        import pymetis
    except ImportError:
        raise ImportError("partition='metis' and 'lp' need pymetis: pip install 'tcgnn_py[partition]' (or pymetis)") from None
    if parts >= n:  # a vertex per part is the balanced cut (METIS would print "too many parts" to stdout)
        return np.arange(n, dtype=np.int64)
    kw = {} if eweights is None else {"eweights": np.asarray(eweights, np.int64)}
    graph = pymetis.CSRAdjacency(np.asarray(xadj, np.int64), np.asarray(adjncy, np.int64))
    _, memb = pymetis.part_graph(parts, adjacency=graph, vweights=np.asarray(vweights, np.int64),
                                 options=pymetis.Options(seed=0), **kw)
    return np.asarray(memb, np.int64)


def _refine(xp, rows, cols, part, w, parts, rounds, imbalance):
    """Label propagation over the parts: a vertex moves to the part most of its neighbours are in, half the
    vertices a round (odd and even ids: no two neighbours swap back and forth), admitted in order while the
    part stays under ``(1 + imbalance)`` of the mean weight."""
    cap = (1 + imbalance) * float(w.sum()) / parts
    for it in range(rounds):
        (keys, cnt) = _counts(xp, xp.sort(rows * parts + part[cols]))
        r, q = keys // parts, keys % parts
        best = _argmax_per_row(xp, r, cnt + 0.5 * (q == part[r]))
        rb, qb = r[best], q[best]
        cand = (qb != part[rb]) & ((rb % 2) == (it % 2))
        rb, qb = rb[cand], qb[cand]
        o = xp.argsort(qb, kind="stable") if xp is np else xp.argsort(qb)
        rb, qb = rb[o], qb[o]
        load = xp.bincount(part, weights=w, minlength=parts)
        added = xp.cumsum(w[rb])
        before = xp.concatenate([xp.zeros(1), added])[xp.searchsorted(qb, xp.arange(parts))]
        admit = load[qb] + (added - before[qb]) <= cap
        part[rb[admit]] = qb[admit]
    return part


def _lp_parts(xp, rows, cols, w, n, parts, seed):
    """Label-propagation coarsening (clusters capped at a share of a part), METIS on the cluster graph, then
    refinement: METIS's cut on community graphs, with the O(entries) work in sorts on ``xp``."""
    cap = float(w.sum()) / parts * LP_CLUSTER_SHARE
    lab = xp.arange(n, dtype=np.int64)
    tie = xp.asarray(np.random.default_rng(seed).random(n))  # a fixed random order among equally good labels
    for it in range(LP_ROUNDS):
        keys, cnt = _counts(xp, xp.sort(rows * n + lab[cols]))
        r, label = keys // n, keys % n
        size = xp.bincount(lab, weights=w, minlength=n)
        stay = label == lab[r]
        ok = stay | (size[label] + w[r] <= cap)
        score = xp.where(ok, cnt + 0.5 * stay + 0.01 * tie[label], -1.0)
        best = _argmax_per_row(xp, r, score)
        move = (score[best] > 0) & ((r[best] % 2) == (it % 2))
        lab[r[best][move]] = label[best][move]
    _, cluster = xp.unique(lab, return_inverse=True)
    cluster = cluster.reshape(-1)
    m = int(cluster.max()) + 1 if n else 0  # synchronize!
    cw = xp.bincount(cluster, weights=w, minlength=m)
    cr, cc = cluster[rows], cluster[cols]
    keep = cr != cc
    keys, ew = _counts(xp, xp.sort(cr[keep] * m + cc[keep]))
    r, c = to_host(keys // m), to_host(keys % m)  # synchronize! (the cluster graph is small)
    memb = _metis(parts, m, np.searchsorted(r, np.arange(m + 1)), c, np.maximum(to_host(cw).astype(np.int64), 1),
                  to_host(ew))
    part = xp.asarray(memb)[cluster]
    return _refine(xp, rows, cols, part, w, parts, LP_REFINE_ROUNDS, LP_IMBALANCE)


def partition(A, parts, method="auto", *, seed=0, device=None):
    """A :class:`Partition` of a square graph into ``parts`` row blocks with few edges between them.

    Parameters
    ----------
    A : sparse array or matrix, TiledMatrix, or ``(data, indices, indptr)``
        The whole graph (its pattern: values are ignored; ``A + Aᵀ`` is what is cut).  A triple is
        ``n x n`` with ``n = len(indptr) - 1``.
    parts : int
        The ranks the graph will be split over.
    method : {"auto", "metis", "lp", None}
        ``"metis"``: METIS (pymetis) on the symmetrised pattern, vertices weighted by their entries (+1), so
        that the parts balance nonzeros.  ``"lp"``: label-propagation coarsening on ``device``, METIS on the
        cluster graph, label-propagation refinement.  ``None``: the graph's own order, cut into blocks of
        balanced entries.  ``"auto"``: METIS up to :data:`METIS_MAX_ENTRIES` entries, ``"lp"`` beyond.
    seed : int
        Of the tie-breaking order (METIS is seeded with 0).
    device : {None, "cuda", "cpu"}, optional
        Where label propagation runs (the GPU by default when usable).

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> from tcgnn_py import distributed as dist
    >>> A = tg.planted_partition_graph(4000, 40000, communities=4, p_in=0.95, seed=1)
    >>> p = dist.partition(A, 2, "metis")
    >>> p.bounds.tolist()[0], p.bounds.tolist()[-1], len(p.permutation)
    (0, 4000, 4000)
    >>> cut, halo, nnz = dist.cut_stats(A, p.part_of(), 2)
    >>> bool(cut < 0.1), bool(dist.cut_stats(A, np.arange(4000) * 2 // 4000, 2)[0] > 0.4)  # the order alone: ~1/2
    (True, True)
    """
    parts = check_count("parts", parts, 1)
    if method not in PARTITIONERS:
        raise ValueError(f"method must be one of {PARTITIONERS}, got {method!r:.60}")
    data, indices, indptr, n = coerce_graph(A, "a graph partition")
    t0 = time.perf_counter()
    host_ptr = to_host(indptr).astype(np.int64)
    if method is None or parts == 1 or n == 0:  # the graph's own order, blocks of balanced entries
        return Partition(Permutation(np.arange(n, dtype=np.int64)), balanced_bounds(host_ptr, parts),
                         "none" if method is None else method, time.perf_counter() - t0)
    xp = get_cupy() if method != "metis" and use_gpu(device) else np
    ind, ptr = (to_host(indices), host_ptr) if xp is np else (xp.asarray(indices), xp.asarray(indptr).astype(np.int64))
    rows, cols = symmetric_pattern(xp, ind, ptr, n)
    if method == "auto":
        method = "metis" if rows.shape[0] <= METIS_MAX_ENTRIES else "lp"
    w = xp.diff(ptr).astype(np.float64) + 1  # a vertex weighs its entries, + 1: the parts balance nonzeros
    if method == "metis":
        r, c = to_host(rows), to_host(cols)
        part = _metis(parts, n, np.searchsorted(r, np.arange(n + 1)), c, to_host(w).astype(np.int64))
    else:
        part = to_host(_lp_parts(xp, rows, cols, w, n, parts, seed))
    order = np.argsort(part, kind="stable").astype(np.int64)
    bounds = np.concatenate([[0], np.cumsum(np.bincount(part, minlength=parts))]).astype(np.int64)
    return Partition(Permutation(order), bounds, method, time.perf_counter() - t0)
