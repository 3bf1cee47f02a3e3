"""One process of an MPI job (``mpiexec -n P python tests/_mpi_worker.py MODE [BACKEND]``) for the distributed tests.

``products``: each rank loads its rows from a folder written by ``save_rows`` (``TCGNN_PY_ROWS``), partitioned, and
checks its rows of A @ X, Aᵀ @ G and a GCN's logits and gradients against scipy on the whole graph, exactly;
``raise`` / ``exit`` / ``kill`` / ``stall``: rank 1 fails that way after one collective while the others wait
in the next one.  BACKEND: ``reference`` (host ranks, MPI collectives) or ``nccl`` (one GPU per rank).
"""

import os
import pathlib
import signal
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

import tcgnn_py as tg  # noqa: E402
from tcgnn_py import distributed as dist  # noqa: E402

GRAPH = dict(n_nodes=3000, n_edges=24000, communities=6, seed=5)


def graph():
    return tg.planted_partition_graph(**GRAPH)


def products(ctx):
    from tcgnn_py._device import to_host

    A = graph()
    n = A.shape[0]
    rng = np.random.default_rng(1)
    X, G = rng.integers(-8, 9, (n, 17)).astype(np.float32), rng.integers(-8, 9, (n, 5)).astype(np.float32)
    folder = os.environ["TCGNN_PY_ROWS"]
    for halo_dtype in (None, "float16"):
        D = dist.load_rows(folder, ctx, halo_dtype=halo_dtype)
        rows = D.global_rows
        xp = ctx.xp
        Y = to_host(D.matmul(xp.asarray(X[rows])))
        Z = to_host(D.rmatmul_t(xp.asarray(G[rows])))
        np.testing.assert_array_equal(Y, (A @ X)[rows])
        np.testing.assert_array_equal(Z, (A.T @ G)[rows])
    # A GCN's forward and backward on the ranks' rows against the whole graph's (CUDA cores: exact).
    S = sp.csr_array(A.astype(np.float32))
    Xf = rng.integers(-2, 3, (n, 6)).astype(np.float32)
    params = {"W0": rng.integers(-2, 3, (6, 4)).astype(np.float32), "b0": np.arange(4, dtype=np.float32),
              "W1": rng.integers(-2, 3, (4, 3)).astype(np.float32), "b1": np.ones(3, np.float32)}
    T = tg.TiledMatrix(S, device="cpu")
    want_logits, vjp = tg.nn.gcn_apply(params, T, Xf, dropout_p=0.0)
    want = vjp(np.ones_like(want_logits))
    D = dist.load_rows(folder, ctx)
    E = dist.DistributedEdges(D, precision="fp32")
    p = {k: ctx.xp.asarray(v) for k, v in params.items()}
    logits, vjp = tg.nn.gcn_apply(p, E, ctx.xp.asarray(Xf[D.global_rows]), dropout_p=0.0)
    grads, _ = dist.allreduce_grads(ctx, vjp(ctx.xp.ones_like(logits)))
    np.testing.assert_array_equal(to_host(logits), want_logits[D.global_rows])
    for k in want:
        np.testing.assert_array_equal(to_host(grads[k]), want[k])
    ctx.barrier()
    print(f"rank {ctx.rank} of {ctx.world_size}: products exact", flush=True)


def main(mode, backend):
    ctx = dist.init(backend=backend)
    if mode == "products":
        products(ctx)
    else:
        ctx.barrier()  # everyone joined
        if ctx.rank == 1:
            if mode == "raise":
                raise ZeroDivisionError("rank 1's own bug")
            if mode == "exit":
                sys.exit(3)
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "stall":
                time.sleep(120)
        ctx.barrier()  # would wait for rank 1 forever
        print(f"rank {ctx.rank}: unreachable", flush=True)
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "reference")
