"""Issue 20 scaling tables: row-partitioned SpMM and GCN epochs on 1..P GPUs (one process, NCCL).

    python3 tools/dist_bench.py --nodes 20000000 --edges 400000000 --gpus 1 2 --out results.json

Graph: Chung-Lu power law (exponent 2.1, as ``tg.power_law_graph``), drawn on the GPU so that a
400M-edge graph takes seconds; binary values, node ids shuffled.  Times: CUDA events per rank,
median of ``--reps`` after a warm-up, the slowest rank's median reported; every product starts
after a barrier-free halo exchange, so ranks wait on each other inside it as in training.
"""

import argparse
import json
import time

import numpy as np


def power_law_csr(cp, n, m, seed, exponent=2.1):
    """``(data, indices, indptr)`` on the current GPU: about ``m`` distinct directed edges."""
    rs = cp.random.RandomState(seed)
    w = cp.arange(1, n + 1, dtype=cp.float64) ** (-1.0 / (exponent - 1.0))
    cdf = cp.cumsum(w)
    cdf /= cdf[-1]
    relabel = cp.asarray(np.random.default_rng(seed).permutation(n).astype(np.int64))
    keys = cp.zeros(0, cp.int64)
    while keys.shape[0] < m:
        k = int((m - keys.shape[0]) * 1.15) + 16
        ends = cp.searchsorted(cdf, rs.random_sample((2, k)), side="right").clip(max=n - 1)
        keys = cp.unique(cp.concatenate((keys, relabel[ends[0]] * n + relabel[ends[1]])))
        del ends
    keys = keys[cp.sort(rs.permutation(keys.shape[0])[:m])]
    src, dst = keys // n, (keys % n).astype(cp.int32)
    indptr = cp.searchsorted(src, cp.arange(n + 1, dtype=cp.int64)).astype(cp.int64)
    return cp.ones(dst.shape[0], cp.float32), dst, indptr


def gcn_normalize(cp, data, indices, indptr):
    """``D^-1/2 (A + I) D^-1/2`` with ``D`` the row sums of ``A + I`` (float32 CSR on the GPU)."""
    import cupyx.scipy.sparse as csp

    n = indptr.shape[0] - 1
    A = csp.csr_matrix((data, indices, indptr), shape=(n, n)) + csp.identity(n, dtype=cp.float32, format="csr")
    A = A.tocsr()
    deg = cp.diff(A.indptr).astype(cp.float32)  # binary A: row sums are the degrees
    inv = deg ** -0.5
    rows = cp.searchsorted(A.indptr, cp.arange(A.nnz), side="right") - 1
    vals = inv[rows] * A.data * inv[A.indices]
    return vals.astype(cp.float32), A.indices, A.indptr


def timed(fn, reps):
    """Median seconds of ``fn()`` between CUDA events, after one warm-up call."""
    from tcgnn_py.bench import time_events

    return time_events(fn, reps, warmup=1)[0] / 1e3


def spmm_rank(csr, d, reps, halo):
    def rank(ctx):
        import cupy as cp
        from tcgnn_py import distributed as dist

        t0 = time.perf_counter()
        D = dist.DistributedMatrix(csr, ctx, halo=halo)
        ctx.synchronize()
        build = time.perf_counter() - t0
        X = cp.random.default_rng(ctx.rank).standard_normal((D.n_own, d), dtype=cp.float32)
        t_total = timed(lambda: D.matmul(X), reps)
        buf = D.operand(X)
        t_operand = timed(lambda: D.operand(X), reps)  # X's rows into the buffer, then the halo exchange
        t_local = timed(lambda: D.local @ buf, reps)
        t_back = timed(lambda: D.rmatmul_t(X), reps)
        return dict(rank=ctx.rank, rows=D.n_own, nnz=D.local.nnz, halo=D.n_halo, build_s=build,
                    spmm_s=t_total, operand_s=t_operand, local_s=t_local, spmm_t_s=t_back)

    return rank


def gcn_rank(csr, dims, epochs, seed=0):
    def rank(ctx):
        import cupy as cp
        import tcgnn_py as tg
        from tcgnn_py import distributed as dist

        D = dist.DistributedMatrix(csr, ctx)
        rng = cp.random.default_rng(100 + ctx.rank)
        X = rng.standard_normal((D.n_own, dims[0]), dtype=cp.float32)
        labels = rng.integers(0, dims[-1], D.n_own)
        train = cp.nonzero(rng.random(D.n_own) < 0.1)[0]
        params = tg.nn.gcn_init(dims, np.random.default_rng(seed))
        params = {k: cp.asarray(v) for k, v in params.items()}
        opt = tg.nn.Adam(params, lr=0.01)
        r = dist.train(ctx, tg.nn.gcn_apply, params, D, X, labels, (train, train[:0], train[:0]), opt,
                       epochs=epochs, rng=rng, evaluate=False)
        return dict(rank=ctx.rank, epoch_s=float(np.median(r.epoch_times[1:])), first_epoch_s=r.epoch_times[0])

    return rank


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=20_000_000)
    ap.add_argument("--edges", type=int, default=400_000_000)
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--halo", nargs="+", default=["sendrecv", "allgather"])
    ap.add_argument("--gcn", type=str, default="128,64,16", help="layer widths; empty to skip")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--tag", default="")
    ap.add_argument("--no-spmm", dest="spmm", action="store_false", help="GCN epochs only")
    ap.add_argument("--out", default=None)
    ap.add_argument("--hang-dump", type=float, default=0, help="dump every thread's stack and exit after this many s")
    a = ap.parse_args()
    if a.hang_dump:
        import faulthandler

        faulthandler.dump_traceback_later(a.hang_dump, exit=True)
    import cupy as cp
    from tcgnn_py import distributed as dist

    t0 = time.perf_counter()
    with cp.cuda.Device(0):
        csr = power_law_csr(cp, a.nodes, a.edges, seed=1)
        cp.cuda.get_current_stream().synchronize()
        cp.get_default_memory_pool().free_all_blocks()  # NCCL allocates outside CuPy's pool
    gen = time.perf_counter() - t0
    nnz = int(csr[1].shape[0])
    print(f"graph {a.tag}: {a.nodes} nodes, {nnz} edges, generated in {gen:.1f} s", flush=True)
    rows = []
    for g in (a.gpus if a.spmm else []):
        for halo in (a.halo if g > 1 else a.halo[:1]):
            res = dist.spmd(spmm_rank(csr, a.d, a.reps, halo), g)
            slow = {k: max(r[k] for r in res) for k in ("spmm_s", "exchange_s", "local_s", "spmm_t_s", "build_s")}
            row = dict(kind="spmm", tag=a.tag, nodes=a.nodes, nnz=nnz, gpus=g, halo=halo, d=a.d, **slow,
                       halo_rows=[r["halo"] for r in res], part_nnz=[r["nnz"] for r in res])
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.gcn:
        dims = tuple(int(x) for x in a.gcn.split(","))
        with cp.cuda.Device(0):
            ncsr = gcn_normalize(cp, *csr)
        del csr
        with cp.cuda.Device(0):
            cp.get_default_memory_pool().free_all_blocks()
        for g in a.gpus:
            res = dist.spmd(gcn_rank(ncsr, dims, a.epochs), g)
            row = dict(kind="gcn", tag=a.tag, nodes=a.nodes, nnz=int(ncsr[1].shape[0]), gpus=g, dims=dims,
                       epoch_s=max(r["epoch_s"] for r in res), first_epoch_s=max(r["first_epoch_s"] for r in res))
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
