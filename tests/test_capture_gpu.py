"""Launch-bound paths on the GPU: CUDA-graph capture and replay, streams, cached products, cheap Numba launches.

Replays must be *correct*, not just fast: every test compares a replay with
the eager computation (exact, small-integer data) or with N eager steps bit
for bit, and checks that the graph holds the library's kernels.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from _env import WARMED_THEN_TRANSLATED, cupy_fixture, int_graph, ints
import tcgnn_py as tg

pytestmark = pytest.mark.gpu

LAYOUTS = ["tcgnn", "vector"]


cp = cupy_fixture()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_replayed_products_follow_new_inputs(cp, layout):
    rng = np.random.default_rng(0)
    A = int_graph(rng, 1003, 997, degree=10, dtype=np.float32)
    T = tg.TiledMatrix(A, layout=layout)
    X, Xt = cp.asarray(ints(rng, 997, 64)), cp.asarray(ints(rng, 1003, 64))
    Y = cp.empty((1003, 64), np.float32)
    # Warm-up: plans every launch (host reads), which capture cannot hold.
    tg.spmm(T, X, out=Y), T @ X, T.T @ Xt, tg.sddmm(T, Xt, X)
    g = tg.CUDAGraph()
    with g.capture():
        tg.spmm(T, X, out=Y)
        Z = T @ X
        Zt = T.T @ Xt
        E = tg.sddmm(T, Xt, X, multiply_values=True)
    for _ in range(3):
        x, xt = ints(rng, 997, 64), ints(rng, 1003, 64)
        X[...], Xt[...] = cp.asarray(x), cp.asarray(xt)
        Y.fill(np.nan), Z.fill(np.nan), Zt.fill(np.nan)
        g.replay()
        np.testing.assert_array_equal(Y.get(), A @ x)
        np.testing.assert_array_equal(Z.get(), A @ x)
        np.testing.assert_array_equal(Zt.get(), A.T @ xt)
        want = A.multiply(xt.astype(np.float64) @ x.T.astype(np.float64)).tocsr()
        np.testing.assert_array_equal(E.tocsr().toarray(), want.toarray())
    names = " ".join(g.kernel_names)
    assert names.count("tcgnn_spmm") >= 3 and "sddmm" in names, g.kernel_names


def test_capture_refuses_host_reads(cp):
    # Building a TiledMatrix reads the device (and copies from the host): capture raises instead of skipping.
    A = int_graph(np.random.default_rng(0), 100, 100, degree=10, dtype=np.float32)
    g = tg.CUDAGraph()
    with pytest.raises(RuntimeError):
        with g.capture():
            tg.TiledMatrix(A)
    with pytest.raises(RuntimeError, match="nothing captured"):
        g.replay()


def test_replayed_dropout_draws_fresh_masks(cp):
    H = cp.ones((64, 32), np.float32)
    rng = cp.random.default_rng(5)
    tg.nn.dropout(H, 0.5, rng)
    g = tg.CUDAGraph()
    with g.capture():
        out, _ = tg.nn.dropout(H, 0.5, rng)
    masks = []
    for _ in range(3):
        g.replay()
        masks.append(out.get())
    eager = cp.random.default_rng(5)
    want = [tg.nn.dropout(H, 0.5, eager)[0].get() for _ in range(4)][1:]
    assert not (masks[0] == masks[1]).all()
    for got, w in zip(masks, want):
        np.testing.assert_array_equal(got, w)


def test_blas_matmul_matches_cupy(cp):
    from tcgnn_py.kernels.blas import matmul

    rng = np.random.default_rng(0)
    for m, k, n in ((1, 1, 1), (7, 300, 16), (2708, 1433, 16), (16, 2708, 7), (5, 0, 3)):
        a = cp.asarray(ints(rng, m, k))
        b = cp.asarray(ints(rng, k, n))
        want = a.get().astype(np.float64) @ b.get().astype(np.float64)
        for _ in range(2):  # planned, then bound: each signature's second call takes the bound path
            for x, y in ((a, b), (cp.asfortranarray(a), b), (a, cp.asfortranarray(b)), (a.T.copy().T, b.T.copy().T)):
                np.testing.assert_array_equal(matmul(x, y).get(), want)
        np.testing.assert_array_equal(matmul(a.astype(np.float16), b).get(), want)  # promoted, as CuPy's @
        np.testing.assert_array_equal(matmul(a.astype(np.float64), b.astype(np.float64)).get(), want)
        # Operands at addresses aligned to 4 bytes only (a row slice): the planned algorithm must allow them.
        a1 = cp.asarray(ints(rng, m + 1, k))[1:]
        for _ in range(2):
            np.testing.assert_array_equal(matmul(a1, b).get(),
                                          a1.get().astype(np.float64) @ b.get().astype(np.float64))
            np.testing.assert_array_equal(matmul(a, b).get(), want)  # the shape's plan again: the same result


def _setup(model, seed, layout=None):
    g = tg.load_cora()
    X = g.features.toarray().astype(np.float32)
    if model == "gcn":
        A = tg.nn.gcn_norm(g.adj, layout=layout)
        rng = tg.nn.default_rng(seed, like=A)
        params = tg.nn.gcn_init((X.shape[1], 16, 7), rng)
        apply = tg.nn.gcn_apply
    else:
        A = tg.nn.add_self_loops(g.adj, layout=layout)
        rng = tg.nn.default_rng(seed, like=A)
        params = tg.nn.agnn_init((X.shape[1], 16, 7), rng)
        apply = tg.nn.agnn_apply
    opt = tg.nn.Adam(params, lr=0.01, weight_decay=5e-4)
    return apply, params, A, X, g, opt, rng


@pytest.mark.parametrize("dtype", [None, "float16"])
@pytest.mark.parametrize("model", ["gcn", "agnn"])
def test_graph_training_equals_eager_bit_for_bit(cp, model, dtype):
    runs = []
    for cuda_graph in (False, True):
        apply, params, A, X, g, opt, rng = _setup(model, seed=3, layout="vector" if dtype else None)
        r = tg.nn.train(apply, params, A, X, g.labels, (g.train_idx, g.val_idx, g.test_idx), opt,
                        epochs=7, rng=rng, cuda_graph=cuda_graph, dtype=dtype)
        runs.append((r, {k: v.get() for k, v in params.items()}, opt.t))
    (r0, p0, t0), (r1, p1, t1) = runs
    assert t0 == t1 == 7
    assert r0.final_loss == r1.final_loss
    assert (r0.test_acc, r0.val_acc, r0.best_epoch) == (r1.test_acc, r1.val_acc, r1.best_epoch)
    for k in p0:
        np.testing.assert_array_equal(p0[k], p1[k], err_msg=k)


def test_eager_training_repeats_bit_for_bit(cp):
    # AGNN's row sums used float atomics; they are an exact product now, so two runs are identical.
    out = []
    for _ in range(2):
        apply, params, A, X, g, opt, rng = _setup("agnn", seed=1)
        tg.nn.train(apply, params, A, X, g.labels, (g.train_idx, g.val_idx, g.test_idx), opt, epochs=3,
                    rng=rng, evaluate=False)
        out.append({k: v.get() for k, v in params.items()})
    for k in out[0]:
        np.testing.assert_array_equal(out[0][k], out[1][k], err_msg=k)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_products_and_sgt_on_a_user_stream(cp, layout):
    rng = np.random.default_rng(0)
    A = int_graph(rng, 2000, 1500, degree=10, dtype=np.float32)
    x = ints(rng, 1500, 32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        T = tg.TiledMatrix(A, layout=layout)  # Numba SGT kernels on s
        X = cp.asarray(x)
        Y = T @ X
        Yt = T.T @ cp.asarray(A @ x, dtype=np.float32)
        E = tg.sddmm(T, cp.asarray(ints(rng, 2000, 32)), X)
    s.synchronize()
    np.testing.assert_array_equal(Y.get(), A @ x)
    np.testing.assert_array_equal(Yt.get(), A.T @ (A @ x))
    assert E.nnz == A.nnz
    ref = tg.TiledMatrix(A, layout=layout, device="cpu")
    for k in ("win_ptr", "block_cols", "block_ptr", "tile_pos", "perm"):
        np.testing.assert_array_equal(getattr(T.tiling, k).get(), getattr(ref.tiling, k), err_msg=k)


#: Split windows summed by a second (fixup) launch, which the cached path binds too (the vector layout: 16x8
#: tiles sum them in the launch always).
FIXUP_TUNING = {"vector": dict(vec_blocks_per_unit=2, vec_combine=False, vec_timed_choice=False)}


@pytest.fixture(params=["in-launch sums", "fixup launch"])
def split_sums(request):
    return {} if request.param == "in-launch sums" else FIXUP_TUNING


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cached_products_follow_signatures(cp, layout, split_sums):
    # The per-signature cache must never answer for a different signature, values or aliasing.
    if split_sums and layout not in split_sums:
        pytest.skip("16x8 tiles sum split windows inside the launch: no fixup launch to bind")
    with tg.tuning(**(split_sums[layout] if split_sums else {})):
        _check_cached_products(cp, layout, split_sums)


def _check_cached_products(cp, layout, split_sums):
    rng = np.random.default_rng(0)
    A = int_graph(rng, 501, 499, degree=10, dtype=np.float32)
    T = tg.TiledMatrix(A, layout=layout)
    for D in (16, 16, 17, 16, 64):
        x = ints(rng, 499, D)
        for _ in range(2):  # the second call takes the cached path
            np.testing.assert_array_equal((T @ cp.asarray(x)).get(), A @ x)
    if split_sums:
        launches = [v for _, v in T.tiling.cached_items("launch")]
        assert launches and all(launch.then is not None for launch in launches)
    big = cp.asarray(ints(rng, 499, 65))
    view = big[:, 1:]  # not 16-byte aligned, not contiguous
    for _ in range(2):
        np.testing.assert_array_equal((T @ view).get(), A @ view.get())
    v = rng.integers(1, 5, A.nnz).astype(np.float32)
    T2 = T.with_values(v)  # shares the tiling, and so the cache
    A2 = A.copy()
    A2.data[:] = v
    x = ints(rng, 499, 16)
    for M in (T, T2, T, T2):
        want = (A if M is T else A2) @ x
        np.testing.assert_array_equal((M @ cp.asarray(x)).get(), want)
        np.testing.assert_array_equal(tg.spmm(M, cp.asarray(x)).get(), want)
        np.testing.assert_array_equal(tg.spmm(M, cp.asarray(x), precision="tf32").get(), want)
        np.testing.assert_array_equal(tg.spmm(M, cp.asarray(x), precision="fp32").get(), want)
    # out= aliasing X (square matrix): a temporary, twice.
    S = tg.TiledMatrix(int_graph(rng, 300, 300, degree=10, dtype=np.float32), layout=layout)
    Sh = S.tocsr()
    for _ in range(2):
        x = ints(rng, 300, 16)
        X = cp.asarray(x)
        assert tg.spmm(S, X, out=X) is X
        np.testing.assert_array_equal(X.get(), Sh @ x)
    with pytest.raises(ValueError):
        tg.spmm(T, cp.asarray(ints(rng, 499, 16)), out=cp.empty((501, 16), np.float64))
    xa, xb = ints(rng, 501, 8), ints(rng, 499, 8)
    for _ in range(2):
        for mv in (False, True):
            e = tg.sddmm(T, cp.asarray(xa), cp.asarray(xb), multiply_values=mv).tocsr().toarray()
            d = (xa.astype(np.float64) @ xb.T.astype(np.float64))
            want = A.multiply(d).toarray() if mv else (A != 0).multiply(d).toarray()
            np.testing.assert_array_equal(e, want)


def test_numba_kernels_take_the_cached_launch(cp):
    from tcgnn_py.kernels import numba_launch

    A = int_graph(np.random.default_rng(0), 700, 700, degree=10, dtype=np.float32)
    with tg.tuning(sgt_host_max=-1):  # a small host input is otherwise translated on the host
        tg.TiledMatrix(A)
        before = numba_launch.fast_path_count()
        T = tg.TiledMatrix(A)
    assert numba_launch.fast_path_count() - before >= 5  # check, rank, window blocks, condense, count, scatter
    assert (T.tocsr() != A).nnz == 0


def test_kernels_compiled_in_the_background_are_launched_through_cupy_not_numba(cp, tmp_path):
    """A signature Numba has compiled is launched from its cubin through CuPy: a translation after a background
    compile that read Numba's disk cache (and so loaded nothing) leaves no module of Numba's loaded."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    for run in ("compiled", "read from Numba's cache"):
        r = subprocess.run([sys.executable, "-c", WARMED_THEN_TRANSLATED, "0"], capture_output=True, text=True,
                           timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.split()[0]) == 0, r.stdout  # (a compile binds its kernel: a cache read loads nothing)


def test_a_numba_kernel_new_to_a_device_loads_the_cubin_numba_built_without_numba(cp, monkeypatch):
    """A signature Numba has compiled is launched on a device new to it from Numba's cubin, loaded into CuPy, with
    no Numba launch (which would load Numba's module into a second context: numba-cuda unloads its one library
    per cubin once per context at exit).  A new device is stood for by dropping the device's entries."""
    from tcgnn_py.kernels import numba_launch, sgt as k
    from tcgnn_py.kernels.launch import THREADS_PER_BLOCK, grid

    cols = cp.asarray(np.array([3, 0, 3, 1, 3], np.int32))
    count = cp.zeros(4, np.int32)
    numba_launch.launch(k.transpose_count, grid(5), THREADS_PER_BLOCK, cols, count)
    keys = [key for key in numba_launch._FAST if key[0] == id(k.transpose_count)]
    assert keys and k.transpose_count.overloads
    for key in keys:
        monkeypatch.delitem(numba_launch._FAST, key)

    def no_numba_launch():
        raise AssertionError("Numba's launch was taken for a signature Numba had compiled")

    monkeypatch.setattr(numba_launch, "current_stream", no_numba_launch)
    before = numba_launch.fast_path_count()
    cubins = [len(o._codelibrary._cubin_cache) for o in k.transpose_count.overloads.values()]
    numba_launch.launch(k.transpose_count, grid(5), THREADS_PER_BLOCK, cols, count)
    assert numba_launch.fast_path_count() == before + 1
    assert [len(o._codelibrary._cubin_cache) for o in k.transpose_count.overloads.values()] == cubins  # (no link)
    np.testing.assert_array_equal(count.get(), [2, 2, 0, 6])
