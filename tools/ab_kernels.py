"""A/B of a kernel family's CUDA source in one process: the working tree's against an older one.

    git show REV:tcgnn_py/kernels/products.py > old_products.py
    python tools/ab_kernels.py --old old_products.py [--family vec] [--dims 32,64,128,256] [--json F] GRAPH ...

The older file's ``FAMILIES[family]`` is compiled as a family of its own, and
``get_kernel`` is pointed at it for the "old" side; everything else (plans,
launches, the timed launch choice) is the working tree's.  Per graph and width:
both sides checked exact on small-integer data, then timed on the GPU-only clock
(20 calls queued behind a spin kernel, median of 11 batches) and from idle
(4 rotating inputs, median of 20), against the best of cuSPARSE ALG2 / ALG3.
"""

import argparse
import json
import math

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--old", required=True)
    ap.add_argument("--family", default="vec")
    ap.add_argument("--dims", default="32,64,128,256")
    ap.add_argument("--json")
    args = ap.parse_args()

    import cupy as cp
    import cupyx.scipy.sparse as csp

    import tcgnn_py as tg
    from tcgnn_py import _ops
    from tcgnn_py.bench import CSR_ALG2, CSR_ALG3, CusparseRowMajor, resolve_graph
    from tcgnn_py.bench._timing import time_queued, time_rotating
    from tcgnn_py.kernels import registry

    old = {"__name__": "tcgnn_py.kernels._old", "__package__": "tcgnn_py.kernels"}  # its relative imports resolve
    exec(compile(open(args.old).read(), args.old, "exec"), old)
    registry.register(args.family + "_old", *old["FAMILIES"][args.family])
    real_get = registry.get_kernel
    side = {"old": False}

    def get_kernel(family, name):
        return real_get(family + "_old" if side["old"] and family == args.family else family, name)

    registry.get_kernel = get_kernel
    base = dict(_ops.TUNING)
    rows = []
    rng = np.random.default_rng(0)
    for spec in args.graphs:
        name, A = resolve_graph(spec)
        A = A.astype(np.float32)
        A.sum_duplicates()
        A.data[:] = rng.integers(1, 4, A.nnz)
        Ad = csp.csr_matrix(A)
        T = tg.TiledMatrix(A)
        for D in (int(d) for d in args.dims.split(",")):
            Xs = [cp.asarray(rng.integers(-4, 5, (A.shape[1], D)).astype(np.float32)) for _ in range(4)]
            Y = cp.empty((A.shape[0], D), cp.float32)
            ref = Ad @ Xs[0]
            cs = [CusparseRowMajor(Ad, Xs, Y, alg) for alg in (CSR_ALG2, CSR_ALG3)]
            row = {"graph": name, "D": D, "cusparse": {"gpu": min(1e3 * time_queued(c, 4) for c in cs),
                                                       "idle": min(1e3 * time_rotating(c, 4, 20, 3) for c in cs)}}
            for c in cs:
                c.close()
            for label in ("old", "new"):
                side["old"] = label == "old"
                _ops.set_tuning(**base)  # a new tuning version: planned (and timed) again with this side's kernels
                tg.spmm(T, Xs[0], out=Y)
                assert bool((Y == ref).all()), (name, D, label)  # synchronize!
                call = lambda i: tg.spmm(T, Xs[i], out=Y)  # noqa: E731
                row[label] = {"gpu": 1e3 * time_queued(call, 4), "idle": 1e3 * time_rotating(call, 4, 20, 3)}
            side["old"] = False
            c, o, n = row["cusparse"], row["old"], row["new"]
            print(f"{name:18s} D={D:3d} GPU-only old/new {o['gpu']:7.1f} {n['gpu']:7.1f} us"
                  f" ({c['gpu'] / o['gpu']:.2f}x / {c['gpu'] / n['gpu']:.2f}x of cuSPARSE) | from idle"
                  f" {o['idle']:7.1f} {n['idle']:7.1f} us ({c['idle'] / o['idle']:.2f}x / {c['idle'] / n['idle']:.2f}x)",
                  flush=True)
            rows.append(row)
    for clock in ("gpu", "idle"):
        for label in ("old", "new"):
            r = [x["cusparse"][clock] / x[label][clock] for x in rows]
            gm = math.exp(sum(map(math.log, r)) / len(r))
            print(f"{clock:4s} {label}: geomean {gm:.3f}x over the best cuSPARSE call, {sum(v < 1 for v in r)} of"
                  f" {len(r)} below 1.0x, worst {min(r):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
