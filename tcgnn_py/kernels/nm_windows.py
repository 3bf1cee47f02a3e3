"""Layer 1: Numba CUDA kernel of the N:M window grouping, one warp per row window.

It reproduces :func:`tcgnn_py.tiles._nm_windows.group_columns` slot for slot.  Lane
``l`` of the warp holds open group ``l``: its opening number, its columns
(at most M <= 4, a local array) and its row levels (``lv0``: rows holding an
entry, ``lv1``: rows holding two).  For each column of the window, in order:

* every lane tests whether the column fits its group (``mask & lv[N-1] == 0``);
* a ``shfl_xor`` min-reduction over the fitting lanes' opening numbers picks
  the oldest fitting group, as the reference's first fit over its open list;
* none fits: the oldest group is closed first when all 32 lanes hold one, and
  the lowest free lane (another min-reduction) opens a new group;
* a group that reaches M columns is written out and its lane freed.

Closed groups are written in closing order and the groups still open at the
end in opening order, each padded to M slots with -1.  The same kernel runs
twice: ``write = 0`` counts each window's slots, ``write = 1`` writes them at
``slot_ptr[w]`` (the scan of the counts); the grouping is deterministic.
"""

import numpy as np
from numba import cuda, int64

from .warp import FULL_MASK

__all__ = ["group_windows", "KERNELS", "MAX_M"]

#: Group sizes the kernel keeps in registers (2:4 and 1:2 need 4 and 2).
MAX_M = 4
_BIG = 1 << 30


@cuda.jit(device=True, inline=True)
def _warp_min(x):
    for off in (16, 8, 4, 2, 1):
        y = cuda.shfl_xor_sync(FULL_MASK, x, off)
        if y < x:
            x = y
    return x


@cuda.jit(device=True, inline=True)
def _write_group(slots, ns, M, columns, out, pos):
    for s in range(M):
        out[pos + s] = columns[slots[s]] if s < ns else -1


@cuda.jit(cache=True)
def group_windows(win_ptr, columns, masks, N, M, write, slot_ptr, counts, slot_cols):
    """Group every window's columns into M-slot groups of <= N entries per row (see the module docstring).

    ``win_ptr``/``columns``/``masks``: :func:`tcgnn_py.tiles._nm_windows.window_columns`.  ``write = 0``: ``counts[w]``
    gets window ``w``'s slot count; ``write = 1``: its slots go to ``slot_cols[slot_ptr[w]:]``.
    Blocks of a multiple of 32 threads; one warp per window.
    """
    w = cuda.grid(1) // 32
    lane = cuda.laneid
    if w >= win_ptr.shape[0] - 1:
        return  # the whole warp: w is the same for its lanes
    a = win_ptr[w]
    b = win_ptr[w + 1]
    slots = cuda.local.array(MAX_M, int64)
    valid = False
    seq = _BIG
    ns = 0
    lv0 = np.int64(0)
    lv1 = np.int64(0)
    pos = np.int64(slot_ptr[w]) if write else np.int64(0)  # warp-uniform from here on
    n_open = 0
    next_seq = 0
    for j in range(a, b):
        c = np.int64(masks[j])
        top = lv1 if N == 2 else lv0
        key = seq if valid and (c & top) == 0 else _BIG
        k = _warp_min(key)
        if k == _BIG:  # warp-uniform: no open group fits
            if n_open == 32:  # close the oldest first
                oldest = _warp_min(seq)
                if seq == oldest:
                    if write:
                        _write_group(slots, ns, M, columns, slot_cols, pos)
                    valid = False
                    seq = _BIG
                pos += M
                n_open -= 1
            free = _warp_min(_BIG if valid else lane)
            if lane == free:
                valid = True
                seq = next_seq
                ns = 0
                lv0 = np.int64(0)
                lv1 = np.int64(0)
            k = next_seq
            next_seq += 1
            n_open += 1
        mine = valid and seq == k
        if mine:
            lv1 |= lv0 & c
            lv0 |= c
            slots[ns] = j
            ns += 1
        full = cuda.ballot_sync(FULL_MASK, mine and ns == M) != 0
        if full:  # warp-uniform
            if mine:
                if write:
                    _write_group(slots, ns, M, columns, slot_cols, pos)
                valid = False
                seq = _BIG
            pos += M
            n_open -= 1
    # The groups still open, in opening order: a lane's rank is the number of open groups opened before its own.
    rank = 0
    for t in range(32):
        other = cuda.shfl_sync(FULL_MASK, seq, t)
        if other < seq:
            rank += 1
    if write and valid:
        _write_group(slots, ns, M, columns, slot_cols, pos + rank * M)
    if not write and lane == 0:
        counts[w] = pos + n_open * M


KERNELS = {
    "group_windows": (
        group_windows,
        "(int64[::1], int64[::1], uint32[::1], int64, int64, int64, int64[::1], int64[::1], int64[::1])",
    ),
}
