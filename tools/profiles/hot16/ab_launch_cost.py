# One-process A/B behind commit 7dce595 (reverted): the timed choice by GPU time alone against GPU time plus
# VEC_TIMED_LAUNCH_MS per fixup launch. Needs 7dce595 checked out (the constant and timed_pick); output: ab_launch_cost.log.
# python tools/profiles/hot16/ab_launch_cost.py 32,64,128,256 GRAPH ...
import sys, math, numpy as np, cupy as cp
sys.path.insert(0, "tools")
import tcgnn_py as tg
from tcgnn_py import _ops
from tcgnn_py.bench._timing import time_back_to_back
from _sweep import cusparse_clocks, int_points, ours_clocks
rows = []
for name, A, Ad, T, D, Xs, Y, ref in int_points(sys.argv[2:], [int(d) for d in sys.argv[1].split(",")], np.random.default_rng(0)):
    c = cusparse_clocks(Ad, Xs, Y)
    from tcgnn_py.bench._baselines import CusparseRowMajor, CSR_ALG2, CSR_ALG3
    cb = min(time_back_to_back(CusparseRowMajor(Ad, Xs, Y, a), 4) for a in (CSR_ALG2, CSR_ALG3)) * 1e3
    for dt in ("float32", "float16"):
        X = Xs if dt == "float32" else [x.astype(cp.float16) for x in Xs]
        r = {}
        for label, pen in (("gpu", 0.0), ("pen", 0.005)):
            _ops.VEC_TIMED_LAUNCH_MS = pen
            _ops.set_tuning(vec_timed_choice=True)  # a new tuning version: planned and timed again
            tg.spmm(T, X[0], out=Y)
            assert bool((Y == ref).all())  # synchronize!
            call = lambda i: tg.spmm(T, X[i], out=Y)
            o = ours_clocks(call)
            o["b2b"] = 1e3 * time_back_to_back(call, 4)
            r[label] = o
        row = {k: {lab: (c[k] if k != "b2b" else cb) / r[lab][k] for lab in r} for k in ("gpu", "b2b", "idle")}
        rows.append((dt, row))
        print(f"{name:16s} D={D:3d} {dt:8s} " + "  ".join(f"{k} {row[k]['gpu']:.2f}/{row[k]['pen']:.2f}" for k in row), flush=True)
for dt in ("float32", "float16"):
    for k in ("gpu", "b2b", "idle"):
        g = [math.exp(sum(math.log(row[k][lab]) for d, row in rows if d == dt) / sum(d == dt for d, _ in rows)) for lab in ("gpu", "pen")]
        print(f"{dt} {k}: GPU-time pick {g[0]:.3f}x, with launch cost {g[1]:.3f}x")
