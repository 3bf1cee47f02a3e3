"""Layer 2: row partitions of a square sparse matrix and their halos (issue 20), on the reference path.

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

import numpy as np
import scipy.sparse as sp

__all__ = ["RowPartition", "balanced_bounds", "compact_columns", "plan", "spmm_reference"]


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
