import sys, numpy as np, cupy as cp, tcgnn_py as tg
from tcgnn_py import _ops
from tcgnn_py.bench import resolve_graph
_, A = resolve_graph("blogcatalog3"); A = A.astype(np.float32); A.sum_duplicates()
rng = np.random.default_rng()
for D in (128, 256):
    T = tg.TiledMatrix(A)
    X = cp.asarray(rng.standard_normal((A.shape[1], D)).astype(np.float32))
    Y = cp.empty((A.shape[0], D), cp.float32)
    tg.spmm(T, X, out=Y)
    (ms,) = [v for k, v in T.tiling._cache.items() if isinstance(k, tuple) and k[0] == "vec_timed" and k[1] == D]
    keep = list(ms)[_ops.pick_fastest(list(ms.values()))]
    short = lambda c: f"s{c.slices} u{c.unroll} {'cp' if c.cp_async else 'reg'}{' dense' if c.dense else ''} {'comb' if c.combine else 'fix'}"
    print(D, "kept:", short(keep), "|", " ; ".join(f"{short(c)} {1e3*t:.1f}" for c, t in ms.items()), flush=True)
