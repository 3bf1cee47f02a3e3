"""Quickstart: translate the bundled Cora graph into tensor-core tiles and multiply.

Runs anywhere: on a GPU through the Numba/CuPy path, elsewhere through the
NumPy reference path (with one NoGPUWarning).

    python examples/quickstart.py
"""

import time
import warnings

import numpy as np

import tcgnn_py as tg


def main():
    g = tg.load_cora()
    A = g.adj
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tg.NoGPUWarning)
        T = tg.TiledMatrix(A)
    print(T)
    print("tile stats:", T.tile_stats())

    rng = np.random.default_rng(0)
    X = rng.standard_normal((A.shape[1], 64)).astype(np.float32)
    Y = T @ X
    err = np.linalg.norm(Y - A @ X) / np.linalg.norm(A @ X)
    print(f"T @ X vs scipy: relative error {err:.2e}")
    assert Y.shape == (A.shape[0], 64) and err < 1e-5

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
