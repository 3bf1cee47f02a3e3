"""Layer 0: NumPy reference of the N:M window grouping for sparse tensor cores.

A sparse tensor core (``mma.sp``) takes an A operand whose every row holds at
most N nonzeros in each group of M consecutive K slots: 2:4 for float16 and
bfloat16, 1:2 for TF32.  In a condensed row window (SGT), the order of the
column slots is free -- it is only the list of X rows to gather -- so a
window's columns can be grouped so that every group conforms, with *padding
slots* (column -1: zeros, no X traffic) where conflicts cannot be grouped.
That is lossless for any graph, at any size; the PPoPP'25 reorder makes the
conflicts rare.

Grouping of one window (deterministic): its distinct columns, ascending, each
go to the first of at most ``max_open`` open groups they fit (every row of the
group stays at <= N entries); when none fits, a new group opens, and when
``max_open`` groups are open the oldest is closed first.  A group closes when
it holds M columns; closed groups with fewer, and the groups still open at
the end, are padded to M slots.  ``max_open = 32`` is one warp's lanes (the GPU
pass tests one open group per lane and takes the first fitting one by ballot).

This module is the oracle of that pass and of the ``mma.sp`` kernels'
metadata; it depends only on NumPy.
"""

import numpy as np

__all__ = ["MAX_OPEN", "window_columns", "group_columns", "nm_groups", "check_groups", "sp_dense_blocks"]

#: Open groups a window keeps while it places its columns (one warp's lanes on the GPU).
MAX_OPEN = 32


def window_columns(rows, cols, n_cols, window):
    """Distinct columns of every row window and, per column, the window rows it holds as a bit mask.

    Returns ``(win_ptr, columns, masks)``: window ``w`` holds ``columns[win_ptr[w]:win_ptr[w + 1]]``
    (ascending), and bit ``r`` of ``masks[j]`` is set when row ``r`` of that window has an entry in
    column ``columns[j]``.  ``window`` <= 32.
    """
    if not 1 <= window <= 32:
        raise ValueError(f"window must be 1..32 rows (a 32-bit row mask), got {window}")
    rows = np.asarray(rows, np.int64)
    cols = np.asarray(cols, np.int64)
    n_windows = -(-(int(rows.max()) + 1) // window) if rows.size else 0
    width = max(int(n_cols), 1)
    key = (rows // window) * width + cols
    order = np.argsort(key, kind="stable")
    key, bit = key[order], (np.uint64(1) << (rows[order] % window).astype(np.uint64))
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else np.zeros(0, np.int64)
    masks = np.bitwise_or.reduceat(bit, starts).astype(np.uint32) if key.size else np.zeros(0, np.uint32)
    ukey = key[starts]
    win_ptr = np.searchsorted(ukey // width, np.arange(n_windows + 1)).astype(np.int64)
    return win_ptr, (ukey % width).astype(np.int64), masks


def group_columns(masks, n, m, max_open=MAX_OPEN):
    """The slot order of one window: indices into ``masks`` and -1 for padding, ``m`` slots per group.

    Every group of ``m`` consecutive slots holds at most ``n`` entries of each row; every column appears once.
    """
    if not (1 <= n < m):
        raise ValueError(f"need 1 <= N < M, got {n}:{m}")
    groups = []  # closed, in closing order
    open_ = []  # [slots, levels]: levels[k] = rows holding more than k entries
    for j, c in enumerate(int(x) for x in masks):
        for g in open_:
            if not c & g[1][n - 1]:
                break
        else:
            if len(open_) == max_open:
                groups.append(open_.pop(0)[0])
            g = [[], [0] * n]
            open_.append(g)
        slots, lv = g
        for k in range(n - 1, 0, -1):
            lv[k] |= lv[k - 1] & c
        lv[0] |= c
        slots.append(j)
        if len(slots) == m:
            groups.append(slots)
            open_.remove(g)
    groups += [g[0] for g in open_]
    out = np.full(len(groups) * m, -1, np.int64)
    for i, slots in enumerate(groups):
        out[i * m: i * m + len(slots)] = slots
    return out


def nm_groups(rows, cols, shape, window=16, pattern=(2, 4), max_open=MAX_OPEN):
    """N:M grouping of every row window of a matrix given by its entries ``(rows, cols)``.

    Returns a dict: ``slot_ptr`` (window ``w`` owns slots ``slot_ptr[w]:slot_ptr[w + 1]``), ``slot_cols``
    (the column gathered by each slot, -1 for padding), ``slot_masks`` (its window-row mask, 0 for padding),
    and the counts ``slots``, ``padding`` (of which ``rounding``: each window's column count rounded up to
    M; the rest is conflicts), ``bound`` (the fewest slots any conforming grouping needs: per window, M times
    the larger of its columns / M and its densest row's entries / N, rounded up -- a row of d entries needs
    d / N groups however the columns are ordered), ``columns``, ``windows`` (non-empty) and
    ``windows_unpadded`` (non-empty windows that needed no padding beyond the rounding).
    """
    n, m = pattern
    win_ptr, columns, masks = window_columns(rows, cols, shape[1], window)
    parts, pmasks, slot_ptr = [], [], [0]
    windows = unpadded = rounding = bound = 0
    bits = np.arange(window, dtype=np.uint32)
    for w in range(win_ptr.shape[0] - 1):
        a, b = int(win_ptr[w]), int(win_ptr[w + 1])
        if a == b:
            slot_ptr.append(slot_ptr[-1])
            continue
        order = group_columns(masks[a:b], n, m, max_open)
        real = order >= 0
        sc = np.full(order.shape[0], -1, np.int64)
        sm = np.zeros(order.shape[0], np.uint32)
        sc[real], sm[real] = columns[a + order[real]], masks[a + order[real]]
        parts.append(sc)
        pmasks.append(sm)
        slot_ptr.append(slot_ptr[-1] + order.shape[0])
        windows += 1
        unpadded += order.shape[0] == -(-(b - a) // m) * m
        rounding += -(-(b - a) // m) * m - (b - a)
        # No conforming grouping has fewer groups than a row's entries / N, or than columns / M.
        densest = int(((masks[a:b, None] >> bits) & 1).sum(axis=0).max())
        bound += m * max(-(-(b - a) // m), -(-densest // n))
    slot_cols = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return {
        "slot_ptr": np.asarray(slot_ptr, np.int64),
        "slot_cols": slot_cols,
        "slot_masks": np.concatenate(pmasks) if pmasks else np.zeros(0, np.uint32),
        "slots": int(slot_cols.shape[0]),
        "padding": int((slot_cols < 0).sum()),
        "rounding": int(rounding),  # of the padding: each window's column count rounded up to M
        "bound": int(bound),  # the fewest slots any conforming grouping of these windows needs
        "columns": int(columns.shape[0]),
        "windows": windows,
        "windows_unpadded": int(unpadded),
        "pattern": (n, m),
        "window": window,
    }


def check_groups(groups, rows, cols, shape):
    """Raise ``AssertionError`` unless ``groups`` (from :func:`nm_groups`) is lossless and conforms."""
    n, m = groups["pattern"]
    window = groups["window"]
    win_ptr, columns, masks = window_columns(rows, cols, shape[1], window)
    slot_ptr, slot_cols = groups["slot_ptr"], groups["slot_cols"]
    assert slot_ptr.shape[0] == win_ptr.shape[0], "one slot range per window"
    for w in range(win_ptr.shape[0] - 1):
        a, b = int(slot_ptr[w]), int(slot_ptr[w + 1])
        assert (b - a) % m == 0, f"window {w}: {b - a} slots, not a multiple of {m}"
        got = slot_cols[a:b]
        want = columns[win_ptr[w]:win_ptr[w + 1]]
        assert np.array_equal(np.sort(got[got >= 0]), want), f"window {w}: columns lost or repeated"
        # Row masks from the entries themselves, not from the grouping's own record.
        sm = np.zeros(b - a, np.int64)
        real = got >= 0
        sm[real] = masks[win_ptr[w] + np.searchsorted(want, got[real])]
        assert np.array_equal(sm, groups["slot_masks"][a:b]), f"window {w}: slot masks disagree with the entries"
        sm = sm.reshape(-1, m)
        counts = ((sm[:, :, None] >> np.arange(window)) & 1).sum(axis=1)  # (groups, rows)
        assert counts.max(initial=0) <= n, f"window {w}: a row holds more than {n} entries in a group of {m}"


def sp_dense_blocks(comp, meta, pattern):
    """The dense ``(n_blocks, 16, 4 M)`` A operands that ``mma.sp`` reads from packed blocks.

    ``comp``: compressed values ``(n_blocks, 32 lanes, 2 registers, N)`` (floats);
    ``meta``: metadata words ``(n_blocks, 8)``.  Reads them as the instruction does
    (PTX ISA, checked on the H200; selector 0): lane ``(g, t)`` holds row ``g``
    (register 0) and ``g + 8`` (register 1) of group ``t``; metadata word ``g`` holds
    row ``g``'s groups in bits ``4t ..`` and row ``g + 8``'s from bit 16.  Raises
    ``ValueError`` on metadata ``::ordered_metadata`` forbids (2:4: positions not
    ascending; 1:2: a nibble other than ``0x4`` / ``0xE``).
    """
    n, m = pattern
    comp = np.asarray(comp, np.float64)
    meta = np.asarray(meta, np.int64)
    nb = meta.shape[0]
    out = np.zeros((nb, 16, 4 * m))
    lanes = np.arange(32)
    g, t = lanes // 4, lanes % 4
    bidx = np.arange(nb)[:, None]
    for reg in (0, 1):
        word = meta[:, g] >> (16 * reg)  # (n_blocks, 32)
        nibble = (word >> (4 * t)) & 0xF
        if (n, m) == (2, 4):
            lo, hi = nibble & 3, nibble >> 2
            if np.any(lo >= hi):
                raise ValueError("2:4 metadata positions must ascend in each group")
            cols = [4 * t + lo, 4 * t + hi]
        else:
            if np.any((nibble != 0x4) & (nibble != 0xE)):
                raise ValueError("1:2 metadata nibbles must be 0x4 or 0xE")
            cols = [2 * t + (nibble == 0xE)]
        for h in range(n):
            np.add.at(out, (bidx, g + 8 * reg, cols[h]), comp[:, :, reg, h])
    return out
