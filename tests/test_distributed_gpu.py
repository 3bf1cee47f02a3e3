"""tcgnn_py.distributed on GPUs with NCCL: threads (one process) and processes launched by MPI.

Every GPU the machine has takes part; on a one-GPU machine the groups have one rank (the halo
logic is then covered by the reference tests only).
"""

import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

#: Open MPI refuses to start as root (the GPU machine's user) without both variables; MPICH ignores them.
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

import tcgnn_py as tg
from tcgnn_py import distributed as dist
from tcgnn_py.distributed._partition import balanced_bounds
from _env import GPU, WARMED_THEN_TRANSLATED
import _dist_cases as cases

pytestmark = pytest.mark.gpu

N_GPUS = 0
if GPU:
    import cupy

    N_GPUS = cupy.cuda.runtime.getDeviceCount()
multi = pytest.mark.skipif(N_GPUS < 2, reason=f"needs 2 or more GPUs, this machine has {N_GPUS}")
try:
    import mpi4py  # noqa: F401

    MPIRUN = shutil.which("mpirun") or shutil.which("mpiexec")
except ImportError:
    MPIRUN = None
mpi = pytest.mark.skipif(MPIRUN is None, reason="needs mpi4py and mpirun (pip install 'tcgnn_py[mpi]')")
WORKER = pathlib.Path(__file__).resolve().parent / "_mpi_worker.py"


@pytest.mark.parametrize("halo_dtype", [None, "float16", "bfloat16"])
@pytest.mark.parametrize("graph", sorted(cases.GRAPHS))
def test_nccl_products_equal_whole(graph, halo_dtype):
    A = cases.GRAPHS[graph]()
    n = A.shape[0]
    X, G = cases.int_features(n, 5, 1), cases.int_features(n, 3, 2)
    res = dist.spmd(cases.products(A, X, G, repeats=2, halo_dtype=halo_dtype), N_GPUS)
    cases.check_products(res, A, X, G, balanced_bounds(A.indptr, N_GPUS))


def test_a_seeded_graph_drawn_on_the_gpu_is_the_same_on_every_gpu_and_every_draw():
    """Ranks draw the benchmark's graph on their own GPUs from one seed: it must be the same graph (a float scan on
    the GPU is not associative from run to run; two H100s drew different 240M-edge graphs)."""
    import cupy

    draws = []
    for i in range(3):
        with cupy.cuda.Device(i % N_GPUS):
            A = tg.planted_partition_graph(4_000_000, 8_000_000, communities=16, seed=7, device="cuda")
            draws.append((A.indices.get(), A.indptr.get()))
    for indices, indptr in draws[1:]:
        np.testing.assert_array_equal(indptr, draws[0][1])
        np.testing.assert_array_equal(indices, draws[0][0])


def test_nccl_products_on_a_partition():
    pytest.importorskip("pymetis", reason="the partitioners need pymetis")
    A = tg.planted_partition_graph(20_000, 200_000, communities=8, seed=3)
    X, G = cases.int_features(A.shape[0], 64, 1), cases.int_features(A.shape[0], 16, 2)
    for method in ("metis", "lp"):
        part = dist.partition(A, N_GPUS, method)  # "lp" on the GPU
        res = dist.spmd(cases.products(A, X, G, partition=part), N_GPUS)
        cases.check_products(res, A, X, G, part.bounds)


def test_nccl_halo_float16_out_of_range_is_an_error():
    A = cases.GRAPHS["power_law"]()
    X = np.full((A.shape[0], 4), 1e6, np.float32)

    def rank(ctx):
        D = dist.DistributedMatrix(A, ctx, halo_dtype="float16")
        return D.matmul(cupy.asarray(X[D.global_rows])).get()

    if N_GPUS == 1:  # one rank exchanges nothing: nothing to round
        dist.spmd(rank, 1)
        return
    with pytest.raises(ValueError, match="beyond float16's range"):
        dist.spmd(rank, N_GPUS, timeout=60)


def test_nccl_one_gpu_takes_x_as_it_is():
    """One rank: the product reads X in place (no operand buffer) and equals the plain product bit for bit."""
    A = tg.power_law_graph(20_001, 200_000, seed=9)
    X = cupy.asarray(cases.int_features(A.shape[0], 64, 3))

    def rank(ctx):
        D = dist.DistributedMatrix(A, ctx)
        return D.matmul(X).get(), D._buffers

    (Y, buffers), = dist.spmd(rank, 1)
    np.testing.assert_array_equal(Y, (tg.TiledMatrix(A) @ X).get())
    assert buffers == {}


_TWO_DEVICES = """
import cupy, numpy as np
from numba.cuda.cudadrv import devices
from tcgnn_py.kernels import sgt as k
from tcgnn_py.kernels.launch import THREADS_PER_BLOCK, grid, launch_numba
for d in (0, 1):
    with cupy.cuda.Device(d):
        count = cupy.zeros(4, np.int32)
        launch_numba(k.transpose_count, grid(5), THREADS_PER_BLOCK, cupy.asarray(np.array([3, 0, 3, 1, 3], np.int32)),
                     count)
        assert count.get().tolist() == [1, 1, 0, 3], count
held = [{int(h) for h in g.primary_context.modules} if g.primary_context else set() for g in devices.gpus]
print(len(held[0] & held[1]), sum(map(len, held)))
"""


@multi
def test_numba_loads_a_kernels_module_on_one_gpu_of_two():
    """A kernel launched on two GPUs is Numba's module in one context, the other launches its cubin through CuPy:
    numba-cuda keeps one library per cubin and unloads it once per context that loaded it, at exit, which aborted
    a process that had used two GPUs (``free(): invalid pointer``) after its work was done."""
    r = subprocess.run([sys.executable, "-c", _TWO_DEVICES], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    shared, loaded = (int(v) for v in r.stdout.split())
    assert shared == 0 and loaded >= 1, r.stdout  # (no library in both contexts; the kernel's in one)


@multi
def test_kernels_compiled_in_the_background_on_one_gpu_run_on_another_through_cupy_only(tmp_path):
    """The translation's kernels compiled by the background compile for GPU 0 (a compile loads its module there, a
    read of Numba's disk cache does not), then a translation on GPU 1: every launch takes Numba's cubin through
    CuPy, so no module of Numba's is loaded on GPU 1 (numba-cuda unloads a library once per context that loaded
    it, at exit: one in both aborts the process)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    for run in ("compiled", "read from Numba's cache"):
        r = subprocess.run([sys.executable, "-c", WARMED_THEN_TRANSLATED, "1"], capture_output=True, text=True,
                           timeout=300, env=env)
        assert r.returncode == 0, (run, r.stderr[-3000:])  # (a library in both contexts aborts at exit)
        on_0, on_1 = (int(v) for v in r.stdout.split()[:2])
        assert on_1 == 0 and (on_0 > 0) == (run == "compiled"), (run, r.stdout)


@pytest.mark.parametrize("d", [1, 17, 64, 130, 256])
def test_nccl_wide_products_on_tensor_cores(d):
    A = tg.power_law_graph(20_001, 200_000, seed=9)
    X, G = cases.int_features(A.shape[0], d, 3), cases.int_features(A.shape[0], d, 4)

    def rank(ctx):
        D = dist.DistributedMatrix(A, ctx)
        r = D.global_rows
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


def _mpirun(mode, env=None, timeout=300):
    root = str(pathlib.Path(__file__).resolve().parents[1])
    e = dict(os.environ, PYTHONUNBUFFERED="1", **AS_ROOT, **(env or {}))
    e["PYTHONPATH"] = root + os.pathsep + e.get("PYTHONPATH", "")
    t0 = time.monotonic()
    r = subprocess.run([MPIRUN, "-n", str(N_GPUS), sys.executable, str(WORKER), mode, "nccl"],
                       capture_output=True, text=True, timeout=timeout, env=e,
                       start_new_session=True)  # MPI_Abort may signal its process group: not other jobs'
    return r, time.monotonic() - t0


@mpi
@multi
def test_mpi_processes_load_their_rows_and_products_are_exact(tmp_path):
    import _mpi_worker as w

    pytest.importorskip("pymetis", reason="the rows are written partitioned by METIS")
    dist.save_rows(w.graph(), tmp_path, N_GPUS, partition="metis")
    r, _ = _mpirun("products", {"TCGNN_PY_ROWS": str(tmp_path)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("products exact") == N_GPUS


@mpi
@multi
@pytest.mark.parametrize("mode", ["raise", "exit", "kill", "stall"])
def test_mpi_a_failing_rank_ends_the_job_naming_it(mode):
    r, seconds = _mpirun(mode, {"TCGNN_PY_DIST_TIMEOUT": "5"})
    text = r.stdout + r.stderr
    assert r.returncode != 0 and "unreachable" not in text, text
    assert "Segmentation fault" not in text and "signal 11" not in text, text
    if mode == "kill":
        assert "rank 1" in text and ("signal 9" in text or "Killed" in text), text
    elif mode == "raise":
        assert "rank 1 failed (ZeroDivisionError: rank 1's own bug)" in text, text
    elif mode == "exit":  # whichever aborts first: the others' watchdogs, or rank 1 waiting for them at exit
        assert "rank(s) [1] never reached it" in text or "rank 1 is exiting" in text, text
    else:
        assert "rank(s) [1] never reached it" in text, text
    assert seconds < 5 + 60, seconds  # rank 1 sleeps 120 s: the timeout, not rank 1, ended the run
