"""Padding of the N:M window grouping (issue 19) before and after the N:M reorder, with and without its window stage.

    python tools/nm_padding.py [--pattern 2:4] [--window 16] [--device cpu] GRAPH ...

For each graph: the grouping of `tcgnn_py._nm_windows` on the original order and on the order of
`tg.reorder(A, PATTERN)`; padding slots as a share of stored slots: all of it, the part due to conflicts (not to
rounding a window's column count up to M), and the part no grouping can avoid (the bound: a row of d entries in a
window needs d / N groups); and the share of windows that needed no conflict padding.  Then the order of
`tg.reorder(A, PATTERN, layout=PATTERN)` (the two stages and the window stage, which stacks the rows that force
padding into windows of their own), and the model of folding those rows into windows of row pieces.
Every grouping is checked (lossless, every group conforms) before it is counted.
"""
import argparse
import time

import numpy as np

import tcgnn_py as tg
from tcgnn_py import _nm_windows as nw
from tcgnn_py.bench import resolve_graph


def padding_row(A, pattern, window):
    A = A.tocsr()
    r, c = A.nonzero()
    g = nw.nm_groups(r, c, A.shape, window, pattern)
    nw.check_groups(g, r, c, A.shape)
    slots = max(g["slots"], 1)
    return (100 * g["padding"] / slots, 100 * (g["padding"] - g["rounding"]) / slots,
            100 * (g["bound"] - g["columns"]) / slots, 100 * g["windows_unpadded"] / max(g["windows"], 1))


def folded_row(A, pattern, window, piece=32):
    """Padding when the rows that force padding in their window move to windows of row pieces.

    A row with more than N / M of its window's columns forces padding (it needs d / N groups). Such rows are
    cut into pieces of ``piece`` entries, and the pieces, stacked as the rows of a second matrix, are grouped
    in windows of their own: each piece is an MMA row whose result the kernel would add to its row of Y.
    Returns the padding share of all stored slots, the share of the entries moved, and the pieces.
    """
    n, m = pattern
    A = A.tocsr(copy=True)  # sum_duplicates below must not reorder the caller's arrays
    A.sum_duplicates()
    r, c = A.nonzero()
    deg = np.diff(A.indptr)
    win_ptr, _, _ = nw.window_columns(r, c, A.shape[1], window)
    cols_per_window = np.diff(win_ptr)
    rows_win = np.arange(A.shape[0]) // window
    hub = deg * m > n * cols_per_window[np.minimum(rows_win, cols_per_window.shape[0] - 1)]
    keep = ~hub[r]
    g1 = nw.nm_groups(r[keep], c[keep], A.shape, window, pattern)
    hr, hc = r[~keep], c[~keep]
    if hr.size == 0:
        return 100 * g1["padding"] / max(g1["slots"], 1), 0.0, 0
    starts = np.flatnonzero(np.r_[True, hr[1:] != hr[:-1]])
    counts = np.diff(np.r_[starts, hr.size])
    rank = np.arange(hr.size) - np.repeat(starts, counts)
    pieces_per_row = -(-counts // piece)
    first_piece = np.repeat(np.r_[0, np.cumsum(pieces_per_row)[:-1]], counts)
    pr = first_piece + rank // piece
    n_pieces = int(pieces_per_row.sum())
    g2 = nw.nm_groups(pr, hc, (n_pieces, A.shape[1]), window, pattern)
    slots = g1["slots"] + g2["slots"]
    return 100 * (g1["padding"] + g2["padding"]) / max(slots, 1), 100 * hr.size / max(A.nnz, 1), n_pieces


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--pattern", default="2:4")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--device", default=None)
    a = ap.parse_args()
    pattern = tuple(int(x) for x in a.pattern.split(":"))
    print(f"| graph | nnz | original order: padding / of it conflicts / forced (bound) / windows without conflicts | "
          f"reorder {a.pattern} s | reordered: padding / conflicts / forced / windows without conflicts | "
          f"reorder {a.pattern} with layout=: padding / forced / windows without conflicts (vertices renumbered, s) | "
          f"hub rows folded into piece windows (model), original / reordered: padding (entries moved) |")
    print("|---|---|---|---|---|---|---|")
    for name in a.graphs:
        _, A = resolve_graph(name)
        before = padding_row(A, pattern, a.window)
        t0 = time.perf_counter()
        p = tg.reorder(A, a.pattern, device=a.device)
        dt = time.perf_counter() - t0
        B = p.apply(A)
        after = padding_row(B, pattern, a.window)
        fmt = "{:.1f} % / {:.1f} % / {:.1f} % / {:.0f} %".format
        t0 = time.perf_counter()
        q = tg.reorder(A, a.pattern, layout=a.pattern, device=a.device)
        dq = time.perf_counter() - t0
        stacked = padding_row(q.apply(A), pattern, a.window)
        assert abs(stacked[0] - 100 * q.report.padding) < 1e-9, "the report and the reference grouping disagree"
        fo, fr = folded_row(A, pattern, a.window), folded_row(B, pattern, a.window)
        print(f"| {name} | {A.nnz:,} | {fmt(*before)} | {dt:.2f} | {fmt(*after)} | "
              f"{stacked[0]:.2f} % / {stacked[2]:.1f} % / {stacked[3]:.0f} % ({q.report.renumbered:,}, {dq:.2f}) | "
              f"{fo[0]:.1f} % ({fo[1]:.1f} %) / {fr[0]:.1f} % ({fr[1]:.1f} %) |", flush=True)


if __name__ == "__main__":
    main()
