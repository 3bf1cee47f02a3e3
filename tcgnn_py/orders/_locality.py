"""Layer 2: the locality reorder -- a vertex order whose row windows share columns -- and its report.

Tensor-core tiles save work only when the rows of a window share columns.  The
measure is ``U``, the number of distinct (window, column) pairs: SGT gathers one
X row per pair, and ``U / nnz`` is the inverse of the entries each gathered row
serves.  :func:`locality_order` lowers it with a **coarsening hierarchy**:

1. the pattern is symmetrised (directed graphs are ordered by their undirected
   version; the matrix itself is not changed), self-loops dropped;
2. each level, every vertex of the current (contracted) graph picks the
   neighbour of highest ``w(u, v) / (d(u) d(v))`` (``w``: edges between the
   two clusters, ``d``: the clusters' total degrees, so two small, tightly
   linked clusters merge before a hub swallows its leaves); mutual picks merge
   (a matching), and the graph is contracted;
3. the levels form a tree of nested clusters; its depth-first order (children
   by id) numbers the vertices, so each cluster -- 2, 4, 8, ... vertices that
   are linked to each other -- occupies consecutive rows.

The hierarchy is one candidate.  The others: degree order (hubs first, which
packs the columns hubs share), degree bands with the hierarchy's order inside
each band (hub-heavy graphs: rows of similar length, still clustered), and the
input order.  The order with the fewest (window, column) pairs for the
requested layout is returned -- so the result is never worse than the input by
that measure.  Picking among these by
measurement, and the matching's score, come from measurements over the real
graphs of the benchmark set (``tools/locality_table.py``).

Every step is a sort, a scan or a gather on ``xp`` (CuPy on the GPU, NumPy in
the reference and in the CUDA simulator), plus one Numba kernel per level
(:func:`tcgnn_py.kernels.locality.best_partner`) whose NumPy twin
(:func:`_best_partner_reference`) returns the same integers, so the GPU and the
reference return the same permutation.
"""

import dataclasses
import sys
import time

import numpy as np

from .._device import array_module, to_host
from .._reference import edge_rows
from ..tiles import resolve_layout

__all__ = ["LocalityReport", "LayoutLocality", "locality_order", "locality_stats", "CANDIDATES", "run_heads",
           "symmetric_pattern"]

#: The orders :func:`locality_order` measures, in the order ties are broken.  ``bandsB``: vertices by
#: degree band (``floor(log_B(degree))``, largest first), the cluster order within a band.
CANDIDATES = ("original", "clusters", "degree", "bands2", "bands4", "bands16")


def _argsort(xp, a):
    # CuPy's argsort is always stable; NumPy's only when asked.
    return np.argsort(a, kind="stable") if xp is np else xp.argsort(a)


def run_heads(xp, sorted_keys):
    """True where a run of equal sorted keys starts."""
    head = xp.empty(sorted_keys.shape[0], dtype=np.bool_)
    head[:1] = True
    xp.not_equal(sorted_keys[1:], sorted_keys[:-1], out=head[1:])
    return head


def symmetric_pattern(xp, indices, indptr, n):
    """Rows and columns (int64, sorted by row then column) of the pattern of ``A + A^T`` without the diagonal."""
    rows = edge_rows(indptr, indices.shape[0]).astype(np.int64)
    cols = indices.astype(np.int64)
    r = xp.concatenate([rows, cols])
    c = xp.concatenate([cols, rows])
    keep = r != c
    key = xp.sort(r[keep] * n + c[keep])
    key = key[run_heads(xp, key)]
    return key // n, key % n


def _best_partner_reference(ptr, row, col, score):
    """NumPy twin of the ``best_partner`` kernel: per row the argmax of ``score``, ties to the smallest ``col``."""
    m = ptr.shape[0] - 1
    partner = np.full(m, -1, dtype=np.int64)
    if row.shape[0] == 0:
        return partner
    nonempty = ptr[1:] > ptr[:-1]
    rowmax = np.full(m, -1.0)
    rowmax[nonempty] = np.maximum.reduceat(score, ptr[:-1][nonempty])
    hit = np.flatnonzero(score == rowmax[row])  # entries are sorted by (row, col): the first hit has the smallest col
    first = hit[run_heads(np, row[hit])]
    partner[row[first]] = col[first]
    return partner


def _best_partner_kernel(ptr, row, col, score):
    from ..kernels.launch import THREADS_PER_BLOCK as TPB
    from ..kernels.launch import grid
    from ..kernels.launch import launch_numba as _launch
    from ..kernels.locality import best_partner

    xp = array_module(ptr)
    m = ptr.shape[0] - 1
    partner = xp.full(m, -1, dtype=np.int64)
    if m:
        _launch(best_partner, grid(32 * m), TPB, ptr, col, score, partner)
    return partner


def coarsen(xp, row, col, n, best_partner, *, max_levels=64, deadline=None, log=None):
    """The matching hierarchy: per level, the cluster id (of the next level) of every cluster.

    Returns ``(parents, sizes)``: ``parents[l][i]`` is the level ``l + 1`` cluster
    of level-``l`` cluster ``i`` (level 0: the vertices), ``sizes[l]`` the number
    of clusters at level ``l``.  Stops when no pair merges, at ``max_levels``, or
    after ``deadline`` (a ``time.perf_counter()`` value).
    """
    w = xp.ones(row.shape[0], dtype=np.int64)
    deg = xp.bincount(row, minlength=n).astype(np.float64) + 1.0  # + 1: isolated clusters have d > 0
    parents, sizes = [], [n]
    m = n
    while len(parents) < max_levels and row.shape[0]:
        ptr = xp.searchsorted(row, xp.arange(m + 1, dtype=np.int64)).astype(np.int64)
        score = w / (deg[row] * deg[col])  # exact integers in float64, one IEEE division: the same on both
        p = best_partner(ptr, row, col, score)
        idx = xp.arange(m, dtype=np.int64)
        mutual = (p >= 0) & (p[xp.maximum(p, 0)] == idx)
        rep = xp.where(mutual, xp.minimum(idx, p), idx)
        new_id = xp.cumsum(rep == idx) - 1
        m_next = int(to_host(new_id[-1:])[0]) + 1  # synchronize!
        if m_next == m:
            break
        cid = new_id[rep]
        parents.append(cid)
        sizes.append(m_next)
        r, c = cid[row], cid[col]
        keep = r != c
        key, wk = r[keep] * m_next + c[keep], w[keep]
        o = _argsort(xp, key)
        key, wk = key[o], wk[o]
        starts = xp.flatnonzero(run_heads(xp, key))  # synchronize! (its size)
        # per merged edge: the sum of its weights (integers: exact)
        ends = xp.concatenate([starts[1:], xp.full(min(1, key.shape[0]), key.shape[0], dtype=starts.dtype)]) - 1
        tot = xp.cumsum(wk)[ends]
        w = xp.diff(tot, prepend=xp.zeros(min(1, tot.shape[0]), dtype=tot.dtype)) if tot.shape[0] else tot
        key = key[starts]
        row, col = key // m_next, key % m_next
        deg = xp.bincount(cid, weights=deg, minlength=m_next)
        m = m_next
        if log is not None:
            log(len(parents), m, int(row.shape[0]))
        if deadline is not None and time.perf_counter() > deadline:
            break
    return parents, sizes


def tree_order(xp, parents, sizes):
    """Depth-first order of the cluster tree (children by id): ``order[new] = vertex``."""
    rank = xp.arange(sizes[-1], dtype=np.int64)
    order = rank
    for cid, m in zip(reversed(parents), reversed(sizes[:-1])):
        order = _argsort(xp, rank[cid] * m + xp.arange(m, dtype=np.int64))  # distinct keys
        rank = xp.empty(m, dtype=np.int64)
        rank[order] = xp.arange(m, dtype=np.int64)
    return order


def degree_order(xp, deg):
    """Vertices by decreasing degree, ties by id."""
    return _argsort(xp, -deg)


def band_order(xp, deg, cluster_rank, base):
    """Vertices by degree band ``floor(log_base(degree))``, largest first; by ``cluster_rank`` within a band.

    The band is computed with integers (``base ** k <= degree``), so it is the
    same on every device.
    """
    band = xp.zeros(deg.shape[0], dtype=np.int64)
    p = base
    while True:
        above = deg >= p
        if not bool(above.any()):  # synchronize!
            break
        band += above
        p *= base
    n = deg.shape[0]
    return _argsort(xp, -band * n + cluster_rank)


def window_pairs(xp, rows, cols, shape, window, inv=None):
    """Distinct columns per row window (int64, ``ceil(rows / window)`` windows).

    ``inv`` (new id of each old vertex) renumbers rows and columns alike: the
    windows of ``P A P^T``.
    """
    n_rows, n_cols = shape
    n_win = -(-n_rows // window)
    if rows.shape[0] == 0:
        return xp.zeros(n_win, dtype=np.int64)
    if inv is not None:
        rows, cols = inv[rows], inv[cols]
    key = xp.sort((rows // window) * n_cols + cols)
    key = key[run_heads(xp, key)]
    return xp.bincount(key // n_cols, minlength=n_win)


def inverse(xp, perm):
    """``inv[perm[i]] = i`` (int64)."""
    inv = xp.empty(perm.shape[0], dtype=np.int64)
    inv[perm] = xp.arange(perm.shape[0], dtype=np.int64)
    return inv


@dataclasses.dataclass(frozen=True)
class LayoutLocality:
    """How well an order suits one tiled layout (``window`` rows, ``block`` column slots).

    ``pairs``: distinct (window, column) pairs -- the X rows SGT gathers, over
    ``nnz`` entries; ``blocks``: tiles after condensing (``ceil(pairs / block)``
    per window), ``density``: entries per tile slot; ``blocks_per_window``: the
    median, 90th, 99th percentile and maximum over non-empty windows.
    """

    layout: object
    nnz: int
    pairs: int
    blocks: int
    blocks_per_window: tuple

    @property
    def pairs_per_nnz(self):
        """``U / nnz``: 1.0 when no two rows of a window share a column."""
        return self.pairs / self.nnz if self.nnz else 0.0

    @property
    def density(self):
        H, W = self.layout.tile_shape
        return self.nnz / (self.blocks * H * W) if self.blocks else 0.0

    def __str__(self):
        p50, p90, p99, pmax = self.blocks_per_window
        return (
            f"{self.layout}: U/nnz {self.pairs_per_nnz:.3f}, {self.blocks} blocks, density {100 * self.density:.2f}%, "
            f"blocks/window p50 {p50} p90 {p90} p99 {p99} max {pmax}"
        )


def locality_stats(xp, rows, cols, shape, layout, inv=None):
    """:class:`LayoutLocality` of one layout for the entries ``(rows, cols)`` (int64 on ``xp``) of a matrix.

    ``inv`` (new id of each old vertex, square matrices) describes ``P A P^T``.
    """
    layout = resolve_layout(layout)
    cnt = window_pairs(xp, rows, cols, shape, layout.window, inv)
    blocks = -(-cnt // layout.block)
    nonempty = blocks[blocks > 0]
    if nonempty.shape[0]:
        srt = to_host(xp.sort(nonempty))  # synchronize!
        bpw = tuple(int(srt[max(0, int(np.ceil(q * len(srt))) - 1)]) for q in (0.5, 0.9, 0.99, 1.0))
    else:
        bpw = (0, 0, 0, 0)
    pairs, n_blocks = (int(v) for v in to_host(xp.stack([cnt.sum(), blocks.sum()])))  # synchronize!
    return LayoutLocality(layout, int(rows.shape[0]), pairs, n_blocks, bpw)


@dataclasses.dataclass(frozen=True)
class LocalityReport:
    """Column sharing of a matrix's row windows, per tensor-core layout.

    ``layouts`` maps ``"tcgnn"`` and ``"vector"`` to :class:`LayoutLocality`;
    ``initial`` holds the same for the input order when the report describes a
    reordered matrix.  After :func:`tcgnn_py.reorder` with ``"locality"``:
    ``method`` is the candidate that won, ``candidates`` maps each candidate to
    its ``U / nnz`` for the layout it was chosen for, ``levels`` is the depth
    of the cluster hierarchy and ``time_s`` the reorder's time.
    """

    n: int
    nnz: int
    layouts: dict
    initial: dict = None
    method: str = None
    chosen_for: str = None
    candidates: dict = None
    levels: int = 0
    time_s: float = 0.0

    def __getitem__(self, layout):
        return self.layouts[layout]

    def __str__(self):
        parts = []
        for name, st in self.layouts.items():
            s = f"{name} U/nnz {st.pairs_per_nnz:.3f}"
            if self.initial is not None:
                s = f"{name} U/nnz {self.initial[name].pairs_per_nnz:.3f} -> {st.pairs_per_nnz:.3f}"
            parts.append(s + f" (density {100 * st.density:.2f}%)")
        s = "locality: " + ", ".join(parts)
        if self.method is not None:
            s += f"; {self.method} order chosen for {self.chosen_for} ({self.levels} levels, {self.time_s:.3f} s)"
        return s


def progress_logger(verbose, t0):
    """``log(message)``: prints ``message()`` to stderr -- always (``verbose=True``), never (False), or
    (None) once a second after the first two seconds: the reorders' progress convention."""
    last = [t0]

    def log(message):
        now = time.perf_counter()
        if verbose is False or (verbose is None and (now - t0 < 2.0 or now - last[0] < 1.0)):
            return
        last[0] = now
        print(f"{message()}, {now - t0:.1f} s", file=sys.stderr)

    return log


def _logger(verbose, t0):
    log = progress_logger(verbose, t0)
    return lambda level, m, edges: log(lambda: f"reorder locality: level {level}: {m} clusters, {edges} edges")


def locality_order(xp, indices, indptr, n, layout, *, kernel, max_levels=64, time_budget=None, verbose=None, t0=None):
    """The locality permutation (``perm[new] = old``, int64 on ``xp``) and what was measured.

    ``kernel``: the per-level argmax runs as the Numba kernel (on CuPy arrays,
    or on NumPy arrays in the CUDA simulator); otherwise as its NumPy twin.
    """
    t0 = time.perf_counter() if t0 is None else t0
    layout = resolve_layout(layout)
    rows, cols = symmetric_pattern(xp, indices, indptr, n)
    deadline = None if time_budget is None else t0 + time_budget
    partner = _best_partner_kernel if kernel else _best_partner_reference
    parents, sizes = coarsen(xp, rows, cols, n, partner, max_levels=max_levels, deadline=deadline, log=_logger(verbose, t0))
    clusters = tree_order(xp, parents, sizes)
    deg = xp.bincount(rows, minlength=n)
    orders = {"original": xp.arange(n, dtype=np.int64), "clusters": clusters, "degree": degree_order(xp, deg)}
    rank = inverse(xp, clusters)
    for base in (2, 4, 16):
        orders[f"bands{base}"] = band_order(xp, deg, rank, base)
    a_rows = edge_rows(indptr, indices.shape[0]).astype(np.int64)
    a_cols = indices.astype(np.int64)
    pairs = [window_pairs(xp, a_rows, a_cols, (n, n), layout.window, inverse(xp, orders[k])).sum() for k in CANDIDATES]
    pairs = [int(v) for v in to_host(xp.stack(pairs))]  # synchronize!
    best = int(np.argmin(pairs))  # the first minimum: the input order wins ties
    nnz = max(1, int(indices.shape[0]))
    return orders[CANDIDATES[best]], dict(
        method=CANDIDATES[best],
        chosen_for=layout.name or str(layout),
        candidates={k: p / nnz for k, p in zip(CANDIDATES, pairs)},
        levels=len(parents),
    )
