"""tcgnn_py.distributed on GPUs with NCCL: threads (one process) and processes (the launcher).

Every GPU the machine has takes part; on a one-GPU machine the groups have one rank (the halo
logic is then covered by the reference tests only).
"""

import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import tcgnn_py as tg
from tcgnn_py import distributed as dist
from tcgnn_py._partition import balanced_bounds
from _env import GPU
import _dist_cases as cases

pytestmark = pytest.mark.gpu

N_GPUS = 0
if GPU:
    import cupy

    N_GPUS = cupy.cuda.runtime.getDeviceCount()
multi = pytest.mark.skipif(N_GPUS < 2, reason=f"needs 2 or more GPUs, this machine has {N_GPUS}")
WORKER = pathlib.Path(__file__).resolve().parent / "_dist_worker.py"


@pytest.mark.parametrize("halo", dist.HALO_MODES)
@pytest.mark.parametrize("graph", sorted(cases.GRAPHS))
def test_nccl_products_equal_whole(graph, halo):
    A = cases.GRAPHS[graph]()
    n = A.shape[0]
    X, G = cases.int_features(n, 5, 1), cases.int_features(n, 3, 2)
    res = dist.spmd(cases.products(A, X, G, halo=halo, repeats=2), N_GPUS)
    cases.check_products(res, A, X, G, balanced_bounds(A.indptr, N_GPUS))


@pytest.mark.parametrize("d", [1, 17, 64, 130, 256])
def test_nccl_wide_products_on_tensor_cores(d):
    A = tg.power_law_graph(20_001, 200_000, seed=9)
    X, G = cases.int_features(A.shape[0], d, 3), cases.int_features(A.shape[0], d, 4)

    def rank(ctx):
        D = dist.DistributedMatrix(A, ctx)
        r = D.row_slice
        return D.matmul(cupy.asarray(X[r]), precision="tf32").get(), D.rmatmul_t(cupy.asarray(G[r])).get()

    res = dist.spmd(rank, N_GPUS)
    np.testing.assert_array_equal(np.concatenate([r[0] for r in res]), A @ X)
    np.testing.assert_array_equal(np.concatenate([r[1] for r in res]), A.T @ G)


def test_nccl_gcn_gradients_equal_whole():
    A = cases.int_graph(3000, 0.003, 5)
    X = cases.int_features(3000, 6, 7)
    rng = np.random.default_rng(0)
    cases.check_gcn_grads(A, X, rng, np.float32, lambda rank: dist.spmd(rank, N_GPUS))


def test_nccl_training_agrees_with_one_gpu():
    g = tg.load_cora()
    S = cases.host_csr(tg.nn.gcn_norm(g.adj))
    X = g.features.toarray().astype(np.float32)
    split = (g.train_idx, g.val_idx, g.test_idx)

    def fresh():
        params = tg.nn.gcn_init((X.shape[1], 16, 7), np.random.default_rng(0))
        params = {k: cupy.asarray(v) for k, v in params.items()}
        return params, tg.nn.Adam(params, lr=0.01, weight_decay={"W0": 5e-4, "b0": 5e-4})

    params, opt = fresh()
    one = tg.nn.train(tg.nn.gcn_apply, params, tg.TiledMatrix(S), X, g.labels, split, opt, epochs=50, dropout_p=0.0)


    res = dist.spmd(cases.train_by_ranks(S, X, g.labels, split, fresh, 50, to_host_params=True), N_GPUS)
    for r, p in res:
        assert abs(r.final_loss - one.final_loss) < 1e-3 * abs(one.final_loss)  # TF32, another sum order
        assert abs(r.test_acc - one.test_acc) <= 0.01
        for k in p:
            np.testing.assert_array_equal(p[k], res[0][1][k])  # replicas stay bit-identical


@multi
def test_nccl_a_failing_thread_rank_aborts_the_group():
    A = cases.GRAPHS["power_law"]()

    def rank(ctx):
        D = dist.DistributedMatrix(A, ctx)
        if ctx.rank == 1:
            raise ZeroDivisionError("rank 1's own bug")
        return D.matmul(cupy.ones((D.n_own, 4), cupy.float32)).get()  # waits for rank 1's halo rows

    t0 = time.monotonic()
    with pytest.raises(ZeroDivisionError, match="rank 1's own bug"):
        dist.spmd(rank, N_GPUS, timeout=120)
    assert time.monotonic() - t0 < 60


def _launch(mode, env=None, timeout=240):
    return subprocess.run(
        [sys.executable, "-m", "tcgnn_py.distributed", "--nproc-per-node", str(N_GPUS), "--master-port", "0",
         "--grace", "5", str(WORKER), mode],
        capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})),
    )


@multi
def test_process_group_products_exact():
    r = _launch("products")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("products exact") == N_GPUS


@multi
def test_launcher_stops_the_group_when_a_rank_dies():
    t0 = time.monotonic()
    r = _launch("die")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "rank 1 exited with code 3; stopping the other ranks" in r.stderr
    assert time.monotonic() - t0 < 120


@multi
def test_a_stalled_collective_times_out_and_aborts():
    t0 = time.monotonic()
    r = _launch("stall", env={"TCGNN_PY_DIST_TIMEOUT": "5"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "DistributedTimeoutError" in r.stderr and "did not finish within 5 s" in r.stderr
    assert time.monotonic() - t0 < 100  # rank 1 sleeps 120 s: the timeout, not rank 1, ended the run
