import pathlib, sys
import numpy as np, scipy.sparse as sp, cupy as cp, tcgnn_py as tg
from tcgnn_py import _ops
sys.path.insert(0, str(pathlib.Path("tests").resolve()))
from _zoo import star
rng = np.random.default_rng(7)
n = 1003
A = sp.random_array((n, n), density=0.01, rng=rng, format="csr", dtype=np.float64); A.data[:] = rng.integers(1, 5, A.nnz)
A = sp.csr_array(A + star(n - 1))
R = sp.random_array((n, 517), density=0.02, rng=rng, format="csr"); R.data[:] = rng.integers(1, 5, R.nnz)
checked = 0
for tuning in (dict(vec_timed_choice=False, vec_coop=True, vec_slices=None, vec_async_unroll=4),
               dict(vec_timed_choice=False, vec_coop=True, vec_slices=2, vec_async_unroll=2),
               dict(vec_timed_choice=True, vec_coop=True, vec_slices=None, vec_async_unroll=4)):
    _ops.set_tuning(**tuning)
    for M in (A, R):
        T = tg.TiledMatrix(M, dtype=np.float32)
        for D in (4, 17, 64, 100, 132):
            X = rng.integers(-8, 9, (M.shape[1], D)).astype(np.float32)
            want = (M @ X.astype(np.float64)).astype(np.float32)
            for _ in range(2):
                Y = tg.spmm(T, cp.asarray(X))
                assert np.array_equal(Y.get(), want), (tuning, D)
                checked += 1
            assert _ops._vec_choice(T.tiling, D, D % 4 == 0).coop == (D % 4 == 0), D
print("coop memcheck workload: checked", checked)
