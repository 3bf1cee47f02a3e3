"""Layer 2: the N:M sparsity-oriented graph reorder (PPoPP'25), GPU and reference.

One driver (:func:`_run`, the paper's Algorithm 1 around Algorithms 2 and 3)
runs on either backend:

* :class:`_KernelBackend` -- Numba kernels of :mod:`tcgnn_py.kernels.reorder`
  plus CuPy sorts and scans, on device arrays (or on NumPy arrays in the CUDA
  simulator, which is how CI runs the kernels);
* :class:`_RefBackend` -- :mod:`tcgnn_py.orders._nm_reference`, the NumPy oracle.

Both compute the same integers with the same tie-breaks, so they return the
same permutation.
"""

import dataclasses
import math
import time
import types

import numpy as np

from . import _locality as loc
from . import _nm_reference as ref
from .._reference import edge_rows
from .. import tiles
from ..tiles import DEFAULT_LAYOUT, LAYOUTS, resolve_layout
from .._device import to_host, use_gpu
from .._tuning import options
from ..kernels.launch import THREADS_PER_BLOCK as _TPB
from ..kernels.launch import grid as _grid
from ..kernels.launch import launch_numba as _launch
from ._permutation import Permutation
from .._validation import Pattern, check_count, check_csr_arrays, check_pattern, coerce_csr, distinct_entries

__all__ = ["Permutation", "NMReport", "reorder", "nm_report", "best_pattern", "locality_report", "LocalityReport", "LayoutLocality"]

LocalityReport, LayoutLocality = loc.LocalityReport, loc.LayoutLocality

_PRE_BYTES = 1 << 28  # cap of stage 2's precomputed gains

#: Blocks per SpMM unit of the N:M layouts (the unit a long window is split into); the window stage keeps the
#: number of split windows and the longest unit in check against it.  The N:M SpMM's default uses the same.
NM_BLOCKS_PER_UNIT = 32


def _argsort(xp, a):
    # CuPy's argsort is always stable; NumPy's only when asked.
    return np.argsort(a, kind="stable") if xp is np else xp.argsort(a)


class _RefBackend:
    """The reference primitives (host NumPy)."""

    def __init__(self, indices, edge_row, n, pattern):
        self.indices, self.edge_row, self.n, self.pattern = indices, edge_row, n, pattern
        self.n_seg = ref.n_segments(n, pattern.M)

    def identity(self):
        return np.arange(self.n, dtype=np.int64)

    def evaluate(self, perm):
        inv = np.empty_like(perm)
        inv[perm] = np.arange(self.n)
        vrow, vseg, bits = ref.segment_vectors(self.indices, self.edge_row, inv, self.n, self.pattern.M)
        sc = ref.scores(vrow, vseg, bits, self.n, self.pattern)
        return types.SimpleNamespace(perm=perm, vrow=vrow, vseg=vseg, bits=bits, **sc)

    def stage1(self, st):
        toks = ref.vector_tokens(st.vseg, st.bits, self.n_seg, self.pattern)
        return st.perm[ref.stage1_order(st.vrow, toks, self.n)]

    def stage2(self, st):
        swaps = ref.stage2_swaps(st.vrow, st.vseg, st.bits, vars(st), self.n, self.pattern)
        return ref.apply_swaps(st.perm, swaps), len(swaps)

    def host(self, perm):
        return perm

    def device(self, perm):
        return perm


class _KernelBackend:
    """The GPU primitives; ``xp`` is CuPy, or NumPy under the CUDA simulator."""

    def __init__(self, xp, indices, edge_row, n, pattern):
        from ..kernels import reorder as k

        self.k, self.xp = k, xp
        self.indices, self.edge_row, self.n, self.pattern = indices, edge_row, n, pattern
        self.n_seg = ref.n_segments(n, pattern.M)

    def identity(self):
        return self.xp.arange(self.n, dtype=np.int32)

    def _pack(self, keys, bits):
        """Sort ``keys``; OR ``bits`` per distinct key.  Returns (distinct keys, ORs, order, ids)."""
        xp, M = self.xp, self.pattern.M
        order = _argsort(xp, keys)
        keys = keys[order]
        head = xp.empty(keys.shape[0], dtype=np.bool_)
        head[:1] = True
        xp.not_equal(keys[1:], keys[:-1], out=head[1:])
        ids = xp.cumsum(head, dtype=np.int64) - 1
        starts = xp.flatnonzero(head)  # synchronize! (its size)
        out = xp.zeros(starts.shape[0], dtype=np.uint32)
        if keys.shape[0]:
            _launch(self.k.pack_bits, _grid(keys.shape[0]), _TPB, ids, bits[order], M, out)
        return keys[starts], out, order, ids

    def _row_ptr(self, st):
        """Each row's first vector (vectors are in (row, segment) order), cached on ``st``."""
        if not hasattr(st, "row_ptr"):
            st.row_ptr = self.xp.searchsorted(st.vrow, self.xp.arange(self.n + 1)).astype(np.int32)
        return st.row_ptr

    def evaluate(self, perm):
        xp, k, n, S = self.xp, self.k, self.n, self.n_seg
        V, N, M = self.pattern
        inv = xp.empty(n, dtype=np.int32)
        inv[perm] = xp.arange(n, dtype=np.int32)
        c = inv[self.indices].astype(np.int64)
        keys = inv[self.edge_row].astype(np.int64) * S + c // M
        bit = xp.left_shift(xp.uint32(1), (M - 1 - c % M).astype(np.uint32))
        ukey, vbits, _, _ = self._pack(keys, bit)
        vrow, vseg = ukey // S, ukey % S
        nv = vbits.shape[0]
        tokens = xp.empty(nv, dtype=np.uint64)
        flags = xp.empty(nv, dtype=np.int8)
        seg_ps = xp.zeros(S, dtype=np.int32)
        seg_nnz = xp.zeros(S, dtype=np.int64)
        if nv:
            _launch(k.vector_codes, _grid(nv), _TPB,
                vseg, vbits, S, N, M, ref.K_VERTICAL, tokens, flags, seg_ps, seg_nnz
            )
        counts = [(flags & 1) != 0, (flags & 5) != 0]
        n_mb = nv
        if V > 1:
            mkeys, mbits, morder, mids = self._pack((vrow // V) * S + vseg, vbits)
            hviol = xp.zeros(mkeys.shape[0], dtype=np.int8)
            hviol[mids[(flags[morder] & 1) != 0]] = 1
            cnt = xp.zeros(1, dtype=np.int32)
            if mkeys.shape[0]:
                _launch(k.count_meta_violations, _grid(mkeys.shape[0]), _TPB, mbits, hviol, ref.K_VERTICAL, cnt)
            counts[1] = cnt
            n_mb = mkeys.shape[0]
        pscore, mbscore = (int(v) for v in to_host(xp.stack([c.sum() for c in counts])))  # synchronize!
        return types.SimpleNamespace(
            perm=perm, vrow=vrow, vseg=vseg, bits=vbits, tokens=tokens, flags=flags,
            seg_pscore=seg_ps, seg_nnz=seg_nnz, pscore=pscore, mbscore=mbscore,
            n_vectors=int(nv), n_meta_blocks=int(n_mb),
        )  # fmt: skip

    def stage1(self, st):
        """Stable sort of rows by token sequences: refine groups one token at a time.

        Slots ``order`` hold rows; ``gid`` is the first slot of each row's group
        of equal prefixes.  Round ``r`` sorts the unfinished groups by their
        ``r``-th token (END past a row's end) and splits them; a group is done
        when it has one row or its rows all ended (equal rows keep their order).
        """
        xp, n = self.xp, self.n
        ptr = self._row_ptr(st)
        length = ptr[1:] - ptr[:-1]
        order = xp.arange(n, dtype=np.int64)
        gid = xp.zeros(n, dtype=np.int64)
        active = xp.arange(n, dtype=np.int64)
        end = np.uint64(ref.END)
        r = 0
        while active.shape[0]:
            rows = order[active]
            has = length[rows] > r
            key = xp.full(rows.shape[0], end, dtype=np.uint64)
            key[has] = st.tokens[ptr[rows[has]] + r]
            g = gid[active]
            o = _argsort(xp, key)
            o = o[_argsort(xp, g[o])]
            rows, key, g = rows[o], key[o], g[o]
            order[active] = rows
            head = xp.empty(rows.shape[0], dtype=np.bool_)
            head[0] = True
            head[1:] = (g[1:] != g[:-1]) | (key[1:] != key[:-1])
            starts = xp.flatnonzero(head)
            grp = xp.cumsum(head) - 1
            gid[active] = active[starts][grp]
            size = xp.diff(xp.append(starts, rows.shape[0]))[grp]
            active = active[(size > 1) & (key != end)]
            r += 1
        return st.perm[order]

    def stage2(self, st):
        xp, k, n, S = self.xp, self.k, self.n, self.n_seg
        _, N, M = self.pattern
        ps = st.seg_pscore.copy()
        unhealthy = xp.flatnonzero(ps > 0)
        I = unhealthy[_argsort(xp, -ps[unhealthy])].astype(np.int32)
        if I.shape[0] == 0:
            return st.perm, 0
        healthy = xp.flatnonzero(ps == 0)
        spare = healthy[_argsort(xp, st.seg_nnz[healthy])].astype(np.int32)
        sel = xp.flatnonzero(st.flags & 2)
        sel = sel[_argsort(xp, st.vseg[sel])]  # vectors are in (row, seg) order: now (seg, row)
        seg_ptr = xp.searchsorted(st.vseg[sel], xp.arange(S + 1)).astype(np.int32)
        used = xp.zeros(S * M, dtype=np.uint8)
        used[n:] = 1
        swaps = xp.empty((n // 2 + 1, 2), dtype=np.int32)
        n_swaps = xp.zeros(1, dtype=np.int32)
        L = I.shape[0]
        tabs = (seg_ptr, st.vrow[sel].astype(np.int32), st.bits[sel], self._row_ptr(st), st.vseg.astype(np.int32), st.bits)
        # a primary tries at most M targets: precompute those gains (memory-capped)
        W = max(0, min(M, L - 1, _PRE_BYTES // max(1, L * 12 * M * M)))
        pre = xp.empty((L * W, 3, M * M), dtype=np.int32)
        if W:
            _launch(k.gains_batch, _grid(L * W * 32), _TPB, I, W, *tabs, N, M, pre)
        _launch(k.stage2_round, 1, 32,
            I, spare, ps, *tabs, N, M, used, xp.zeros(L, dtype=np.int8), pre, W, swaps, n_swaps
        )
        cnt = int(to_host(n_swaps)[0])  # synchronize!
        perm = st.perm.copy()
        p, q = swaps[:cnt, 0], swaps[:cnt, 1]
        perm[p], perm[q] = perm[q], perm[p].copy()
        return perm, cnt

    def host(self, perm):
        return to_host(perm).astype(np.int64)

    def device(self, perm):
        return self.xp.asarray(perm.astype(np.int32))


def _objective(st):
    return (st.mbscore, st.pscore)


def _run(backend, max_iter, stage_iter, patience, log, deadline=None):
    """Algorithm 1: alternate stage 1 and stage 2 until conforming, stalled or ``max_iter``.

    Returns ``(initial, best, iterations)`` states; ``best`` is the best order
    seen by (MBScore, PScore), so the result is never worse than the input.
    """
    st = backend.evaluate(backend.identity())
    initial = best = st
    it = stall = 0
    while best.mbscore > 0 and it < max_iter and stall < patience:
        if deadline is not None and time.perf_counter() > deadline:
            break
        it += 1
        improved = False
        for _ in range(stage_iter):  # stage 1, while MBScore improves
            if st.mbscore == 0:
                break
            cand = backend.evaluate(backend.stage1(st))
            if cand.mbscore >= st.mbscore:
                break
            st = cand
        if _objective(st) < _objective(best):
            best, improved = st, True
        for _ in range(stage_iter):  # stage 2 rounds
            if st.pscore == 0:
                break
            perm, n_swaps = backend.stage2(st)
            if n_swaps == 0:
                break
            st = backend.evaluate(perm)
            if _objective(st) < _objective(best):
                best, improved = st, True
        stall = 0 if improved else stall + 1
        log(it, st, best)
    return initial, best, it


@dataclasses.dataclass(frozen=True)
class NMReport:
    """How well an adjacency pattern meets an ``N:M`` / ``V:N:M`` pattern.

    ``pscore``: segment vectors with more than N nonzeros; ``mbscore``:
    meta-blocks breaking the vertical (more than 4 nonzero columns) or the
    horizontal constraint; ``n_vectors``/``n_meta_blocks``: nonzero ones.
    After a reorder, ``initial_*`` hold the input's scores, ``iterations`` and
    ``time_s`` the search's.
    """

    pattern: Pattern
    n: int
    pscore: int
    mbscore: int
    n_vectors: int
    n_meta_blocks: int
    initial_pscore: int = None
    initial_mbscore: int = None
    iterations: int = 0
    time_s: float = 0.0
    #: ``reorder(..., layout=)`` only: the N:M layout ordered for, and the padding share of its
    #: grouping's stored slots (:func:`window_grouping`) for the input, after the two stages, and final.
    layout: str = None
    initial_padding: float = None
    reorder_padding: float = None
    padding: float = None
    #: Vertices whose number the window stage changed (0: it kept the two stages' order).
    renumbered: int = 0

    @property
    def conforming(self):
        """True when every meta-block (and so every segment vector) conforms."""
        return self.mbscore == 0

    @property
    def objective(self):
        """The score the reorder minimises for this pattern: ``"pscore"`` for N:M, ``"mbscore"`` for V:N:M."""
        return "pscore" if self.pattern.V == 1 else "mbscore"

    @property
    def improvement_rate(self):
        """``(initial - final) / initial`` of :attr:`objective` (PScore for N:M, MBScore for V:N:M).

        NaN without initial violations.  For V:N:M the reorder trades PScore for
        MBScore, so PScore may rise while this rate stays >= 0.
        """
        initial = self.initial_pscore if self.objective == "pscore" else self.initial_mbscore
        final = self.pscore if self.objective == "pscore" else self.mbscore
        if initial is None or initial == 0:
            return math.nan
        return (initial - final) / initial

    def __str__(self):
        s = f"{self.pattern}: PScore {self.pscore}, MBScore {self.mbscore}"
        if self.initial_pscore is not None:
            s = (
                f"{self.pattern}: PScore {self.initial_pscore} -> {self.pscore}, MBScore {self.initial_mbscore} -> "
                f"{self.mbscore} ({self.improvement_rate:.2%} of {self.objective.replace('score', 'Score').replace('pS', 'PS').replace('mbS', 'MBS')} removed), "
                f"{self.iterations} iterations, {self.time_s:.3f} s"
            )
        s += ", conforming" if self.conforming else ", not conforming"
        if self.layout is not None:
            s += (f"; {self.layout} windows: padding {self.initial_padding:.2%} -> {self.reorder_padding:.2%} "
                  f"(two stages) -> {self.padding:.2%} ({self.renumbered} vertices renumbered)")
        return s


def _square_csr(A, n=None):
    """Validated CSR arrays of a square matrix; a ``(data, indices, indptr)`` tuple is ``n x n``
    with ``n = len(indptr) - 1`` unless ``n`` is given.  Indices are checked before the shape."""
    if isinstance(A, tuple) and len(A) == 3:
        n = len(A[2]) - 1 if n is None else n
        data, indices, indptr, shape = coerce_csr(A, (n, n))
    else:
        data, indices, indptr, shape = coerce_csr(A)
    if shape[0] != shape[1]:
        raise ValueError(f"the reorder renumbers the vertices of a graph: A must be square, got {shape}")
    data, indices, indptr = check_csr_arrays(data, indices, indptr, shape)
    return data, *distinct_entries(indices, indptr, shape[1]), shape


def _prepare(A, pattern, device):
    """Validated structure arrays on the chosen backend's device."""
    pattern = check_pattern(pattern)
    data, indices, indptr, shape = _square_csr(A)
    n = shape[0]
    # device=None: a small graph is reordered on the host (the same permutation, no kernel compile)
    gpu = use_gpu(device) and not (device is None and indices.shape[0] <= options()["reorder_host_max"])
    if gpu:
        import cupy as xp
    else:
        xp = np
    convert = xp.asarray if gpu else to_host
    indices, indptr = convert(indices), convert(indptr)
    edge_row = edge_rows(indptr, indices.shape[0])
    if gpu:
        return pattern, _KernelBackend(xp, indices, edge_row, n, pattern)
    return pattern, _RefBackend(to_host(indices), to_host(edge_row), n, pattern)


def _report(st, n, pattern, initial=None, iterations=0, time_s=0.0, **window):
    extra = dict(window)
    if initial is not None:
        extra.update(initial_pscore=initial.pscore, initial_mbscore=initial.mbscore)
    return NMReport(
        pattern, n, st.pscore, st.mbscore, st.n_vectors, st.n_meta_blocks,
        iterations=iterations, time_s=time_s, **extra,
    )  # fmt: skip


#: Window stage: a row "forces padding" when its entries x M exceed alpha x N x its window's columns.  Each
#: (alpha, hubs per window) gives a candidate order; the one whose grouping pads least wins, among those that
#: split no more windows into several SpMM units, nor make the longest unit much longer, than the two stages'
#: order (which is a candidate too).
_STACK_ALPHAS = (1.0, 0.75, 0.5, 0.35)
#: Hubs per 16-row window: 2 fill each other's groups when their columns differ; more when they share columns.
_STACK_HUBS_PER_WINDOW = (2, 4, 16)
#: A candidate's longest unit may be this fraction (1 / slack) longer than the two stages' order's.
_STACK_LONGEST_SLACK = 8
#: Stacking rounds per candidate: moving rows changes the windows, so rows that force padding are found again.
_STACK_ROUNDS = 4


def _entries(xp, indices, edge_row, n):
    """Distinct ``(rows, cols)`` of the pattern (int64), row-major."""
    key = xp.unique(edge_row.astype(np.int64) * max(n, 1) + indices.astype(np.int64))
    return key // max(n, 1), key % max(n, 1)


def _window_excess(xp, rows, cols, inv, deg_new, n, window, pattern):
    """``(columns per window, slots the grouping's lower bound adds to them)`` in the order ``inv`` (old -> new)."""
    nn, mm = pattern
    n_win = -(-n // window)
    key = xp.unique((inv[rows] // window) * max(n, 1) + cols)  # distinct (window, column): relabelling keeps them
    C = xp.bincount(key // max(n, 1), minlength=n_win)[:n_win]
    dmax = xp.zeros(n_win * window, np.int64)
    dmax[:n] = deg_new
    dmax = dmax.reshape(n_win, window).max(axis=1)
    bound = mm * xp.maximum(-(-C // mm), -(-dmax // nn))
    return C, int((bound - C).sum())  # synchronize!


def window_grouping(xp, rows, cols, inv, n, layout, unit_blocks):
    """``(padding slots, stored slots, windows of more than unit_blocks blocks, blocks of the longest window)`` of
    ``layout``'s N:M grouping of the pattern renumbered by ``inv``.

    Host arrays: the reference grouping (:func:`tcgnn_py.tiles.nm_groups`); device arrays: the grouping
    kernel, which gives the same slots.
    """
    r, c = to_host(inv[rows]), to_host(inv[cols])  # synchronize!
    if xp is np:
        g = tiles.nm_groups(r, c, (n, n), layout.window, layout.pattern)
        slot_ptr, pad, slots = g["slot_ptr"], g["padding"], g["slots"]
    else:
        slot_ptr, slot_cols = tiles.group_slots(r, c, (n, n), layout.window, layout.pattern, xp)
        pad, slots = int((slot_cols < 0).sum()), int(slot_cols.shape[0])  # synchronize!
    blocks = -(-xp.diff(slot_ptr) // layout.block)
    longest = int(blocks.max()) if blocks.shape[0] else 0  # synchronize! (CuPy's max takes no initial=)
    return pad, slots, int((blocks > unit_blocks).sum()), longest  # synchronize!


def _stacked_order(xp, hub, deg, n, window, k):
    """The new order (current positions): hubs (densest first) ``k`` to a window with ``window - k`` other rows
    each, while both last; then the rest in their order.  Integer sort keys, no ties: every backend agrees."""
    pos = xp.arange(n, dtype=np.int64)
    big = int(deg.max()) + 1 if n else 1  # synchronize!
    h = pos[hub][xp.argsort((big - deg[hub]) * n + pos[hub])]
    rest = pos[~hub]
    i = xp.arange(h.shape[0], dtype=np.int64)
    j = xp.arange(rest.shape[0], dtype=np.int64)
    n_hub_windows = -(-h.shape[0] // k)
    key_h = (i // k) * window + i % k
    if k < window:
        fill = window - k
        key_r = xp.where(j < fill * n_hub_windows, (j // fill) * window + k + j % fill, n_hub_windows * window + j)
    else:
        key_r = n_hub_windows * window + j
    return xp.concatenate((h, rest))[xp.argsort(xp.concatenate((key_h, key_r)))]


def _stack_candidates(xp, rows, cols, deg, perm, n, layout):
    """Orders that move the rows forcing padding in their window into windows shared with other such rows.

    A row of ``d`` entries needs ``d / N`` groups of its window however the window's columns are ordered, so a
    hub whose window mates bring few other columns leaves slots empty; sharing a window with other hubs (whose
    columns differ) fills its groups.  Per alpha of :data:`_STACK_ALPHAS` and hubs per window of
    :data:`_STACK_HUBS_PER_WINDOW`, up to :data:`_STACK_ROUNDS` rounds, each kept while the grouping's lower
    bound falls.
    """
    window, (nn, mm) = layout.window, layout.pattern
    pos = xp.arange(n, dtype=np.int64)
    inv = xp.empty(n, np.int64)
    inv[perm] = pos
    C0, best0 = _window_excess(xp, rows, cols, inv, deg[perm], n, window, (nn, mm))  # every candidate starts here
    out = []
    for k in _STACK_HUBS_PER_WINDOW:
        for alpha in _STACK_ALPHAS:
            p, C, best = perm, C0, best0
            for _ in range(_STACK_ROUNDS):
                d = deg[p]
                hub = d * mm > alpha * nn * C[pos // window]
                q = p[_stacked_order(xp, hub, d, n, window, min(k, window))]
                inv_q = xp.empty(n, np.int64)
                inv_q[q] = pos
                C_q, excess = _window_excess(xp, rows, cols, inv_q, deg[q], n, window, (nn, mm))
                if excess >= best:
                    break
                p, C, best = q, C_q, excess
            out.append(p)
    return out


def _stack_hubs(xp, indices, edge_row, n, perm, layout):
    """The window stage: ``(perm, vertices renumbered, padding shares of the input, of perm, of the result)``.

    A candidate may not make more windows longer than one SpMM unit (:data:`NM_BLOCKS_PER_UNIT` blocks)
    than ``perm`` has, nor its longest unit more than 1 / :data:`_STACK_LONGEST_SLACK` longer: split windows
    are summed by a second launch, and the longest unit is the critical path of small grids (without these
    rules, stacking 16 hubs per window made pubmed's 2:4 SpMM 1.3x slower for 1.5 points less padding, and a
    longest window of 27 blocks instead of 21 made cora's 1.2x slower).
    """
    unit = NM_BLOCKS_PER_UNIT
    rows, cols = _entries(xp, indices, edge_row, n)
    deg = xp.bincount(rows, minlength=n)[:n].astype(np.int64)
    perm = xp.asarray(perm).astype(np.int64)
    pos = xp.arange(n, dtype=np.int64)

    def grouping(p):
        inv = xp.empty(n, np.int64)
        inv[p] = pos
        pad, slots, long_windows, longest = window_grouping(xp, rows, cols, inv, n, layout, unit)
        return pad / max(slots, 1), (long_windows, min(longest, unit))

    initial, _ = grouping(pos)
    best, (long_base, unit_base) = grouping(perm)
    best_p, reorder_padding = perm, best
    seen = [to_host(perm)]  # synchronize!
    for p in _stack_candidates(xp, rows, cols, deg, perm, n, layout):
        hp = to_host(p)  # synchronize!
        if any(np.array_equal(hp, q) for q in seen):
            continue
        seen.append(hp)
        f, (long_windows, longest_unit) = grouping(p)
        if f < best and long_windows <= long_base and longest_unit <= unit_base + unit_base // _STACK_LONGEST_SLACK:
            best_p, best = p, f
    moved = int((to_host(best_p) != seen[0]).sum())  # synchronize!
    return best_p, moved, initial, reorder_padding, best


def nm_report(A, pattern="2:4", perm=None, *, device=None):
    """Violations of an ``N:M`` / ``V:N:M`` pattern in a square sparse matrix.

    With ``perm`` (a :class:`Permutation` or array), the report is for
    ``perm.apply(A)`` and its ``initial_*`` fields and ``improvement_rate``
    compare it with A.

    Examples
    --------
    >>> import tcgnn_py as tg
    >>> r = tg.nm_report(tg.load_cora().adj, "2:4", device="cpu")
    >>> r.pscore, r.conforming
    (102, False)
    """
    pattern, backend = _prepare(A, pattern, device)
    st0 = backend.evaluate(backend.identity())
    if perm is None:
        return _report(st0, backend.n, pattern)
    p = perm.perm if isinstance(perm, Permutation) else Permutation(perm).perm
    if p.shape[0] != backend.n:
        raise ValueError(f"perm has {p.shape[0]} entries for {backend.n} vertices")
    st = backend.evaluate(backend.device(p))
    return _report(st, backend.n, pattern, initial=st0)


def _logger(verbose, t0):
    log = loc.progress_logger(verbose, t0)
    return lambda it, st, best: log(
        lambda: f"reorder: iteration {it}: PScore {st.pscore} (best {best.pscore}), "
        f"MBScore {st.mbscore} (best {best.mbscore})"
    )


#: ``reorder``'s method names besides N:M patterns.
LOCALITY = "locality"


def reorder(
    A, pattern="2:4", *, layout=None, max_iter=1000, stage_iter=10, patience=8, max_levels=64,
    time_budget=None, verbose=None, device=None,
):  # fmt: skip
    """Renumber a graph's vertices: for an N:M / V:N:M pattern, or for locality.

    **N:M patterns** (``"2:4"``, ``"V:N:M"``, ...): the two-stage algorithm of
    "N:M sparsity-oriented graph reordering" (PPoPP'25): stage 1 sorts rows by
    their Hamming-distance position codes (applied to rows and columns alike)
    while MBScore improves; stage 2 swaps vertex pairs between the worst
    segments greedily; the two alternate until no violation remains,
    ``patience`` iterations bring no improvement, or ``max_iter``.

    **"locality"**: an order whose row windows share columns, so tensor-core
    tiles hold more entries and SpMM gathers fewer X rows: a hierarchy of
    matchings (each level merges mutually best-linked clusters, then contracts
    the graph; depth-first order of the cluster tree), degree order, degree
    bands ordered by the hierarchy inside each band, and the input order are
    measured, and the one with the fewest distinct (window, column) pairs for
    ``layout`` wins (see :func:`locality_report`).  A directed
    graph is ordered by its undirected version (``A + A^T``); the matrix and its
    values are not changed, only renumbered.

    Both searches are deterministic: the GPU (Numba kernels) and the NumPy
    reference return the same permutation.

    Parameters
    ----------
    A : sparse square matrix (scipy.sparse, cupyx.scipy.sparse, or
        ``(data, indices, indptr)``); its stored entries are the pattern.
    pattern : ``"N:M"``, ``"V:N:M"``, ``(N, M)`` or ``(V, N, M)`` (default 2:4),
        or ``"locality"``.
    layout : the tiled layout to order for.  Locality: ``"vector"`` (8-row
        windows; the default, as for :class:`TiledMatrix`) or ``"tcgnn"``
        (16-row windows).  N:M: None (default; the paper's whole-matrix
        pattern), or an N:M layout, ``"2:4"`` or ``"1:2"``: after the two
        stages, a **window stage** moves the rows that force padding in
        their row window (a row of d entries needs d / N groups of M slots
        however its window's columns are ordered) into windows shared with
        other such rows, densest first, if that lowers the padding of the
        layout's grouping without splitting more windows into SpMM units or
        lengthening the longest one by more than 1/8; ``report.padding``
        says by how much.  Column order does not matter to these layouts
        (each window's columns are only a gather list), so the stage may
        raise PScore.
    max_iter, stage_iter, patience : N:M only: bounds of the outer loop, of each
        stage's inner loop, and of iterations without a new best.
    max_levels : locality only: the most coarsening levels.
    time_budget : seconds; the search stops at the first check past it and
        returns the best order found so far (None: no limit).
    verbose : True logs every iteration (level) to stderr, False never; None
        (default) logs once a second after the first two seconds.
    device : None (GPU when usable), "cuda" or "cpu" (the NumPy reference).

    Returns
    -------
    Permutation
        With ``.report``: :class:`NMReport` (initial and final scores,
        iterations, time) and ``.pattern`` for N:M; :class:`LocalityReport`
        (both layouts before and after, the candidates' ``U / nnz``, the
        chosen one, levels, time) for ``"locality"``.

    Examples
    --------
    >>> import tcgnn_py as tg
    >>> A = tg.load_cora().adj
    >>> p = tg.reorder(A, "2:4", device="cpu")
    >>> p.report.pscore < p.report.initial_pscore
    True
    >>> B = p.apply(A)
    >>> B.nnz == A.nnz and (B != B.T).nnz == 0
    True
    >>> q = tg.reorder(A, "locality", layout="tcgnn", device="cpu")
    >>> r = q.report
    >>> r.method, round(r.initial["tcgnn"].pairs_per_nnz, 3), round(r["tcgnn"].pairs_per_nnz, 3)
    ('clusters', 0.908, 0.574)
    """
    t0 = time.perf_counter()
    if time_budget is not None and not (isinstance(time_budget, (int, float)) and time_budget >= 0):
        raise ValueError(f"time_budget must be a number of seconds >= 0 or None, got {time_budget!r}")
    if isinstance(pattern, str) and pattern == LOCALITY:
        if (max_iter, stage_iter, patience) != (1000, 10, 8):
            raise TypeError("max_iter, stage_iter and patience apply to N:M patterns, not to the 'locality' reorder")
        return _reorder_locality(A, layout, check_count("max_levels", max_levels, 0), time_budget, verbose, device, t0)
    if max_levels != 64:
        raise TypeError(f"max_levels= applies to the 'locality' reorder, not to the N:M pattern {pattern!r}")
    if layout is not None:
        layout_name, layout = layout, resolve_layout(layout)
        if layout.pattern is None:
            raise ValueError(f"an N:M reorder orders for an N:M layout ('2:4' or '1:2'), got layout={layout_name!r}")
    max_iter, stage_iter, patience = (
        check_count(name, v, 1) for name, v in (("max_iter", max_iter), ("stage_iter", stage_iter), ("patience", patience))
    )
    pattern, backend = _prepare(A, pattern, device)
    deadline = None if time_budget is None else t0 + time_budget
    initial, best, it = _run(backend, max_iter, stage_iter, patience, _logger(verbose, t0), deadline)
    window = {}
    if layout is not None:
        xp = getattr(backend, "xp", np)
        p, moved, *shares = _stack_hubs(xp, backend.indices, backend.edge_row, backend.n, best.perm, layout)
        if moved:
            best = backend.evaluate(p.astype(best.perm.dtype))
        window = dict(zip(("initial_padding", "reorder_padding", "padding"), shares), renumbered=moved,
                      layout=_layout_name(layout))
    perm = backend.host(best.perm)
    rep = _report(best, backend.n, pattern, initial, it, time.perf_counter() - t0, **window)
    return Permutation(perm, pattern=pattern, report=rep)


def _layout_name(layout):
    return next(name for name, lay in LAYOUTS.items() if lay == layout)


def _structure(A, device, square=True):
    """``(xp, indices, indptr, shape, gpu)``: validated structure arrays on the chosen backend's device."""
    if square:
        _, indices, indptr, shape = _square_csr(A)
    else:
        data, indices, indptr, shape = coerce_csr(A)
        _, indices, indptr = check_csr_arrays(data, indices, indptr, shape)
        indices, indptr = distinct_entries(indices, indptr, shape[1])
    gpu = use_gpu(device) and not (device is None and indices.shape[0] <= options()["locality_host_max"])
    if gpu:
        import cupy as xp
    else:
        xp = np
    convert = xp.asarray if gpu else to_host
    return xp, convert(indices), convert(indptr), shape, gpu


def _locality_layouts(xp, indices, indptr, shape, *invs):
    """Per renumbering ``inv`` (None: A's own order): ``{layout name: LayoutLocality}``; entry rows found once."""
    rows = edge_rows(indptr, indices.shape[0]).astype(np.int64)
    cols = indices.astype(np.int64)
    return [{name: loc.locality_stats(xp, rows, cols, shape, name, inv) for name in ("tcgnn", "vector")}
            for inv in invs]


def _reorder_locality(A, layout, max_levels, time_budget, verbose, device, t0):
    xp, indices, indptr, shape, gpu = _structure(A, device)
    n = shape[0]
    perm, info = loc.locality_order(
        xp, indices, indptr, n, DEFAULT_LAYOUT if layout is None else layout, kernel=gpu, max_levels=max_levels,
        time_budget=time_budget, verbose=verbose, t0=t0,
    )  # fmt: skip
    initial, final = _locality_layouts(xp, indices, indptr, shape, None, loc.inverse(xp, perm))
    rep = loc.LocalityReport(n, int(indices.shape[0]), final, initial, time_s=time.perf_counter() - t0, **info)
    return Permutation(to_host(perm), report=rep)


def locality_report(A, perm=None, *, device=None):
    """How many columns the row windows of a sparse matrix share, per tensor-core layout.

    For each layout (``"tcgnn"``: 16-row windows, 8 column slots per tile;
    ``"vector"``: 8-row windows, 4 slots): ``U``, the distinct (window, column)
    pairs -- the X rows an SpMM gathers -- and ``U / nnz``; the tiles after
    condensing and their density; blocks per window (median, p90, p99, max).
    The same counts as ``TiledMatrix(A, layout=...).tile_stats()``, without
    building the tiles.

    With ``perm`` (a :class:`Permutation` or an array, square A), the report is
    for ``perm.apply(A)`` and ``.initial`` holds A's.

    Examples
    --------
    >>> import tcgnn_py as tg
    >>> r = tg.locality_report(tg.load_cora().adj, device="cpu")
    >>> round(r["tcgnn"].pairs_per_nnz, 3), r["tcgnn"].blocks
    (0.908, 1268)
    """
    xp, indices, indptr, shape, _ = _structure(A, device, square=perm is not None)
    if perm is None:
        (layouts,) = _locality_layouts(xp, indices, indptr, shape, None)
        return loc.LocalityReport(shape[0], int(indices.shape[0]), layouts)
    p = perm.perm if isinstance(perm, Permutation) else Permutation(perm).perm
    if p.shape[0] != shape[0]:
        raise ValueError(f"perm has {p.shape[0]} entries for {shape[0]} vertices")
    final, initial = _locality_layouts(xp, indices, indptr, shape, loc.inverse(xp, xp.asarray(p)), None)
    return loc.LocalityReport(shape[0], int(indices.shape[0]), final, initial)


def best_pattern(A, *, max_M=32, max_V=32, device=None, **kwargs):
    """The paper's pattern search: the sparsest ``V:2:M`` the reorder reaches.

    Tries 1:2:M for M = 4, 8, 16, ... up to ``max_M`` while the reordered graph
    conforms, then, with that M, V:2:M for V = 2, 4, ... up to ``max_V`` while
    it conforms.  Returns the :class:`Permutation` of the last conforming
    pattern (that of 2:4 when none conforms); its ``search`` attribute lists
    every ``(pattern, report)`` tried.
    """
    max_M, max_V = check_count("max_M", max_M, 4), check_count("max_V", max_V, 1)
    tried = []

    def attempt(V, M):
        p = reorder(A, (V, 2, M), device=device, **kwargs)
        tried.append((p.pattern, p.report))
        return p

    best = attempt(1, 4)
    M = 8
    while best.report.conforming and M <= max_M:
        p = attempt(1, M)
        if not p.report.conforming:
            break
        best, M = p, M * 2
    if best.report.conforming:
        V = 2
        while V <= max_V:
            p = attempt(V, best.pattern.M)
            if not p.report.conforming:
                break
            best, V = p, V * 2
    best.search = tried
    return best
