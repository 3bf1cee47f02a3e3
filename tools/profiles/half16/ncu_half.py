import sys, numpy as np, cupy as cp, cupyx.scipy.sparse as csp, tcgnn_py as tg
from tcgnn_py.bench import resolve_graph, CusparseRowMajor, CSR_ALG2
g, D = sys.argv[1], int(sys.argv[2])
_, A = resolve_graph(g); A = A.astype(np.float32); A.sum_duplicates()
T = tg.TiledMatrix(A)
rng = np.random.default_rng(0)
X = cp.asarray(rng.standard_normal((A.shape[1], D)).astype(np.float32))
Xh = X.astype(cp.float16)
Y = cp.empty((A.shape[0], D), cp.float32)
c2 = CusparseRowMajor(csp.csr_matrix(A), [X], Y, CSR_ALG2)
for _ in range(5):
    tg.spmm(T, Xh, out=Y); tg.spmm(T, X, out=Y); c2(0)
cp.cuda.Device().synchronize()
cp.cuda.profiler.start()
tg.spmm(T, Xh, out=Y); tg.spmm(T, X, out=Y); c2(0)
cp.cuda.Device().synchronize()
cp.cuda.profiler.stop()
