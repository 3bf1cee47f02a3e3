"""Per-width geomean table of a harness JSON: ours over the best baseline, one column per implementation x clock.

Usage: python tools/bench_geomeans.py RESULTS.json [--op spmm] [--min-nnz 50000] [--impls A,B,...]

Reads ``python -m tcgnn_py.bench ... --json RESULTS.json`` and prints the markdown rows that the results page
quotes: the geomean of the harness's own speedups (``speedup``, ``speedup_back_to_back``, ``speedup_gpu``:
ours against the best baseline call) per D and over all points of the graphs with at least ``--min-nnz``
stored entries, the count of points below 1.0x, then those points.  No GPU needed.
"""

import argparse
import json
import math

from tcgnn_py.bench import CLOCKS

DEFAULT_IMPLS = "tcgnn_vector_tf32,tcgnn_vector_float16,tcgnn_vector_bfloat16"


def table(graphs, op, min_nnz, impls):
    """Markdown lines of the table, then one line per (implementation, clock) listing its points below 1.0x."""
    rows = [(g, r) for g in graphs for r in g["results"] if r["op"] == op and g["nnz"] >= min_nnz]
    dims = sorted({r["D"] for _, r in rows})
    cols = [(impl, key, label) for impl in impls for key, label in CLOCKS]

    def points(impl, key, D=None):
        return [(r[key][impl], g["graph"], r["D"]) for g, r in rows
                if impl in r.get(key, {}) and (D is None or r["D"] == D)]

    def gm(pts):
        return f"{math.exp(sum(math.log(v) for v, _, _ in pts) / len(pts)):.2f}x" if pts else "-"

    lines = ["| D | " + " | ".join(f"{impl}: {label}" for impl, _, label in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for D in dims:
        lines.append(f"| {D} | " + " | ".join(gm(points(i, k, D)) for i, k, _ in cols) + " |")
    lines.append(f"| all {len(rows)} | " + " | ".join(gm(points(i, k)) for i, k, _ in cols) + " |")
    lines.append("| below 1.0x | " + " | ".join(str(sum(v < 1 for v, _, _ in points(i, k))) for i, k, _ in cols) + " |")
    for impl, key, label in cols:
        low = [f"{g} D = {D} ({v:.2f}x)" for v, g, D in points(impl, key) if v < 1]
        if low:
            lines.append(f"- {impl}, {label}: " + ", ".join(low))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--op", default="spmm")
    ap.add_argument("--min-nnz", type=int, default=50000)
    ap.add_argument("--impls", default=DEFAULT_IMPLS)
    args = ap.parse_args()
    with open(args.json) as f:
        graphs = json.load(f)["graphs"]
    print("\n".join(table(graphs, args.op, args.min_nnz, args.impls.split(","))))


if __name__ == "__main__":
    main()
