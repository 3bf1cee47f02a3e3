"""Padding of the N:M window grouping (issue 19) before and after the N:M reorder.

    python tools/nm_padding.py [--pattern 2:4] [--window 16] [--device cpu] GRAPH ...

For each graph: the grouping of `tcgnn_py._nm_windows` on the original order and on the order of
`tg.reorder(A, PATTERN)`; padding slots as a share of stored slots: all of it, the part due to conflicts (not to
rounding a window's column count up to M), and the part no grouping can avoid (the bound: a row of d entries in a
window needs d / N groups); and the share of windows that needed no conflict padding.
Every grouping is checked (lossless, every group conforms) before it is counted.
"""
import argparse
import time

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--pattern", default="2:4")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--device", default=None)
    a = ap.parse_args()
    pattern = tuple(int(x) for x in a.pattern.split(":"))
    print(f"| graph | nnz | original order: padding / of it conflicts / forced (bound) / windows without conflicts | "
          f"reorder {a.pattern} s | reordered: padding / conflicts / forced / windows without conflicts |")
    print("|---|---|---|---|---|")
    for name in a.graphs:
        _, A = resolve_graph(name)
        before = padding_row(A, pattern, a.window)
        t0 = time.perf_counter()
        p = tg.reorder(A, a.pattern, device=a.device)
        dt = time.perf_counter() - t0
        after = padding_row(p.apply(A), pattern, a.window)
        fmt = "{:.1f} % / {:.1f} % / {:.1f} % / {:.0f} %".format
        print(f"| {name} | {A.nnz:,} | {fmt(*before)} | {dt:.2f} | {fmt(*after)} |", flush=True)


if __name__ == "__main__":
    main()
