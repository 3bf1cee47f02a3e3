"""Issue 18's figures in one process: per-call wall time of the products, SGT milliseconds, graph replay.

    python tools/launch_costs.py cora pubmed facebook powerlaw:1000000:16000000 [--calls 2000]

* per call (µs, wall clock, ``--calls`` back-to-back calls closed by one
  synchronisation, after 50 warm-up calls): ``T @ X``, ``tg.spmm(T, X, out=Y)``
  and ``tg.sddmm(T, X)`` at D = 16 on both layouts, cuSPARSE ALG2 through
  CuPy's binding (descriptors made once), an empty CuPy RawKernel, and one
  ``tg.spmm`` captured in a :class:`tcgnn_py.CUDAGraph` and replayed;
* SGT (ms, median of 20 wall-clock runs closed by a synchronisation): the
  translation of device CSR arrays (``_sgt.translate``, what the benchmark's
  ``SGT ms`` column times) and ``TiledMatrix(scipy_csr)`` (upload, checks,
  translation).
"""

import argparse

import numpy as np


def back_to_back(fn, calls):
    from tcgnn_py.bench._timing import time_per_call

    return 1e6 * time_per_call(fn, calls, warmup=50)[1]


def wall_ms(fn, repeat=20):
    import cupy as cp

    from tcgnn_py.bench._timing import time_host

    def synced():
        fn()
        cp.cuda.Device().synchronize()

    return time_host(synced, repeat, warmup=3)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=16)
    args = ap.parse_args()

    import cupy as cp
    import cupyx.scipy.sparse as csp

    import tcgnn_py as tg
    from tcgnn_py import _sgt
    from tcgnn_py.bench import CSR_ALG2, CusparseRowMajor, resolve_graph

    k = cp.RawKernel(r'extern "C" __global__ void e(){}', "e")
    print(f"empty CuPy RawKernel: {back_to_back(lambda: k((1,), (32,), ()), args.calls):.1f} µs per call")
    print("| graph | nnz | SGT ms (device CSR) | TiledMatrix(scipy) ms | cuSPARSE µs | layout | T @ X µs |"
          " spmm(out=) µs | sddmm µs | graph replay µs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for spec in args.graphs:
        name, A = resolve_graph(spec)
        A = A.astype(np.float32)
        A.sum_duplicates()
        arrays = [cp.asarray(a) for a in (A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32))]
        sgt = wall_ms(lambda: _sgt.translate(*arrays, A.shape, 16, 8))
        build = wall_ms(lambda: tg.TiledMatrix(A))
        D = args.dim
        X = cp.asarray(rng.standard_normal((A.shape[1], D), dtype=np.float32))
        Xr = cp.asarray(rng.standard_normal((A.shape[0], D), dtype=np.float32))
        Y = cp.empty((A.shape[0], D), np.float32)
        c = CusparseRowMajor(csp.csr_matrix(A), [X], Y, CSR_ALG2)
        cus = back_to_back(lambda: c(0), args.calls)
        for layout in ("tcgnn", "vector"):
            T = tg.TiledMatrix(A, layout=layout)
            mm = back_to_back(lambda: T @ X, args.calls)
            out = back_to_back(lambda: tg.spmm(T, X, out=Y), args.calls)
            sd = back_to_back(lambda: tg.sddmm(T, Xr, X), args.calls)
            g = tg.CUDAGraph()
            with g.capture():
                tg.spmm(T, X, out=Y)
            rep = back_to_back(g.replay, args.calls)
            print(f"| {name} | {A.nnz:,} | {sgt:.3f} | {build:.3f} | {cus:.1f} | {layout} | {mm:.1f} | {out:.1f} |"
                  f" {sd:.1f} | {rep:.1f} |", flush=True)


if __name__ == "__main__":
    main()
