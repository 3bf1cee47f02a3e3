"""Graph x vertex order: column sharing, reorder time, SpMM against cuSPARSE (issue 17's table).

Usage (GPU machine): python tools/locality_table.py [--dims 64,128] [--json FILE] GRAPH ...

For every graph and order in (original, rcm, degree, locality) it runs
``bench_graph(spec, ("spmm",), dims, order=...)`` -- one process, CUDA-event
medians on rotating fresh inputs, every product checked first -- and prints one
markdown row: U/nnz of both layouts, 16x8 tile density, the order's time, our
faster layout's SpMM, cuSPARSE (best of CSR ALG2/ALG3, row-major X) on the same
renumbered graph (the kernel's view) and on the original graph (the user's
view), the user's view with calls issued back to back (host overhead hidden where
the GPU is the slower side), and the calls until the order plus the build pay
back against cuSPARSE on the original graph.
"""

import argparse
import json
import math
import statistics

from tcgnn_py.bench import bench_graph

ORDERS = (None, "rcm", "degree", "locality")
OURS = ("tcgnn_tf32", "tcgnn_vector_tf32")


def row_cells(g, dims):
    loc = g["locality"]
    o = g.get("order") or {"order": "original", "method": "-", "time_s": 0.0}
    cells = [g["graph"], f"{g['nnz']:,}", o["order"] + (f" ({o['method']})" if o["order"] == "locality" else ""),
             f"{loc['tcgnn']['pairs_per_nnz']:.3f}", f"{loc['vector']['pairs_per_nnz']:.3f}",
             f"{100 * loc['tcgnn']['density']:.1f}%", f"{o['time_s']:.3f}"]
    out = {}
    for D in dims:
        r = next(r for r in g["results"] if r["op"] == "spmm" and r["D"] == D)
        ours = min(OURS, key=lambda k: r["us"][k])
        same = r["us"][r["best_baseline"]]
        orig = min([r["us"][k] for k in r["us"] if k.startswith("original_")] or [same])
        t = r["us"][ours]
        b2b = r["us_back_to_back"]
        ours_b = min(b2b[k] for k in OURS)
        orig_b = min([b2b[k] for k in b2b if k.startswith("original_")] or [b2b[r["best_baseline"]]])
        saved_ms = (orig - t) / 1e3
        payback = math.ceil((1e3 * o["time_s"] + g["prep"]["build_ms"]) / saved_ms) if saved_ms > 0 else None
        cells += [f"{t:.1f} ({'vec' if 'vector' in ours else '16x8'})", f"{same:.1f}", f"{orig:.1f}",
                  f"{same / t:.2f}x", f"**{orig / t:.2f}x**", f"{orig_b / ours_b:.2f}x", str(payback) if payback else "never"]
        out[D] = {"ours_us": t, "layout": ours, "cusparse_same_us": same, "cusparse_original_us": orig,
                  "kernel_view": same / t, "user_view": orig / t, "payback_calls": payback,
                  "ours_b2b_us": ours_b, "cusparse_original_b2b_us": orig_b, "user_view_b2b": orig_b / ours_b}
    return cells, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--json")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    dims = tuple(int(d) for d in args.dims.split(","))
    head = ["graph", "nnz", "order", "U/nnz 16x8", "U/nnz 8x4", "density 16x8", "order s"]
    for D in dims:
        head += [f"ours D={D} us", "cuSPARSE same order", "cuSPARSE original", "kernel view", "user view",
                 "user view back to back", "payback calls"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head), flush=True)
    rows = []
    for spec in args.graphs:
        for order in ORDERS:
            g = bench_graph(spec, ("spmm",), dims, repeat=args.repeat, n_inputs=4, order=order)
            cells, summary = row_cells(g, dims)
            print("| " + " | ".join(cells) + " |", flush=True)
            rows.append({"graph": g["graph"], "nnz": g["nnz"], "order": order or "original", "locality": g["locality"],
                         "order_info": g.get("order"), "prep": g["prep"], "spmm": summary})
    for order in ("original", "rcm", "degree", "locality"):
        sel = [r for r in rows if r["order"] == order and not r["graph"].startswith(("powerlaw:", "uniform:"))]
        if not sel:
            continue
        base = {r["graph"]: r for r in rows if r["order"] == "original"}
        u = statistics.geometric_mean([r["locality"]["tcgnn"]["pairs_per_nnz"] / base[r["graph"]]["locality"]["tcgnn"]["pairs_per_nnz"]
                                       for r in sel])
        def gm(D, key):
            return statistics.geometric_mean([r["spmm"][D][key] for r in sel])

        views = ", ".join(f"D={D} user view {gm(D, 'user_view'):.2f}x (back to back {gm(D, 'user_view_b2b'):.2f}x), "
                          f"kernel view {gm(D, 'kernel_view'):.2f}x" for D in dims)
        print(f"geomean {order} (real graphs): U/nnz (16x8) {u:.3f}x of the original order; {views}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
