import sys, numpy as np, cupy as cp, tcgnn_py as tg
from tcgnn_py import _ops
from tcgnn_py.bench import resolve_graph
g, D, dt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if len(sys.argv) > 4:  # e.g. vec_coop=False
    k, v = sys.argv[4].split("=")
    _ops.set_tuning(**{k: eval(v)})
_, A = resolve_graph(g); A = A.astype(np.float32); A.sum_duplicates()
T = tg.TiledMatrix(A)
if dt == "bfloat16":
    import ml_dtypes
    dt = ml_dtypes.bfloat16
X = cp.asarray(np.random.default_rng(0).standard_normal((A.shape[1], D)).astype(np.float32)).astype(dt)
Y = cp.empty((A.shape[0], D), cp.float32)
for _ in range(5):
    tg.spmm(T, X, out=Y)
cp.cuda.Device().synchronize()
print(g, D, dt, sys.argv[4:], [v for k, v in T.tiling._cache.items() if isinstance(k, tuple) and "launch" in str(k[0])][0].kernel, flush=True)
cp.cuda.profiler.start()
tg.spmm(T, X, out=Y)
cp.cuda.Device().synchronize()
cp.cuda.profiler.stop()
