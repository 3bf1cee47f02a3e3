"""Vector-layout TF32 SpMM: exactness and a launch-shape sweep against cuSPARSE and the 16x8 kernel.

Usage (GPU machine): python tools/sweep_vec.py [--quick] GRAPH ...
For each graph and D in 32/64/128/256: the best of cuSPARSE CSR ALG2/ALG3
(row-major X), the 16x8 TF32 kernel at its defaults, and the vector layout
over ``_ops.set_tuning`` settings (feature groups per lane, unroll, warps per SM
target), all timed with CUDA events on rotating fresh inputs in one process.
Every configuration is first checked exact on small-integer data.
"""

import itertools
import sys

import numpy as np

import cupy as cp
import cupyx.scipy.sparse as csp
import tcgnn_py as tg
from tcgnn_py import _ops
from tcgnn_py.bench import time_rotating
from _sweep import cusparse_us, load_graph  # tools/, beside this script

DIMS = (32, 64, 128, 256)


def main(argv):
    quick = "--quick" in argv
    graphs = [a for a in argv if not a.startswith("--")]
    base = dict(_ops.TUNING, vec_timed_choice=False)  # each setting pins its launch
    grid = [dict(vec_max_slices=s, vec_async_unroll=u, vec_async_stages=ns, vec_target_warps=tw)
            for s, u, ns, tw in itertools.product((1, 2), (2, 4), (2, 3), (16, 64))]
    grid += [dict(vec_async_stages=0), dict(vec_async_stages=0, vec_unroll=8), dict(vec_combine=False)]
    if quick:
        grid = [dict(vec_max_slices=s, vec_prefetch_values=p) for s in (1, 2) for p in (False, True)]
    summary = []
    for spec in graphs:
        rng = np.random.default_rng()
        name, A, Ai = load_graph(spec, rng)
        Ad = csp.csr_matrix(A)
        T16 = tg.TiledMatrix(A, dtype=np.float32)
        TV = tg.TiledMatrix(A, dtype=np.float32, layout="vector")
        TVi = TV.with_values(cp.asarray(Ai.data), order="csr")
        print(f"# {name}: {A.shape[0]} rows, nnz {A.nnz}; 16x8 {T16.tile_stats()}; vector {TV.tile_stats()}", flush=True)
        for D in DIMS:
            Xs = [cp.random.standard_normal((A.shape[1], D), dtype=cp.float32) for _ in range(4)]
            Y = cp.empty((A.shape[0], D), cp.float32)
            cus = cusparse_us(Ad, Xs, Y)
            best = min(cus.values())
            t16 = 1e3 * time_rotating(lambda i: tg.spmm(T16, Xs[i], out=Y), 4, 20)
            Xi = cp.asarray(rng.integers(-8, 9, (A.shape[1], D)).astype(np.float32))
            want = cp.asarray((Ai.astype(np.float64) @ Xi.get().astype(np.float64)).astype(np.float32))
            rows = []
            for kw in grid:
                _ops.set_tuning(**{**base, **kw})
                out = cp.full((A.shape[0], D), cp.nan, cp.float32)
                tg.spmm(TVi, Xi, out=out)
                exact = bool((out == want).all())  # small integers: exact under truncation too
                tv = 1e3 * time_rotating(lambda i: tg.spmm(TV, Xs[i], out=Y), 4, 20)
                launch = [v for k, v in TV.tiling._cache.items() if isinstance(k, tuple) and k[0] == "launch"][-1]
                rows.append((tv, kw, exact, launch.units.shape[0], launch.fixup is not None))
            _ops.set_tuning(**base)
            tdef = 1e3 * time_rotating(lambda i: tg.spmm(TV, Xs[i], out=Y), 4, 20)
            rows.sort(key=lambda r: r[0])
            bad = [r for r in rows if not r[2]]
            print(f"{name} D={D}: cuSPARSE {best:.1f} us (alg2 {cus['alg2']:.1f}, alg3 {cus['alg3']:.1f}); "
                  f"16x8 {t16:.1f} us ({best / t16:.2f}x); vector default {tdef:.1f} us ({best / tdef:.2f}x); "
                  f"best {rows[0][0]:.1f} us ({best / rows[0][0]:.2f}x) {rows[0][1]} units={rows[0][3]} "
                  f"fixup={rows[0][4]}; inexact configs: {len(bad)}", flush=True)
            for r in rows[:4] + rows[-2:]:
                print(f"    {r[0]:8.1f} us  {r[1]}  units={r[3]} fixup={r[4]} exact={r[2]}")
            summary.append((name, D, best / t16, best / tdef, best / rows[0][0]))
    g = lambda k: float(np.exp(np.mean([np.log(s[k]) for s in summary])))
    print(f"GEOMEAN over {len(summary)} points: 16x8 {g(2):.2f}x, vector default {g(3):.2f}x, vector best {g(4):.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
