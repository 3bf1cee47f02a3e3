"""Layer 1: Numba CUDA kernels of the N:M sparsity-oriented reorder (PPoPP'25).

The terms and the exact semantics are those of :mod:`tcgnn_py.orders._nm_reference`,
which these kernels must reproduce bit for bit:

* :func:`pack_bits` -- OR of M-bit words per id (segment vectors from their
  entries, meta-blocks from their vectors), one atomic per id and warp:
  ``match_any`` groups the lanes of one id, ``ballot`` collects each bit.
* :func:`vector_codes` -- per segment vector: ``popc``, the Gray-code rank,
  stage 1's sort key, violation flags, per-segment PScore and nonzeros.
* :func:`count_meta_violations` -- MBScore with ``ballot`` + ``popc``
  (one atomic per warp).
* :func:`gains_batch` -- the M x M swap gains of the segment pairs stage 2
  will most likely try, one warp per pair, all in parallel;
* :func:`stage2_round` -- stage 2's greedy round (Algorithm 3), one warp:
  lanes own the M x M candidate swaps, boundary rows are fetched 32 at a time
  and broadcast with ``shfl``, ``freshtop`` is a ``shfl_xor`` argmax, used
  vertices come from a ``ballot``.  The round is sequential by nature (each
  pick depends on the previous ones); the warp makes each pick cheap.
"""

import numpy as np
from numba import cuda, int32

from .warp import FULL_MASK, lower_bound
#: freshtop's "no fresh pair" key; real keys are gain * 2048 + (2047 - pair).
NONE = -(1 << 62)

__all__ = ["pack_bits", "vector_codes", "count_meta_violations", "gains_batch", "stage2_round", "KERNELS", "NONE"]


@cuda.jit(cache=True)
def pack_bits(ids, bits, width, out):
    """``out[ids[e]] |= bits[e]`` for every ``e`` (``out`` zeroed, ``bits`` < 2**width)."""
    e = cuda.grid(1)
    lane = cuda.laneid
    valid = e < ids.shape[0]
    key = np.int64(-1)
    mine = np.int64(0)
    if valid:
        key = np.int64(ids[e])
        mine = np.int64(bits[e])
    peers = np.int64(cuda.match_any_sync(FULL_MASK, key)) & 0xFFFFFFFF
    acc = np.int64(0)
    for t in range(width):
        vote = np.int64(cuda.ballot_sync(FULL_MASK, (mine >> t) & 1)) & 0xFFFFFFFF
        if vote & peers:
            acc |= np.int64(1) << t
    # the lowest lane of each id writes once for the warp
    if valid and (peers & ((np.int64(1) << lane) - 1)) == 0:
        cuda.atomic.or_(out, key, np.uint32(acc))


@cuda.jit(cache=True)
def vector_codes(vseg, bits, n_seg, N, M, K, tokens, flags, seg_pscore, seg_nnz):
    """Per segment vector: sort key, flags, and per-segment sums.

    ``flags`` bit 0: violates N:M (more than N nonzeros); bit 1: one that
    stage 2's gains look at (N or more nonzeros); bit 2: more than K
    nonzeros (a 1-row meta-block breaking the vertical limit).
    """
    i = cuda.grid(1)
    if i >= bits.shape[0]:
        return
    g = np.int64(bits[i])
    p = cuda.popc(np.uint32(g))
    r = g
    r ^= r >> 1
    r ^= r >> 2
    r ^= r >> 4
    r ^= r >> 8
    r ^= r >> 16
    s = np.int64(vseg[i])
    f = 0
    if p > N:
        f = 1
        tokens[i] = np.uint64((s << M) | (((np.int64(1) << M) - 1) - r))
        cuda.atomic.add(seg_pscore, s, 1)
    else:
        tokens[i] = np.uint64(((n_seg - 1 - s) << M) | r) | (np.uint64(1) << np.uint64(63))
    if p >= N:
        f |= 2
    if p > K:
        f |= 4
    flags[i] = f
    cuda.atomic.add(seg_nnz, s, p)


@cuda.jit(cache=True)
def count_meta_violations(mbits, hviol, K, count):
    """``count[0] += #{i: popc(mbits[i]) > K or hviol[i]}``."""
    i = cuda.grid(1)
    bad = False
    if i < mbits.shape[0]:
        bad = cuda.popc(mbits[i]) > K or hviol[i] != 0
    vote = cuda.ballot_sync(FULL_MASK, bad)
    if cuda.laneid == 0 and vote != 0:
        cuda.atomic.add(count, 0, cuda.popc(vote))


@cuda.jit(device=True, inline=True)
def _bits_at(vec_ptr, vec_seg, vec_bits, r, s):
    """Row ``r``'s vector in segment ``s`` (0 when empty): binary search."""
    end = vec_ptr[r + 1]
    lo = lower_bound(vec_seg, vec_ptr[r], end, s)
    if lo < end and vec_seg[lo] == s:
        return np.int64(vec_bits[lo])
    return np.int64(0)


@cuda.jit(device=True)
def _pair_gains(a, b, N, M, seg_ptr, seg_row, seg_bits, vec_ptr, vec_seg, vec_bits, gp, gt, gx):
    """Gains of all M x M swaps between segments a and b (reference: pair_gains).

    Lane ``l`` owns pairs ``q = l + 32 k`` (``u = q // M``, ``v = q % M``);
    ``gp``/``gt`` get segment a's and b's PScore reductions, ``gx`` the excess
    reduction.  Only rows with N or more nonzeros in a segment change these:
    each side walks such rows of its segment, 32 at a time (each lane finds
    the row's vector in the other segment), and broadcasts them.
    """
    lane = cuda.laneid
    MM = M * M
    for k in range(32):
        gp[k] = 0
        gt[k] = 0
        gx[k] = 0
    for side in range(2):
        own_s = a if side == 0 else b
        oth_s = b if side == 0 else a
        lo = seg_ptr[own_s]
        hi = seg_ptr[own_s + 1]
        for base in range(lo, hi, 32):
            idx = base + lane
            own = np.int64(0)
            oth = np.int64(0)
            if idx < hi:
                own = np.int64(seg_bits[idx])
                oth = _bits_at(vec_ptr, vec_seg, vec_bits, seg_row[idx], oth_s)
            cnt = min(32, hi - base)
            for t in range(cnt):
                o = cuda.shfl_sync(FULL_MASK, own, t)
                w = cuda.shfl_sync(FULL_MASK, oth, t)
                p = cuda.popc(np.uint32(o))
                up = 1 if p == N + 1 else 0
                dn = 1 if p == N else 0
                lose = 1 if p > N else 0
                q = lane
                k = 0
                while q < MM:
                    u = q // M
                    v = q - u * M
                    if side == 0:  # o is a's vector, w is b's
                        x = (o >> (M - 1 - u)) & 1
                        y = (w >> (M - 1 - v)) & 1
                        out_, in_ = x * (1 - y), (1 - x) * y
                        gp[k] += up * out_ - dn * in_
                    else:  # o is b's vector, w is a's
                        y = (o >> (M - 1 - v)) & 1
                        x = (w >> (M - 1 - u)) & 1
                        out_, in_ = y * (1 - x), (1 - y) * x
                        gt[k] += up * out_ - dn * in_
                    gx[k] += lose * out_ - in_
                    q += 32
                    k += 1


@cuda.jit(device=True)
def _used_mask(s, M, used):
    lane = cuda.laneid
    return np.int64(cuda.ballot_sync(FULL_MASK, lane < M and used[s * M + lane] != 0)) & 0xFFFFFFFF


@cuda.jit(device=True)
def _warp_max(v):
    off = 16
    while off > 0:
        other = cuda.shfl_sync(FULL_MASK, v, cuda.laneid ^ off)
        if other > v:
            v = other
        off >>= 1
    return v


@cuda.jit(device=True)
def _freshtop(a, b, M, used, gp, gt, gx):
    """Warp-uniform ``(gain, excess * 2048 + 2047 - q)`` of the best fresh swap.

    Lexicographic: PScore gain, then excess reduction, then smallest pair
    ``q``; ``(NONE, NONE)`` when every pair has a used vertex.
    """
    lane = cuda.laneid
    ua = _used_mask(a, M, used)
    ub = _used_mask(b, M, used)
    bt = np.int64(NONE)
    bk = np.int64(NONE)
    q = lane
    k = 0
    while q < M * M:
        u = q // M
        v = q - u * M
        if ((ua >> u) & 1) == 0 and ((ub >> v) & 1) == 0:
            t = np.int64(gp[k] + gt[k])
            key = np.int64(gx[k]) * 2048 + (2047 - q)
            if t > bt or (t == bt and key > bk):
                bt = t
                bk = key
        q += 32
        k += 1
    tm = _warp_max(bt)
    return tm, _warp_max(bk if bt == tm else np.int64(NONE))


@cuda.jit(device=True)
def _lane0_sub(ps, s, delta):
    """``ps[s] -= delta`` by lane 0; every lane gets the new value."""
    new = 0
    if cuda.laneid == 0:
        new = ps[s] - delta
        ps[s] = new
    return cuda.shfl_sync(FULL_MASK, new, 0)


@cuda.jit(cache=True)
def gains_batch(I, W, seg_ptr, seg_row, seg_bits, vec_ptr, vec_seg, vec_bits, N, M, pre):
    """Gains of the pairs ``(I[i], I[i + 1 + w])``, ``w < W``, one warp each.

    Stage 2's primary ``I[i]`` tries the next alive entries of ``I`` first;
    gains do not change within a round, so they are computed here in parallel
    and :func:`stage2_round` only reads them.  ``pre[i * W + w, c, q]``: c = 0,
    1, 2 for the PScore gains of a and b and the excess gain of pair q.
    """
    gp = cuda.local.array(32, int32)
    gt = cuda.local.array(32, int32)
    gx = cuda.local.array(32, int32)
    wid = cuda.grid(1) // 32
    i = wid // W
    j = i + 1 + wid % W
    if i >= I.shape[0] or j >= I.shape[0]:  # warp-uniform exit
        return
    _pair_gains(I[i], I[j], N, M, seg_ptr, seg_row, seg_bits, vec_ptr, vec_seg, vec_bits, gp, gt, gx)
    q = cuda.laneid
    k = 0
    while q < M * M:
        pre[wid, 0, q] = gp[k]
        pre[wid, 1, q] = gt[k]
        pre[wid, 2, q] = gx[k]
        q += 32
        k += 1


@cuda.jit(device=True)
def _try_swap(a, b, N, M, tabs, used, swaps, nsw, gp, gt, gx, pre, slot):
    """Best fresh swap between a and b, made if beneficial (reference: _beneficial).

    Gains come from ``pre[slot]`` when ``slot >= 0``, else are computed here.
    Returns ``(made, a's PScore gain, b's PScore gain)``; the pair goes to
    ``swaps[nsw]`` and both positions are marked used.
    """
    seg_ptr, seg_row, seg_bits, vec_ptr, vec_seg, vec_bits = tabs
    if slot >= 0:
        q = cuda.laneid
        k = 0
        while q < M * M:
            gp[k] = pre[slot, 0, q]
            gt[k] = pre[slot, 1, q]
            gx[k] = pre[slot, 2, q]
            q += 32
            k += 1
    else:
        _pair_gains(a, b, N, M, seg_ptr, seg_row, seg_bits, vec_ptr, vec_seg, vec_bits, gp, gt, gx)
    t, key = _freshtop(a, b, M, used, gp, gt, gx)
    if key == NONE or t < 0 or (t == 0 and (key >> 11) <= 0):
        return False, np.int64(0), np.int64(0)
    q = 2047 - (key & 2047)
    gpq = cuda.shfl_sync(FULL_MASK, gp[q >> 5], q & 31)
    gtq = cuda.shfl_sync(FULL_MASK, gt[q >> 5], q & 31)
    u = q // M
    v = q - u * M
    swaps[nsw, 0] = a * M + u
    swaps[nsw, 1] = b * M + v
    used[a * M + u] = 1
    used[b * M + v] = 1
    return True, np.int64(gpq), np.int64(gtq)


@cuda.jit(cache=True)
def stage2_round(
    I, spare, ps, seg_ptr, seg_row, seg_bits, vec_ptr, vec_seg, vec_bits,
    N, M, used, dead, pre, W, swaps, n_swaps,
):  # fmt: skip
    """One round of stage 2 (reference: ``stage2_swaps``), launched as one warp.

    ``I``: unhealthy segments by decreasing PScore; ``spare``: healthy ones,
    sparsest first; ``pre``: :func:`gains_batch` of the first ``W`` targets of
    each primary.  ``ps`` (per-segment PScore), ``used`` (per position,
    padding set) and ``dead`` (per entry of ``I``) are updated in place;
    ``swaps[:n_swaps[0]]`` gets the position pairs.  ``seg_*`` lists, per
    segment, the vectors with N or more nonzeros (by row); ``vec_*`` all
    vectors by (row, segment).  Warp-uniform state lives in registers; memory
    is written identically by every lane, or by lane 0 and broadcast.
    """
    gp = cuda.local.array(32, int32)
    gt = cuda.local.array(32, int32)
    gx = cuda.local.array(32, int32)
    tabs = (seg_ptr, seg_row, seg_bits, vec_ptr, vec_seg, vec_bits)
    L = I.shape[0]
    full = (np.int64(1) << M) - 1
    nsw = 0
    nxt = 0
    head = 0
    while True:
        while head < L and dead[head] != 0:
            head += 1
        if head >= L:
            break
        a = I[head]
        ia = head
        head += 1
        ps_a = cuda.shfl_sync(FULL_MASK, ps[a], 0)
        tj = head
        tries = 0
        while tj < L and tries < M and ps_a > 0 and _used_mask(a, M, used) != full:
            if dead[tj] == 0:
                tries += 1
                slot = ia * W + (tj - ia - 1) if tj - ia - 1 < W else -1
                made, gpq, gtq = _try_swap(a, I[tj], N, M, tabs, used, swaps, nsw, gp, gt, gx, pre, slot)
                if made:
                    nsw += 1
                    ps_a -= gpq
                    if _lane0_sub(ps, I[tj], gtq) <= 0:
                        dead[tj] = 1
            tj += 1
        if ps_a > 0 and _used_mask(a, M, used) != full and nxt < spare.shape[0]:
            made, gpq, gtq = _try_swap(a, spare[nxt], N, M, tabs, used, swaps, nsw, gp, gt, gx, pre, -1)
            nxt += 1
            if made:
                nsw += 1
    if cuda.laneid == 0:
        n_swaps[0] = nsw


#: Every kernel with example argument types, for ``compile_ptx`` checks in CI.
KERNELS = {
    "pack_bits": (pack_bits, "(int64[::1], uint32[::1], int64, uint32[::1])"),
    "vector_codes": (
        vector_codes,
        "(int64[::1], uint32[::1], int64, int64, int64, int64, uint64[::1], int8[::1], int32[::1], int64[::1])",
    ),
    "count_meta_violations": (count_meta_violations, "(uint32[::1], int8[::1], int64, int32[::1])"),
    "stage2_round": (
        stage2_round,
        "(int32[::1], int32[::1], int32[::1], int32[::1], int32[::1], uint32[::1], int32[::1], int32[::1],"
        " uint32[::1], int64, int64, uint8[::1], int8[::1], int32[:, :, ::1], int64, int32[:, ::1], int32[::1])",
    ),
    "gains_batch": (
        gains_batch,
        "(int32[::1], int64, int32[::1], int32[::1], uint32[::1], int32[::1], int32[::1], uint32[::1], int64, int64,"
        " int32[:, :, ::1])",
    ),
}
