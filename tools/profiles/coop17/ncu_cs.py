import sys, numpy as np, cupy as cp, cupyx.scipy.sparse as csp
from tcgnn_py.bench import resolve_graph, CusparseRowMajor, CSR_ALG2
g, D = sys.argv[1], int(sys.argv[2])
_, A = resolve_graph(g); A = A.astype(np.float32); A.sum_duplicates()
Ad = csp.csr_matrix(A)
X = cp.asarray(np.random.default_rng(0).standard_normal((A.shape[1], D)).astype(np.float32))
Y = cp.empty((A.shape[0], D), cp.float32)
c = CusparseRowMajor(Ad, [X], Y, CSR_ALG2)
for _ in range(5):
    c(0)
cp.cuda.Device().synchronize()
cp.cuda.profiler.start()
c(0)
cp.cuda.Device().synchronize()
cp.cuda.profiler.stop()
print("cusparse alg2", g, D)
