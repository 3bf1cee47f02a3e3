"""The vector SpMM's launch chosen by timing against the statistics' choice, in one process.

    python tools/timed_choice.py GRAPH ... [--dims 32,64,128,256] [--json FILE] [--markdown FILE]

For each graph and width, ``tg.spmm(T, X, out=Y)`` on the default (vector)
layout with the launch the tiling's statistics pick (``vec_timed_choice=False``)
and with the one the timed choice keeps (the default), against the best of
cuSPARSE ALG2 / ALG3 (row-major): on the GPU-only clock (20 calls queued
behind a spin kernel, median of 11 batches) and from idle (one call at a time,
4 rotating inputs, median of 20).  Also the first call's cost (host wall time
of a call that plans its launch: statistics only, then with the timing) and
the launch that won.  Every launch is checked exact on small-integer data first.
"""

import argparse
import json
import math
import time

import numpy as np


def _first_call_ms(call):
    import cupy as cp

    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    call()
    cp.cuda.Device().synchronize()
    return 1e3 * (time.perf_counter() - t0)


def _geomean(r):
    return math.exp(sum(map(math.log, r)) / len(r))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--dims", default="32,64,128,256")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()

    import cupy as cp
    import cupyx.scipy.sparse as csp

    import tcgnn_py as tg
    from tcgnn_py import _ops
    from tcgnn_py.bench import CSR_ALG2, CSR_ALG3, CusparseRowMajor, resolve_graph
    from tcgnn_py.bench._timing import time_queued, time_rotating

    head = ("| graph | D | cuSPARSE GPU-only µs | statistics µs | timed µs | cuSPARSE from idle µs | statistics µs |"
            " timed µs | GPU-only ratio: statistics / timed | from idle: statistics / timed | first call ms:"
            " statistics / timed | timed launch (slices, cp.async, in-launch sums, blocks per step, dense values) |\n" + "|---" * 12 + "|")
    print(head, flush=True)
    rows, lines = [], []
    rng = np.random.default_rng(0)
    for spec in args.graphs:
        name, A = resolve_graph(spec)
        A = A.astype(np.float32)
        A.sum_duplicates()
        A.data[:] = rng.integers(1, 4, A.nnz)
        Ad = csp.csr_matrix(A)
        for D in (int(d) for d in args.dims.split(",")):
            Xs = [cp.asarray(rng.integers(-4, 5, (A.shape[1], D)).astype(np.float32)) for _ in range(4)]
            Y = cp.empty((A.shape[0], D), cp.float32)
            ref = Ad @ Xs[0]
            cs = [CusparseRowMajor(Ad, Xs, Y, alg) for alg in (CSR_ALG2, CSR_ALG3)]
            row = {"graph": name, "nnz": int(A.nnz), "D": D,
                   "cusparse": {"gpu": min(1e3 * time_queued(c, 4) for c in cs),
                                "idle": min(1e3 * time_rotating(c, 4, 20, 3) for c in cs)}}
            for c in cs:
                c.close()
            for mode, timed in (("statistics", False), ("timed", True)):
                _ops.set_tuning(vec_timed_choice=timed)
                T = tg.TiledMatrix(A)  # a fresh tiling: nothing planned yet
                first = _first_call_ms(lambda: tg.spmm(T, Xs[0], out=Y))
                assert bool((Y == ref).all()), (name, D, mode)  # synchronize!
                call = lambda i: tg.spmm(T, Xs[i], out=Y)  # noqa: E731
                row[mode] = {"gpu": 1e3 * time_queued(call, 4), "idle": 1e3 * time_rotating(call, 4, 20, 3),
                             "first_ms": first}
                if timed:
                    ms = next(v for k, v in T.tiling._cache.items() if isinstance(k, tuple) and k[0] == "vec_timed")
                    won = list(ms)[_ops.pick_fastest(list(ms.values()))]
                    row["timed"]["won"] = [won.slices, won.cp_async, won.combine, won.unroll, won.dense]
                    row["timed"]["candidates_us"] = {str(tuple(k)): 1e3 * v for k, v in ms.items()}
            _ops.set_tuning(vec_timed_choice=True)
            c, s, t = row["cusparse"], row["statistics"], row["timed"]
            line = (f"| {name} | {D} | {c['gpu']:.1f} | {s['gpu']:.1f} | {t['gpu']:.1f} | {c['idle']:.1f} |"
                    f" {s['idle']:.1f} | {t['idle']:.1f} | {c['gpu'] / s['gpu']:.2f}× / {c['gpu'] / t['gpu']:.2f}× |"
                    f" {c['idle'] / s['idle']:.2f}× / {c['idle'] / t['idle']:.2f}× |"
                    f" {s['first_ms']:.1f} / {t['first_ms']:.1f} | {tuple(t['won'])} |")
            print(line, flush=True)
            rows.append(row)
            lines.append(line)
    summary = []
    for clock, label in (("gpu", "GPU-only"), ("idle", "from idle")):
        for mode in ("statistics", "timed"):
            r = [x["cusparse"][clock] / x[mode][clock] for x in rows]
            summary.append(f"{label}, {mode}: geomean {_geomean(r):.3f}× over the best cuSPARSE call,"
                           f" {sum(v < 1 for v in r)} of {len(r)} below 1.0×, worst {min(r):.2f}×")
    print("\n".join(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(head + "\n" + "\n".join(lines) + "\n\n" + "\n".join(f"- {s}" for s in summary) + "\n")


if __name__ == "__main__":
    main()
