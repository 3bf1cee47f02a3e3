"""Quickstart: translate the bundled Cora graph into tensor-core tiles and multiply.

Runs anywhere: on a GPU through the Numba/CuPy path, elsewhere through the
NumPy reference path (with one NoGPUWarning).

    python examples/quickstart.py [--device auto|cuda|cpu]
"""

import time
import warnings

import numpy as np
from _common import parse_args


def main():
    args = parse_args(__doc__.splitlines()[0])
    import tcgnn_py as tg

    if args.device == "cpu":
        print("--device cpu: the NumPy reference path")
    g = tg.load_cora()
    A = g.adj
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tg.NoGPUWarning)
        T = tg.TiledMatrix(A)
    print(T)
    print("tile stats:", T.tile_stats())

    rng = np.random.default_rng(0)
    X = rng.standard_normal((A.shape[1], 64)).astype(np.float32)
    want = A.astype(np.float64) @ X.astype(np.float64)
    # Default precision: TF32 tensor cores on a GPU (about 3e-4 relative error),
    # "fp32": CUDA cores, no input rounding.  The reference path is exact.
    for precision, tol in ((None, 1e-3), ("fp32", 1e-5)):
        Y = tg.spmm(T, X, precision=precision)
        err = np.linalg.norm(Y - want) / np.linalg.norm(want)
        print(f"spmm precision={precision}: relative error vs float64 scipy {err:.2e}")
        assert Y.shape == (A.shape[0], 64) and err < tol

    # SDDMM: e_ij = <x_i, x_j> on every edge, same tiling (AGNN-style scores).
    S = tg.sddmm(T, X)
    rows, cols = A.nonzero()
    e = np.einsum("ij,ij->i", X[rows].astype(np.float64), X[cols].astype(np.float64))
    got = S.tocsr()[rows, cols]
    print(f"sddmm: {S.nnz} edge scores, relative error {np.linalg.norm(got - e) / np.linalg.norm(e):.2e}")

    if tg.gpu_available():
        import cupy as cp

        Xd = cp.asarray(X)
        for _ in range(3):
            T @ Xd
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(20):
            start.record()
            T @ Xd
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop))
        t0 = time.perf_counter()
        tg.TiledMatrix(A)
        cp.cuda.Device().synchronize()
        print(f"GPU: translation {1e3 * (time.perf_counter() - t0):.2f} ms, "
              f"T @ X (D=64) median {1e3 * np.median(times):.1f} us")
    else:
        print("no GPU: reference path (timings skipped)")


if __name__ == "__main__":
    main()
