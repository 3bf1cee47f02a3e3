"""Layer 0: NumPy reference of the N:M sparsity-oriented reorder (PPoPP'25).

The test oracle of the Numba kernels in :mod:`tcgnn_py.kernels.reorder` and the
no-GPU fallback.  Every function is exact integer arithmetic with fixed
tie-breaks, so the GPU path must produce the same permutation.

Terms (the paper's Figure 2), for an ``n x n`` adjacency pattern, a pattern
``V:N:M`` and the vertical limit ``K = 4``:

* *segment* ``s``: columns ``s*M : (s+1)*M`` (the last one is padded with
  empty columns); ``n_seg = ceil(n / M)``;
* *segment vector* ``(i, s)``: row ``i`` inside segment ``s``, an M-bit string,
  column ``s*M`` first, i.e. stored as the integer whose most significant of M
  bits is that column (the paper's Listing 1);
* it *violates N:M* when it holds more than N nonzeros; **PScore** counts such
  vectors (per segment, or in total);
* *meta-block* ``(b, s)``: rows ``b*V : (b+1)*V`` of segment ``s``; it violates
  ``V:N:M`` when more than K of its columns hold nonzeros (vertical) or one of
  its vectors violates N:M (horizontal); **MBScore** counts them.

Only nonzero vectors and meta-blocks are stored: memory is O(nnz).  A matrix
is given as the stored entries' ``(edge_row, indices)`` plus the current vertex
order ``perm`` (``perm[new] = old``); ``inv`` is its inverse.  Stored entries
are the pattern: explicit zeros count, duplicates merge.
"""

import numpy as np

from .._device import array_module

__all__ = [
    "K_VERTICAL",
    "END",
    "gray_rank",
    "segment_vectors",
    "vector_tokens",
    "scores",
    "stage1_order",
    "pair_gains",
    "segment_index",
    "freshtop",
    "stage2_swaps",
    "apply_swaps",
    "permute_csr",
]

#: At most this many columns of a meta-block may hold nonzeros (the SPTC's k).
K_VERTICAL = 4

#: Stage-1 sort key of "no more nonzero segments in this row" (see vector_tokens).
END = np.uint64(1 << 62)
_POS = np.uint64(2 << 62)


def n_segments(n, M):
    return -(-n // M)


def gray_rank(g):
    """Rank of each M-bit string ``g`` in the reflected Gray (Hamming-distance) order.

    The Gray code of rank ``r`` is ``r ^ (r >> 1)``; its inverse is the prefix
    XOR of ``g`` from the top bit.  The paper's example: ``0b11`` has rank 2 in
    ``{00, 01, 11, 10}``.

    >>> gray_rank(np.array([0, 1, 3, 2], np.uint32)).tolist()
    [0, 1, 2, 3]
    """
    r = np.asarray(g).astype(np.uint32, copy=True)
    for shift in (1, 2, 4, 8, 16):
        r ^= r >> np.uint32(shift)
    return r


def segment_vectors(indices, edge_row, inv, n, M):
    """Nonzero segment vectors of the reordered pattern, sorted by (row, segment).

    Returns ``(vrow, vseg, bits)``: int64, int64 and uint32 arrays.
    """
    S = n_segments(n, M)
    r = inv[edge_row].astype(np.int64)
    c = inv[indices].astype(np.int64)
    key = r * S + c // M
    bit = np.left_shift(np.uint32(1), (M - 1 - c % M).astype(np.uint32))
    order = np.argsort(key, kind="stable")
    key, bit = key[order], bit[order]
    if key.size == 0:
        return key, key, bit
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    bits = np.bitwise_or.reduceat(bit, starts)
    ukey = key[starts]
    return ukey // S, ukey % S, bits


def vector_tokens(vseg, bits, n_seg, pattern):
    """Stage-1 sort keys: one uint64 per nonzero segment vector.

    Stage 1 sorts rows by their dense vectors of Hamming position codes (the
    Gray rank, negated when the vector violates N:M, 0 for an empty vector),
    compared numerically from segment 0.  Comparing two such vectors only at
    their nonzero entries gives the same order when each nonzero ``(s, code)``
    becomes one key and every row ends with :data:`END`:

    * ``code < 0`` -> ``(s << M) | (2**M - 1 - |code|)``: below END, earlier
      segments and more negative codes first;
    * ``code > 0`` -> ``2**63 | ((n_seg - 1 - s) << M) | code``: above END,
      *later* segments first (a row with a positive code at ``s`` sorts after one
      whose first difference is an empty vector there).
    """
    _, N, M = pattern
    code = gray_rank(bits).astype(np.uint64)
    s = np.asarray(vseg).astype(np.uint64)
    M64 = np.uint64(M)
    neg = (s << M64) | (np.uint64((1 << M) - 1) - code)
    pos = _POS | ((np.uint64(n_seg - 1) - s) << M64) | code
    return np.where(np.bitwise_count(bits) > N, neg, pos)


def scores(vrow, vseg, bits, n, pattern):
    """PScore and MBScore with the per-segment figures stage 2 needs.

    Returns a dict: ``pscore``, ``mbscore`` (ints), ``seg_pscore`` and
    ``seg_nnz`` (int64 per segment), ``n_vectors``, ``n_meta_blocks``.
    """
    V, N, M = pattern
    S = n_segments(n, M)
    pop = np.bitwise_count(bits)
    viol = pop > N
    if V == 1:
        mb_viol = viol | (pop > K_VERTICAL)
        n_mb = int(bits.size)
    else:
        mkey = (vrow // V) * S + vseg
        order = np.argsort(mkey, kind="stable")
        mkey = mkey[order]
        starts = np.flatnonzero(np.r_[True, mkey[1:] != mkey[:-1]]) if mkey.size else mkey
        n_mb = int(starts.size)
        if n_mb:
            mbits = np.bitwise_or.reduceat(bits[order], starts)
            hviol = np.maximum.reduceat(viol[order].astype(np.int8), starts) > 0
            mb_viol = hviol | (np.bitwise_count(mbits) > K_VERTICAL)
        else:
            mb_viol = viol
    return {
        "pscore": int(viol.sum()),
        "mbscore": int(mb_viol.sum()),
        "seg_pscore": np.bincount(vseg[viol], minlength=S).astype(np.int64),
        "seg_nnz": np.bincount(vseg, weights=pop, minlength=S).astype(np.int64),
        "n_vectors": int(bits.size),
        "n_meta_blocks": n_mb,
    }


def stage1_order(vrow, tokens, n):
    """Stage 1's row order: a stable sort of the rows by their token sequences.

    Returns ``order`` (int64): the row at position ``p`` of the new order is
    row ``order[p]`` of the current one.  Ties keep the current order.
    """
    ptr = np.searchsorted(vrow, np.arange(n + 1))
    toks = tokens.tolist()
    end = int(END)
    keys = [tuple(toks[ptr[i] : ptr[i + 1]]) + (end,) for i in range(n)]
    return np.array(sorted(range(n), key=keys.__getitem__), dtype=np.int64)


def _segment_bits(vrow, vseg, bits, s, index=None):
    if index is not None:  # (order by segment, segment pointer): O(1) slices instead of a scan
        order, ptr = index
        sel = order[ptr[s] : ptr[s + 1]]
    else:
        sel = vseg == s
    return vrow[sel], bits[sel]


def segment_index(vseg, n_seg):
    """``(order, ptr)``: vectors grouped by segment (stable), for :func:`pair_gains`'s ``index``."""
    order = np.argsort(vseg, kind="stable")
    ptr = np.searchsorted(vseg[order], np.arange(n_seg + 1))
    return order, ptr


def pair_gains(vrow, vseg, bits, a, b, pattern, index=None):
    """Gains of swapping vertex ``a*M+u`` with ``b*M+v``, for all u, v.

    Returns ``(prim, targ, excess)``: int64 ``M x M`` arrays.  ``prim`` and
    ``targ`` are the reductions of segment ``a``'s and ``b``'s PScore;
    ``excess`` is the reduction of both segments' excess nonzeros
    (``sum max(0, popcount - N)``), freshtop's tie-break.  Swapping two
    vertices swaps two columns (and two rows, which does not change any
    segment's counts): row ``i``'s vector in ``a`` loses bit u and gains row i's
    bit v of ``b``.  It stops violating when it had N+1 nonzeros and loses
    one, and starts when it had N and gains one.
    """
    _, N, M = pattern
    ra, xa_bits = _segment_bits(vrow, vseg, bits, a, index)
    rb, yb_bits = _segment_bits(vrow, vseg, bits, b, index)
    R = np.union1d(ra, rb)
    X = np.zeros(R.size, np.uint32)
    Y = np.zeros(R.size, np.uint32)
    X[np.searchsorted(R, ra)] = xa_bits
    Y[np.searchsorted(R, rb)] = yb_bits
    shifts = (M - 1 - np.arange(M)).astype(np.uint32)
    x = ((X[:, None] >> shifts) & 1).astype(np.int64)
    y = ((Y[:, None] >> shifts) & 1).astype(np.int64)
    pa = np.bitwise_count(X)[:, None]
    pb = np.bitwise_count(Y)[:, None]

    nx, ny = 1 - x, 1 - y

    def gain(lose, gain_if):
        # rows where x=1, y=0 lose one nonzero in a; rows where x=0, y=1 gain one
        return (x * lose(pa)).T @ ny - (nx * gain_if(pa)).T @ y

    def gain_b(lose, gain_if):
        return (nx * lose(pb)).T @ y - (x * gain_if(pb)).T @ ny

    prim = gain(lambda p: p == N + 1, lambda p: p == N)
    targ = gain_b(lambda p: p == N + 1, lambda p: p == N)
    excess = gain(lambda p: p > N, lambda p: p >= N) + gain_b(lambda p: p > N, lambda p: p >= N)
    return prim, targ, excess


def freshtop(total, excess, used_a, used_b):
    """The best swap ``(u, v)`` among unused vertices, or None.

    Largest PScore gain first, then the largest excess reduction, then the
    smallest ``u * M + v``.
    """
    ok = ~used_a[:, None] & ~used_b[None, :]
    if not ok.any():
        return None
    M = total.shape[1]
    cand = np.flatnonzero(ok)  # ascending u * M + v
    t, e = total.reshape(-1)[cand], excess.reshape(-1)[cand]
    best = cand[np.lexsort((-cand, e, t))[-1]]  # max gain, then max excess, then min u * M + v
    return divmod(int(best), M)


def _beneficial(total, excess, pick):
    return total[pick] > 0 or (total[pick] == 0 and excess[pick] > 0)


def stage2_swaps(vrow, vseg, bits, st, n, pattern):
    """One round of stage 2 (the paper's Algorithm 3, lines 4-21): swap pairs.

    ``st`` is :func:`scores` of the current order.  Returns a list of position
    pairs ``(p, q)``; no position occurs twice, so they apply in any order.

    Where the paper is silent or was tuned here (the GPU kernel does the same):

    * freshtop's ties go to the larger excess reduction, then the smaller
      ``u * M + v``;
    * a swap is made only when it is *beneficial*: it lowers PScore, or keeps
      it and removes an excess nonzero (the paper's footnote allows any gain;
      on Cora and email-Eu-core that left 10 % and 18 % of the violations,
      this rule none), so a segment two nonzeros over the limit is fixed in
      two steps and useless swaps do not use up vertices;
    * a primary tries at most M targets (the paper's bound on the inner loop,
      which its any-gain freshtop meets by using a vertex per target);
    * every primary that its unhealthy targets leave unhealthy gets rule
      (ii)'s treatment (the paper gives it to the last unhealthy segment):
      one beneficial swap with the next sparsest healthy segment (gains are
      not updated within a round, so more would be guesses).
    """
    _, _, M = pattern
    S = n_segments(n, M)
    ps = st["seg_pscore"].copy()
    I = [int(s) for s in np.argsort(-ps, kind="stable") if ps[s] > 0]
    used = np.zeros(S * M, bool)
    used[n:] = True  # padding columns of the last segment are no vertices
    swaps = []
    index = segment_index(vseg, S)

    def try_swap(a, b):
        """Best fresh swap between a and b, made if beneficial: (made, a's gain, b's gain)."""
        prim, targ, excess = pair_gains(vrow, vseg, bits, a, b, pattern, index)
        total = prim + targ
        pick = freshtop(total, excess, used[a * M : a * M + M], used[b * M : b * M + M])
        if pick is None or not _beneficial(total, excess, pick):
            return False, 0, 0
        swaps.append((a * M + pick[0], b * M + pick[1]))
        used[a * M + pick[0]] = used[b * M + pick[1]] = True
        return True, prim[pick], targ[pick]

    # healthy segments, sparsest first: partners of primaries the others cannot fix
    spare = [int(s) for s in np.argsort(st["seg_nnz"], kind="stable") if ps[s] == 0]
    alive = list(I)
    while alive:
        a = alive.pop(0)
        ps_a = ps[a]
        j = tries = 0
        while j < len(alive) and tries < M and ps_a > 0 and not used[a * M : a * M + M].all():
            b = alive[j]
            tries += 1
            made, gain_a, gain_b = try_swap(a, b)
            if made:
                ps_a -= gain_a
                ps[b] -= gain_b
                if ps[b] <= 0:
                    alive.pop(j)
                    continue
            j += 1
        if ps_a > 0 and not used[a * M : a * M + M].all() and spare:
            try_swap(a, spare.pop(0))  # rule (ii): the next sparsest healthy segment
    return swaps


def apply_swaps(perm, swaps):
    """``perm`` with the vertices at each position pair exchanged (a copy)."""
    perm = perm.copy()
    if len(swaps):
        p, q = np.asarray(swaps, dtype=np.int64).T
        perm[p], perm[q] = perm[q], perm[p].copy()
    return perm


def permute_csr(data, indices, indptr, perm):
    """CSR arrays of ``P A P^T`` (``B[i, j] = A[perm[i], perm[j]]``), NumPy or CuPy.

    Lossless: every stored entry (explicit zeros and duplicates included) moves
    with its value; columns are sorted within each row (stable for duplicates).
    """
    xp = array_module(indices)
    n = perm.shape[0]
    inv = xp.empty_like(perm)
    inv[perm] = xp.arange(n, dtype=perm.dtype)
    lengths = (indptr[1:] - indptr[:-1])[perm]
    new_ptr = xp.zeros(n + 1, dtype=indptr.dtype)
    xp.cumsum(lengths, out=new_ptr[1:])
    # source entry of every destination slot, row by row in the new order
    nnz = int(new_ptr[-1])  # synchronize!
    row_of_slot = xp.searchsorted(new_ptr, xp.arange(nnz), side="right") - 1
    src = indptr[perm][row_of_slot] + (xp.arange(nnz) - new_ptr[row_of_slot])
    new_cols = inv[indices[src]].astype(indices.dtype)
    key = row_of_slot.astype(np.int64) * max(n, 1) + new_cols
    order = xp.argsort(key, kind="stable") if xp is np else xp.argsort(key)
    return data[src][order], new_cols[order], new_ptr

