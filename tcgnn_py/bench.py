"""Benchmarks: ``python -m tcgnn_py.bench {sgt,spmm} GRAPH ...``.

Graphs are names under ``$TCGNN_PY_DATA``, ``.gpu/data`` or ``../shared/data``,
paths to a graph folder / ``.npz`` / ``.mtx``, or ``powerlaw:N:NNZ`` (synthetic).
Times are CUDA-event medians after warm-up (see the developers' METHOD), with
fresh random inputs rotated between calls so no run reuses the last one's
cache lines more than the others do.

``spmm`` times, in one process, ``TiledMatrix @ X`` (TF32 tensor cores and the
fp32 CUDA-core path) beside the baseline a user would pick: cuSPARSE SpMM with a
row-major X (CSR ALG2 and ALG3, the faster taken as "best"), and cupyx ``A @ X``.
"""

import argparse
import itertools
import json
import os
import pathlib
import statistics
import sys

import numpy as np

from . import _sgt
from ._device import get_cupy
from ._io import load_graph
from ._synth import power_law_graph
from ._tiled import TiledMatrix

_DATA = [os.environ.get("TCGNN_PY_DATA"), ".gpu/data", "../shared/data"]


def resolve_graph(spec):
    """``(name, scipy csr_array)`` for a graph spec."""
    if spec.startswith("powerlaw:"):
        _, n, nnz = spec.split(":")
        return f"powerlaw-{n}-{nnz}", power_law_graph(int(n), int(nnz), seed=0)
    for root in filter(None, _DATA):
        p = pathlib.Path(root) / spec
        if (p / "adj_csr.npz").exists():
            return spec, load_graph(p).adj
    return pathlib.Path(spec).stem, load_graph(spec).adj


def time_events(fn, repeat=10, warmup=2):
    """Median milliseconds of ``fn()`` between CUDA events, and every sample."""
    cp = get_cupy()
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, stop))
    return statistics.median(samples), samples


def bench_sgt(spec, repeat=10, tile_shape=(16, 8)):
    """SGT of one graph: device translation time per edge, end-to-end time, tile stats."""
    cp = get_cupy()
    name, A = resolve_graph(spec)
    A.sum_duplicates()
    d = [cp.asarray(a) for a in (A.data.astype(np.float32), A.indices.astype(np.int32), A.indptr.astype(np.int32))]
    sgt_ms, samples = time_events(lambda: _sgt.translate(*d, A.shape, *tile_shape), repeat)
    e2e_ms, _ = time_events(lambda: TiledMatrix(A, tile_shape=tile_shape), repeat)
    stats = TiledMatrix(A, tile_shape=tile_shape).tile_stats()
    return {
        "graph": name,
        "nodes": A.shape[0],
        "nnz": int(A.nnz),
        "sgt_ms": sgt_ms,
        "sgt_ns_per_edge": sgt_ms * 1e6 / max(A.nnz, 1),
        "sgt_samples_ms": samples,
        "from_host_ms": e2e_ms,
        "stats": {
            "windows": stats.windows,
            "blocks_before": stats.blocks_before,
            "blocks": stats.blocks,
            "block_reduction": stats.block_reduction,
            "density_before": stats.density_before,
            "density": stats.density,
            "max_blocks_per_window": stats.max_blocks_per_window,
        },
        "stats_str": str(stats),
    }


# cuSPARSE enums (cusparse.h), in case the binding does not export them.
_CSR_ALG2, _CSR_ALG3, _ORDER_ROW, _R_32F = 6, 12, 2, 0


class CusparseRowMajor:
    """``Y = A @ X`` through cusparseSpMM with row-major X and Y (one algorithm).

    Descriptors and the work buffer are made once per X; ``spMM_preprocess``
    runs once where the binding has it (it helps ALG3), outside any timing.
    """

    def __init__(self, A, Xs, Y, alg):
        from cupy.cuda import device
        from cupy_backends.cuda.libs import cusparse as cs

        cp = get_cupy()
        self.cs, self.alg = cs, alg
        self.handle = device.get_cusparse_handle()
        self.alpha, self.beta = np.array(1, np.float32), np.array(0, np.float32)
        self.op = cs.CUSPARSE_OPERATION_NON_TRANSPOSE
        i32 = cs.CUSPARSE_INDEX_32I
        self._keep = (A, Xs, Y)
        self.matA = cs.createCsr(A.shape[0], A.shape[1], A.nnz, A.indptr.data.ptr, A.indices.data.ptr,
                                 A.data.data.ptr, i32, i32, cs.CUSPARSE_INDEX_BASE_ZERO, _R_32F)
        order = getattr(cs, "CUSPARSE_ORDER_ROW", _ORDER_ROW)
        D = Y.shape[1]
        self.matXs = [cs.createDnMat(X.shape[0], D, D, X.data.ptr, _R_32F, order) for X in Xs]
        self.matY = cs.createDnMat(Y.shape[0], D, D, Y.data.ptr, _R_32F, order)
        size = max(self._call(cs.spMM_bufferSize, self.matXs[0]), 1)
        self.buf = cp.empty(size, cp.int8)
        if hasattr(cs, "spMM_preprocess"):
            for m in self.matXs:
                self._call(cs.spMM_preprocess, m, self.buf.data.ptr)

    def _call(self, fn, matX, *extra):
        return fn(self.handle, self.op, self.op, self.alpha.ctypes.data, self.matA, matX,
                  self.beta.ctypes.data, self.matY, _R_32F, self.alg, *extra)

    def __call__(self, i):
        self._call(self.cs.spMM, self.matXs[i], self.buf.data.ptr)

    def close(self):
        for m in self.matXs + [self.matY]:
            self.cs.destroyDnMat(m)
        self.cs.destroySpMat(self.matA)


def time_rotating(fn, n_inputs, repeat=50, warmup=5):
    """Median milliseconds of ``fn(i)`` between CUDA events, ``i`` cycling over the inputs."""
    it = itertools.cycle(range(n_inputs))
    return time_events(lambda: fn(next(it)), repeat, warmup)[0]


def bench_spmm(spec, dims=(64, 128), repeat=50, n_inputs=4):
    """SpMM of one graph at each width: tcgnn_py vs cuSPARSE row-major vs cupyx, one process."""
    import cupyx.scipy.sparse as csp

    from ._tiled import spmm

    cp = get_cupy()
    name, A = resolve_graph(spec)
    A = A.astype(np.float32)
    A.sum_duplicates()
    T = TiledMatrix(A, dtype=np.float32)
    Ad = csp.csr_matrix(A)
    stats = T.tile_stats()
    rng = np.random.default_rng()
    out = []
    for D in dims:
        Xs = [cp.asarray(rng.standard_normal((A.shape[1], D), dtype=np.float32)) for _ in range(n_inputs)]
        Y = cp.empty((A.shape[0], D), cp.float32)
        alg2 = CusparseRowMajor(Ad, Xs, Y, _CSR_ALG2)
        alg3 = CusparseRowMajor(Ad, Xs, Y, _CSR_ALG3)
        fns = {
            "tcgnn_tf32": lambda i: spmm(T, Xs[i], out=Y),
            "tcgnn_fp32": lambda i: spmm(T, Xs[i], out=Y, precision="fp32"),
            "cusparse_alg2": alg2,
            "cusparse_alg3": alg3,
            "cupyx": lambda i: Ad @ Xs[i],
        }
        ref = A.astype(np.float64) @ Xs[0].get().astype(np.float64)
        row = {"graph": name, "nnz": int(A.nnz), "nodes": A.shape[0], "D": D, "err": {}, "us": {}}
        for key, fn in fns.items():
            Y.fill(cp.nan)
            got = fn(0)
            got = Y if got is None or key.startswith("tcgnn") else got
            row["err"][key] = float(np.linalg.norm(got.get() - ref) / max(np.linalg.norm(ref), 1e-30))
            row["us"][key] = 1e3 * time_rotating(fn, n_inputs, repeat)
        alg2.close()
        alg3.close()
        best = min(row["us"]["cusparse_alg2"], row["us"]["cusparse_alg3"])
        row["us"]["cusparse_best"] = best
        row["speedup_vs_best_cusparse"] = best / row["us"]["tcgnn_tf32"]
        row["blocks"], row["density"] = stats.blocks, stats.density
        out.append(row)
        del Xs
    return out


def _print_spmm(rows):
    keys = ["tcgnn_tf32", "tcgnn_fp32", "cusparse_alg2", "cusparse_alg3", "cupyx"]
    print(f"{'graph':<24}{'nnz':>12}{'D':>5}" + "".join(f"{k:>15}" for k in keys) + f"{'best cuSP/tf32':>16}")
    for r in rows:
        print(f"{r['graph']:<24}{r['nnz']:>12,}{r['D']:>5}" + "".join(f"{r['us'][k]:>15.1f}" for k in keys)
              + f"{r['speedup_vs_best_cusparse']:>15.2f}x")
    print("(microseconds, CUDA-event medians; relative Frobenius error vs float64 SciPy:)")
    for r in rows:
        print(f"  {r['graph']} D={r['D']}: " + ", ".join(f"{k} {v:.1e}" for k, v in r["err"].items()))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tcgnn_py.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["sgt", "spmm"])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--repeat", type=int, default=None, help="timed calls per median (sgt 10, spmm 50)")
    ap.add_argument("--dims", default="64,128", help="spmm: feature widths, comma-separated")
    ap.add_argument("--json", help="write all results to this file")
    args = ap.parse_args(argv)
    if args.what == "spmm":
        dims = tuple(int(d) for d in args.dims.split(","))
        rows = [r for g in args.graphs for r in bench_spmm(g, dims, args.repeat or 50)]
        _print_spmm(rows)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    rows = [bench_sgt(g, args.repeat or 10) for g in args.graphs]
    print(f"{'graph':<28}{'nnz':>12}{'SGT ms':>10}{'ns/edge':>9}{'host->tiled ms':>16}")
    for r in rows:
        print(f"{r['graph']:<28}{r['nnz']:>12,}{r['sgt_ms']:>10.3f}{r['sgt_ns_per_edge']:>9.2f}{r['from_host_ms']:>16.2f}")
    for r in rows:
        print(f"tile_stats {r['graph']}: {r['stats_str']}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
