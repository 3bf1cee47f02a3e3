import pathlib, sys
import numpy as np, scipy.sparse as sp, cupy as cp, ml_dtypes, tcgnn_py as tg
from tcgnn_py import _ops
sys.path.insert(0, str(pathlib.Path("tests").resolve()))
from _zoo import star
rng = np.random.default_rng(7)
n = 1003
A = sp.random_array((n, n), density=0.01, rng=rng, format="csr", dtype=np.float64); A.data[:] = rng.integers(1, 5, A.nnz)
A = sp.csr_array(A + star(n - 1))
R = sp.random_array((n, 517), density=0.02, rng=rng, format="csr"); R.data[:] = rng.integers(1, 5, R.nnz)
checked = 0
for tuning in (dict(vec_timed_choice=False, vec_coop=True, vec_slices=None),
               dict(vec_timed_choice=False, vec_coop=True, vec_slices=2),
               dict(vec_timed_choice=True, vec_coop=True, vec_slices=None)):
    _ops.set_tuning(**tuning)
    for M in (A, R):
        for mdt in (np.float32, np.float16):
            T = tg.TiledMatrix(M, dtype=mdt)
            for xt in (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)):
                for D in (8, 24, 64, 104, 136):
                    X = rng.integers(-8, 9, (M.shape[1], D)).astype(np.float32)
                    want = (M @ X.astype(np.float64))
                    for yt in (np.float32, xt):
                        Y = tg.spmm(T, cp.asarray(X.astype(xt)), out=cp.full((M.shape[0], D), np.nan, yt))
                        assert np.array_equal(Y.get().astype(np.float64), want.astype(yt).astype(np.float64)), (tuning, D, xt, yt)
                        checked += 1
                    half = (xt.name, np.dtype(mdt) != xt, "float32")
                    assert _ops._vec_choice(T.tiling, D, True, half).coop, D
print("half coop memcheck workload: checked", checked)
