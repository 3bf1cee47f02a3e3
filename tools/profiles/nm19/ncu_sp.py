import sys, numpy as np, cupy as cp, tcgnn_py as tg
from tcgnn_py.bench import resolve_graph
g, D = sys.argv[1], int(sys.argv[2])
_, A = resolve_graph(g); A = A.astype(np.float32)
T24, TV, T12 = (tg.TiledMatrix(A, layout=l) for l in ("2:4", "vector", "1:2"))
X = cp.asarray(np.random.default_rng(0).standard_normal((A.shape[1], D)).astype(np.float32)); Xh = X.astype(cp.float16)
Y = cp.empty((A.shape[0], D), cp.float32)
for T, x in ((T24, Xh), (TV, Xh), (T12, X), (TV, X)):
    tg.spmm(T, x, out=Y); tg.spmm(T, x, out=Y)
cp.cuda.Device().synchronize()
cp.cuda.profiler.start()
for T, x in ((T24, Xh), (TV, Xh), (T12, X), (TV, X)):
    tg.spmm(T, x, out=Y)
cp.cuda.Device().synchronize()
cp.cuda.profiler.stop()
