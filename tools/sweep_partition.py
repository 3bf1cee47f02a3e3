"""How the vector SpMM cuts windows into units: the statistics' rule against alternatives, two clocks.

    python tools/sweep_partition.py GRAPH ... [--dims 32,64,128,256] [--json FILE]

The partition (blocks per unit) fixes every sum's order, so the timed launch
choice never varies it; the rule in ``_ops._vec_unit_size`` picks it from the
tiling's statistics.  This sweep times that rule's settings (``vec_tail_factor``,
``vec_target_warps``, an 8-block unit size) in one process per graph: for each
setting, every product is checked exact on small-integer data, then timed on
the GPU-only clock (20 calls queued behind a spin kernel, median of 11 batches)
and from idle (one call at a time, 4 rotating inputs), against the best of
cuSPARSE ALG2 / ALG3.  The timed launch choice is on, as by default.
"""

import argparse
import json
import math

import numpy as np

SETTINGS = {
    "base": {},
    "tail2": dict(vec_tail_factor=2),
    "tail1.5": dict(vec_tail_factor=1.5),
    "tail1": dict(vec_tail_factor=1),
    "tw32": dict(vec_target_warps=32),
    "u8": {},  # 8-block units allowed (VEC_UNIT_SIZES)
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--dims", default="32,64,128,256")
    ap.add_argument("--json")
    args = ap.parse_args()

    import cupy as cp
    import cupyx.scipy.sparse as csp

    import tcgnn_py as tg
    from tcgnn_py import _ops
    from tcgnn_py.bench import CSR_ALG2, CSR_ALG3, CusparseRowMajor, resolve_graph
    from tcgnn_py.bench._timing import time_queued, time_rotating

    base, sizes = dict(_ops.TUNING), _ops.VEC_UNIT_SIZES
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
            line = [f"{name:18s} D={D:3d} cuSPARSE {row['cusparse']['gpu']:6.1f}/{row['cusparse']['idle']:6.1f} us |"]
            for label, kw in SETTINGS.items():
                _ops.VEC_UNIT_SIZES = (8,) + sizes if label == "u8" else sizes
                _ops.set_tuning(**{**base, **kw})  # a new tuning version: planned (and timed) again
                tg.spmm(T, Xs[0], out=Y)
                exact = bool((Y == ref).all())  # synchronize!
                call = lambda i: tg.spmm(T, Xs[i], out=Y)  # noqa: E731
                t = {"gpu": 1e3 * time_queued(call, 4), "idle": 1e3 * time_rotating(call, 4, 20, 3), "exact": exact}
                launch = next(v for k, v in T.tiling._cache.items()
                              if isinstance(k, tuple) and k[0] == "launch" and k[3] == D
                              and k[-1] == _ops._TUNING_VERSION[0])
                t["units"], t["n_slices"] = int(launch.units.shape[0]), launch.n_slices
                row[label] = t
                c = row["cusparse"]
                line.append(f"{label} {c['gpu'] / t['gpu']:.2f}/{c['idle'] / t['idle']:.2f}"
                            f"{'' if exact else ' WRONG'}")
            _ops.VEC_UNIT_SIZES = sizes
            _ops.set_tuning(**base)
            rows.append(row)
            print(" ".join(line), flush=True)
    for clock in ("gpu", "idle"):
        for label in SETTINGS:
            r = [x["cusparse"][clock] / x[label][clock] for x in rows]
            gm = math.exp(sum(map(math.log, r)) / len(r))
            print(f"{clock:4s} {label:8s} geomean {gm:.3f}x, {sum(v < 1 for v in r)} of {len(r)} below 1.0x,"
                  f" worst {min(r):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
