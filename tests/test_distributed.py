"""tcgnn_py.distributed on the reference backend: simulated ranks in threads, NumPy, exact on integers."""

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp

import tcgnn_py as tg
from tcgnn_py import distributed as dist
from tcgnn_py.distributed._partition import balanced_bounds
import _dist_cases as cases


@pytest.mark.parametrize("halo_dtype", [None, "float16", "bfloat16"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("graph", sorted(cases.GRAPHS))
def test_products_by_ranks_equal_whole(graph, ranks, halo_dtype):
    """Exact on small integers, with float32 and 16-bit halo rows (16 bits hold them exactly)."""
    A = cases.GRAPHS[graph]()
    n = A.shape[0]
    X, G = cases.int_features(n, 5, 1), cases.int_features(n, 3, 2)
    res = dist.spmd(cases.products(A, X, G, repeats=2, halo_dtype=halo_dtype), ranks, backend="reference")
    cases.check_products(res, A, X, G, balanced_bounds(A.indptr, ranks))
    if ranks > 1 and graph != "isolated_rows":
        assert sum(r[0][3] for r in res) > 0  # a halo was exchanged at all


@pytest.mark.parametrize("method", ["metis", "lp"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_products_on_a_partition_equal_whole(method, ranks):
    pytest.importorskip("pymetis", reason="the partitioners need pymetis (the partition extra)")
    A = tg.planted_partition_graph(1500, 12000, communities=6, seed=2)
    n = A.shape[0]
    X, G = cases.int_features(n, 4, 1), cases.int_features(n, 2, 2)
    part = dist.partition(A, ranks, method, device="cpu")
    res = dist.spmd(cases.products(A, X, G, partition=part), ranks, backend="reference")
    cases.check_products(res, A, X, G, part.bounds)
    natural = dist.spmd(lambda ctx: dist.DistributedMatrix(A, ctx).n_halo, ranks, backend="reference")
    assert sum(r[0][3] for r in res) < 0.5 * sum(natural)  # the partition found the communities


def test_vector_operand_and_explicit_bounds():
    A = cases.GRAPHS["uniform_n1001"]()
    x = cases.int_features(A.shape[0], 1, 3)[:, 0]
    bounds = np.array([0, 10, 10, 600, A.shape[0]])  # an empty rank, uneven parts

    def rank(ctx):
        D = dist.DistributedMatrix(A, ctx, bounds=bounds)
        return D.matmul(x[D.global_rows]), D.rmatmul_t(x[D.global_rows])

    res = dist.spmd(rank, 4, backend="reference")
    np.testing.assert_array_equal(np.concatenate([r[0] for r in res]), A @ x)
    np.testing.assert_array_equal(np.concatenate([r[1] for r in res]), A.T @ x)
    assert res[1][0].shape == (0,)


def test_bad_inputs_raise_clear_errors():
    A = cases.GRAPHS["uniform_n1001"]()

    def rank(ctx, **kw):
        return dist.DistributedMatrix(A, ctx, **kw)

    with pytest.raises(ValueError, match="bounds must rise"):
        dist.spmd(rank, 2, backend="reference", kwargs={"bounds": [0, 5]})
    with pytest.raises(ValueError, match="halo_dtype must be one of"):
        dist.spmd(rank, 2, backend="reference", kwargs={"halo_dtype": "int8"})
    with pytest.raises(TypeError, match="bounds and partition both given"):
        dist.spmd(rank, 2, backend="reference", kwargs={"partition": "metis", "bounds": [0, 500, 1001]})
    with pytest.raises(ValueError, match="square"):
        dist.spmd(lambda ctx: dist.DistributedMatrix(sp.csr_array((3, 4)), ctx), 2, backend="reference")
    bad = sp.csr_array(A, copy=True)
    bad.indices[-1] = A.shape[0] + 3  # past the last column: would read no one's row
    with pytest.raises(ValueError, match="column index out of bounds"):
        dist.spmd(lambda ctx: dist.DistributedMatrix((bad.data, bad.indices, bad.indptr), ctx), 2,
                  backend="reference")

    def wrong_rows(ctx):
        D = dist.DistributedMatrix(A, ctx)
        return D.matmul(np.ones((A.shape[0], 2), np.float32))  # the whole X, not this rank's rows

    with pytest.raises(ValueError, match=r"matmul: dimension mismatch with signature \(n,k=\d+\),\(k=1001,m\)"):
        dist.spmd(wrong_rows, 2, backend="reference")


def test_collectives_reference():
    def rank(ctx):
        s = ctx.allreduce(np.array([ctx.rank, 1.0]))
        g = ctx.allgather(np.array([ctx.rank * 10]))
        recv = {q: np.empty(q + 1) for q in range(ctx.world_size) if q != ctx.rank}
        ctx.sendrecv({q: np.full(ctx.rank + 1, ctx.rank, float) for q in range(ctx.world_size) if q != ctx.rank},
                     recv)
        ctx.barrier()
        return s, g, recv

    res = dist.spmd(rank, 3, backend="reference")
    for r, (s, g, recv) in enumerate(res):
        assert s.tolist() == [3.0, 3.0] and g.ravel().tolist() == [0, 10, 20]
        assert {q: v.tolist() for q, v in recv.items()} == {q: [float(q)] * (q + 1) for q in range(3) if q != r}


def test_a_failing_rank_stops_the_others():
    def rank(ctx):
        if ctx.rank == 1:
            raise ZeroDivisionError("rank 1's own bug")
        ctx.allreduce(np.ones(1))  # would wait for rank 1 forever
        return "unreachable"

    t0 = time.monotonic()
    with pytest.raises(ZeroDivisionError, match="rank 1's own bug"):
        dist.spmd(rank, 3, backend="reference", timeout=60)
    assert time.monotonic() - t0 < 10  # aborted, not timed out


def test_a_stalled_rank_times_out():
    def rank(ctx):
        if ctx.rank == 0:
            ctx.allreduce(np.ones(1))  # rank 1 never joins
        else:
            time.sleep(3)

    with pytest.raises(dist.DistributedTimeoutError, match="did not finish within 0.5 s"):
        dist.spmd(rank, 2, backend="reference", timeout=0.5)


def test_gcn_gradients_by_ranks_equal_whole():
    A = cases.int_graph(300, 0.03, 5, directed=True)  # directed: the backward pass needs Aᵀ
    S = sp.csr_array(A.astype(np.float64))
    X = cases.int_features(300, 6, 7).astype(np.float64)
    rng = np.random.default_rng(0)
    cases.check_gcn_grads(S, X, rng, np.float64, lambda rank: dist.spmd(rank, 3, backend="reference"))


def test_agnn_runs_on_ranks():
    g = tg.load_cora()
    A = cases.host_csr(tg.nn.add_self_loops(g.adj, dtype=np.float64))
    X = g.features.toarray()[:, :32].astype(np.float64)
    params = tg.nn.agnn_init((32, 8, 7), np.random.default_rng(0), dtype=np.float64)
    T = tg.TiledMatrix(A, device="cpu")
    want_logits, vjp = tg.nn.agnn_apply(params, T, X, dropout_p=0.0)
    want = vjp(np.ones_like(want_logits))

    def rank(ctx):
        D = dist.DistributedMatrix(A, ctx)
        logits, vjp = tg.nn.agnn_apply(params, dist.DistributedEdges(D), X[D.global_rows], dropout_p=0.0)
        grads, _ = dist.allreduce_grads(ctx, vjp(np.ones_like(logits)))
        return logits, grads

    res = dist.spmd(rank, 3, backend="reference")
    np.testing.assert_allclose(np.concatenate([r[0] for r in res]), want_logits, rtol=1e-12, atol=1e-12)
    for k in want:
        np.testing.assert_allclose(res[0][1][k], want[k], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_gat_runs_on_ranks(ranks):
    """gat_conv and gat_apply on a distributed view (issue 46: a TypeError before): the attention's unfused
    sequence exchanges the halo rows of V and s_src, and s_src's gradient goes back to the columns' owners."""
    g = tg.load_cora()
    A = cases.host_csr(tg.nn.add_self_loops(g.adj, dtype=np.float64))
    X = g.features.toarray()[:, :24].astype(np.float64)
    params = tg.nn.gat_init((24, 4, 7), np.random.default_rng(0), heads=3, dtype=np.float64)
    T = tg.TiledMatrix(A, device="cpu")
    want_logits, vjp = tg.nn.gat_apply(params, T, X, dropout_p=0.0)
    want = vjp(np.ones_like(want_logits))
    rng = np.random.default_rng(1)
    H = rng.standard_normal((A.shape[0], 5))
    conv = [rng.standard_normal(s) for s in ((5, 6), (2, 3), (2, 3), (6,))]
    gout = rng.standard_normal((A.shape[0], 6))
    o1, v1 = tg.nn.gat_conv(T, H, *conv, heads=2)
    want_conv = (o1, v1(gout))

    def rank(ctx):
        D = dist.DistributedMatrix(A, ctx)
        E = dist.DistributedEdges(D)
        r = D.global_rows
        logits, vjp = tg.nn.gat_apply(params, E, X[r], dropout_p=0.0)
        grads, _ = dist.allreduce_grads(ctx, vjp(np.ones_like(logits)))
        out, cvjp = tg.nn.gat_conv(E, H[r], *conv, heads=2)
        dH, dW, da_src, da_dst, db = cvjp(gout[r])
        sums, _ = dist.allreduce_grads(ctx, dict(dW=dW, da_src=da_src, da_dst=da_dst, db=db))
        return logits, grads, out, dH, sums

    res = dist.spmd(rank, ranks, backend="reference")
    np.testing.assert_allclose(np.concatenate([r[0] for r in res]), want_logits, rtol=1e-12, atol=1e-12)
    for k in want:
        np.testing.assert_allclose(res[0][1][k], want[k], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([r[2] for r in res]), want_conv[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([r[3] for r in res]), want_conv[1][0], rtol=1e-10, atol=1e-12)
    for k, w in zip(("dW", "da_src", "da_dst", "db"), want_conv[1][1:]):
        np.testing.assert_allclose(res[0][4][k], w, rtol=1e-10, atol=1e-12)


def test_training_matches_one_device():
    g = tg.load_cora()
    S = cases.host_csr(tg.nn.gcn_norm(g.adj, dtype=np.float64))
    X = g.features.toarray().astype(np.float64)
    split = (g.train_idx, g.val_idx, g.test_idx)

    def fresh():
        params = tg.nn.gcn_init((X.shape[1], 16, 7), np.random.default_rng(0), dtype=np.float64)
        return params, tg.nn.Adam(params, lr=0.01, weight_decay={"W0": 5e-4, "b0": 5e-4})

    params, opt = fresh()
    one = tg.nn.train(tg.nn.gcn_apply, params, tg.TiledMatrix(S, device="cpu"), X, g.labels, split, opt,
                      epochs=15, dropout_p=0.0)


    res = dist.spmd(cases.train_by_ranks(S, X, g.labels, split, fresh, 15), 3, backend="reference")
    for r, p in res:
        assert r.test_acc == one.test_acc and r.best_epoch == one.best_epoch
        assert abs(r.final_loss - one.final_loss) < 1e-9
        for k in params:
            np.testing.assert_allclose(p[k], params[k], rtol=1e-9, atol=1e-12)
            np.testing.assert_array_equal(p[k], res[0][1][k])  # replicas stay bit-identical


def test_nccl_communicator_is_torn_down_once():
    """The rank's thread, the watchdog, a failing peer and the group's teardown may all abort one rank at once.

    CuPy's abort / destroy release the GIL in the NCCL call and forget the handle after it: two concurrent
    calls freed it twice (heap corruption at exit on 2 H200s). Here the NCCL call takes time, and only one
    call must reach the communicator, whatever the mix."""
    from tcgnn_py.distributed._nccl import NcclContext

    class SlowComm:
        def __init__(self):
            self.calls = []

        def abort(self):
            self.calls.append("abort")
            time.sleep(0.05)  # the GIL is free meanwhile, as in CuPy

        def destroy(self):
            self.calls.append("destroy")

    ctx = NcclContext.__new__(NcclContext)  # no GPU: the teardown state only
    dist.Context.__init__(ctx, 0, 2, 1.0)
    ctx.comm, ctx._host_barrier, ctx._wake, ctx._stop, ctx.job = SlowComm(), None, False, threading.Event(), None
    ctx._init_teardown()
    threads = [threading.Thread(target=ctx.abort, args=(dist.DistributedError(f"from {i}"),)) for i in range(4)]
    threads += [threading.Thread(target=ctx._abort_comm) for _ in range(2)]
    for t in threads:
        t.start()
    ctx.close()
    for t in threads:
        t.join()
    ctx.close()
    assert len(ctx.comm.calls) == 1  # abort, or destroy where close() came first
    assert str(ctx.failed).startswith("from ")  # the first error recorded stays


def test_float16_halos_out_of_range_are_an_error_naming_the_rank():
    A = cases.GRAPHS["power_law"]()
    X = np.full((A.shape[0], 3), 1e6, np.float32)

    def rank(ctx):
        D = dist.DistributedMatrix(A, ctx, halo_dtype="float16")
        return D.matmul(X[D.global_rows])

    with pytest.raises(ValueError, match=r"rank \d: a halo row holds a finite value beyond float16's range"):
        dist.spmd(rank, 2, backend="reference", timeout=10)
    ok = dist.spmd(lambda ctx: dist.DistributedMatrix(A, ctx, halo_dtype="bfloat16").matmul(
        X[dist.DistributedMatrix(A, ctx).global_rows]), 2, backend="reference")  # bfloat16 has float32's range
    assert all(np.isfinite(y).all() for y in ok)


def test_ranks_given_different_partitions_raise_instead_of_reading_outside_their_rows():
    """Partitions computed on each rank need not agree (two ranks once drew different graphs from one seed, and
    partitioned them differently): the build compares the ranks' partitions and raises on every rank, before any
    rank asks a peer for rows it does not have."""
    A = cases.GRAPHS["uniform_n1001"]()
    n = A.shape[0]
    rng = np.random.default_rng(0)
    mine = [dist.Partition(tg.Permutation(np.arange(n)), balanced_bounds(A.indptr, 2), "none", 0.0),
            dist.Partition(tg.Permutation(rng.permutation(n)), np.array([0, 400, n]), "none", 0.0)]
    with pytest.raises(ValueError, match=r"different row partitions \(ranks \[1\] differ from rank 0"):
        dist.spmd(lambda ctx: dist.DistributedMatrix(A, ctx, partition=mine[ctx.rank]), 2, backend="reference")
    same_bounds = [mine[0], dist.Partition(mine[1].permutation, mine[0].bounds, "none", 0.0)]  # permutation only
    with pytest.raises(ValueError, match="different row partitions"):
        dist.spmd(lambda ctx: dist.DistributedMatrix(A, ctx, partition=same_bounds[ctx.rank]), 2,
                  backend="reference")


def test_a_partition_method_runs_on_rank_0_and_every_rank_uses_its_answer(monkeypatch):
    """``partition="metis"`` etc.: one rank partitions and sends the answer, so ranks cannot end up with different
    ones (here a partitioner that answers differently on every call)."""
    from tcgnn_py.distributed import _matrix

    A = cases.GRAPHS["uniform_n1001"]()
    n = A.shape[0]
    calls = []

    def fickle(csr, parts, method):
        calls.append(method)
        perm = np.random.default_rng(len(calls)).permutation(n)
        return dist.Partition(tg.Permutation(perm), np.array([0, 300 + len(calls), 700, n]), "lp", 1.5)

    monkeypatch.setattr(_matrix, "find_partition", fickle)
    X, G = cases.int_features(n, 4, 1), cases.int_features(n, 2, 2)
    res = dist.spmd(cases.products(A, X, G, partition="lp"), 3, backend="reference")
    assert calls == ["lp"]  # rank 0 only
    cases.check_products(res, A, X, G, np.array([0, 301, 700, n]))
    np.testing.assert_array_equal(np.concatenate([r[0][4] for r in res]), np.random.default_rng(1).permutation(n))
    got = dist.spmd(lambda ctx: _matrix._shared_partition(ctx, None, n, "lp"), 3, backend="reference")
    assert [(g.method, g.seconds) for g in got] == [("lp", 1.5)] * 3
    assert all(np.array_equal(g.permutation.perm, got[0].permutation.perm) for g in got)
