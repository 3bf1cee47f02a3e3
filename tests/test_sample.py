"""Neighbor-sampled blocks and GraphSAGE on them: the sampler's reference (uniform without replacement, seeded),
its Numba kernel against it (simulator and GPU), the blocks' structure, the loader, the layer and bad input."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from _env import GPU, host

import tcgnn_py as tg
from tcgnn_py import sampling as _sample


def _graph(n=40, seed=0, hub=True):
    """A graph with leaves, mid-degree nodes and (``hub``) a node joined to all others."""
    rng = np.random.default_rng(seed)
    A = sp.random_array((n, n), density=0.12, rng=rng, format="csr")
    A = sp.csr_array(((A + A.T) > 0).astype(np.float32))
    if hub:
        A = sp.lil_array(A)
        A[0, 1:] = 1
        A[1:, 0] = 1
        A = sp.csr_array(A)
    A.setdiag(0)
    A.eliminate_zeros()
    A.sort_indices()
    return A


def test_the_reference_draws_are_the_kernels():
    from tcgnn_py.kernels import sample

    assert (_sample.GOLDEN, _sample.NODE_MIX) == (sample.GOLDEN, sample.NODE_MIX)


@pytest.mark.parametrize("fanout", [1, 3, 7, -1])
def test_the_sample_is_uniform_without_replacement_and_seeded(fanout):
    A = _graph()
    nodes = np.arange(A.shape[0])
    ptr, cols = _sample.sample_reference(A.indptr.astype(np.int64), A.indices, nodes, fanout, key=5)
    deg = np.diff(A.indptr)
    np.testing.assert_array_equal(np.diff(ptr), deg if fanout < 0 else np.minimum(deg, fanout))
    for v in nodes:
        got = cols[ptr[v]:ptr[v + 1]]
        nbrs = A.indices[A.indptr[v]:A.indptr[v + 1]]
        assert len(set(got.tolist())) == len(got) and set(got.tolist()) <= set(nbrs.tolist())
        if fanout < 0 or deg[v] <= fanout:
            np.testing.assert_array_equal(got, nbrs)  # all of them, in CSR order
    again = _sample.sample_reference(A.indptr.astype(np.int64), A.indices, nodes, fanout, key=5)
    np.testing.assert_array_equal(again[1], cols)
    if fanout > 0:
        other = _sample.sample_reference(A.indptr.astype(np.int64), A.indices, nodes, fanout, key=6)[1]
        assert not np.array_equal(other, cols)


def test_each_neighbor_of_a_hub_is_drawn_as_often():
    """Degree 39, fanout 5, 4,000 keys: every neighbor's share is 5/39 (binomial, within 5 standard deviations)."""
    A = _graph()
    indptr = A.indptr.astype(np.int64)
    counts = np.zeros(A.shape[0])
    trials = 4000
    for key in range(trials):
        _, cols = _sample.sample_reference(indptr, A.indices, np.array([0]), 5, key)
        counts[cols] += 1
    p = 5 / 39
    share = counts[1:] / trials
    assert np.abs(share - p).max() < 5 * np.sqrt(p * (1 - p) / trials)


@pytest.mark.kernels
def test_the_kernel_draws_the_references_sample(xp):
    from tcgnn_py.kernels.numba_launch import launch
    from tcgnn_py.kernels.sample import sample_rows

    A = _graph(24 if not GPU else 300, seed=1)
    indptr, nodes = A.indptr.astype(np.int64), np.array([0, 3, 5, 2, 17, 11], np.int64)
    for fanout in (2, 4, -1):
        ptr, want = _sample.sample_reference(indptr, A.indices, nodes, fanout, key=99)
        got = xp.zeros(len(want), np.int32)
        with warnings.catch_warnings():  # (the simulator hashes with NumPy scalars, which warn where uint64 wraps)
            warnings.filterwarnings("ignore", "overflow encountered in scalar", RuntimeWarning)
            launch(sample_rows, 1, 32, xp.asarray(indptr), xp.asarray(A.indices.astype(np.int32)),
                   xp.asarray(nodes), fanout, np.uint64(99), xp.asarray(ptr), got)
        np.testing.assert_array_equal(host(got), want)


@pytest.mark.kernels
@pytest.mark.parametrize("bound_bytes", [None, 0], ids=["bound", "general_path"])
def test_a_batch_through_the_kernels_is_the_references_hops(xp, monkeypatch, bound_bytes):
    """hop_kernels (per hop: the sample with its new nodes marked as drawn, one scan and the sources, on buffers of
    the hop's bound; one host read of every hop's sizes, then the sorted rows) gives the hops of the host's
    sample_hops -- sample_reference, Relabel, the sort of all entries -- bit for bit: destinations among the
    drawn nodes, a hub, a fan-out past SORT_ROWS_MAX and every
    neighbor (-1) between kernel hops (the general path, the map cleared and placed around it), batches growing
    (the counts' buffer grown); every hop's buffer past HOP_BOUND_BYTES takes the general path.  The graph's map is
    whole after each batch, and after an empty one."""
    from tcgnn_py.sampling import _neighbors

    if bound_bytes is not None:
        monkeypatch.setattr(_neighbors, "HOP_BOUND_BYTES", bound_bytes)
    A = _graph(24 if not GPU else 300, seed=4)
    n = A.shape[0]
    indptr, indices = A.indptr.astype(np.int64), A.indices.astype(np.int32)
    dev, ref = _sample.Relabel(n, xp), _sample.Relabel(n, np)
    batches = [([0, 3, 5, 2, 17, 11], (4, 2, 3, 1)), ([7], (2, _sample.SORT_ROWS_MAX + 1, 1)),
               ([1, 2, 4, 6, 8, 9, 10, 12], (3, -1, 2)), (list(range(n // 2)), (1, 1)), ([], (3, 2))]
    for b, (seeds, fanouts) in enumerate(batches):
        seeds = np.array(seeds, np.int64)
        keys = [40 + b * 7 + h for h in range(len(fanouts))]
        want = _sample.sample_hops(indptr, indices, seeds, fanouts, keys, ref)
        with warnings.catch_warnings():  # (the simulator hashes with NumPy scalars, which warn where uint64 wraps)
            warnings.filterwarnings("ignore", "overflow encountered in scalar", RuntimeWarning)
            got = _sample.hop_kernels(xp, xp.asarray(indptr), xp.asarray(indices), xp.asarray(seeds), fanouts, keys,
                                      dev)
        assert len(got) == len(fanouts)
        for g_hop, w_hop in zip(got, want):
            dtypes = [np.int64, np.int32, np.int32, np.int32, np.float32]
            for g, w, dtype in zip(g_hop, w_hop, dtypes):
                assert host(g).dtype == dtype
                np.testing.assert_array_equal(host(g), w)
        assert (host(dev.slot) == -1).all() and not host(dev.mark).any()


@pytest.mark.kernels
def test_recorded_hops_replayed_with_new_seeds_and_keys_are_the_references_hops(xp):
    """RecordedHops (every buffer made once; the launches up to the read recorded -- a CUDA graph on the GPU, called
    again in the simulator -- with the seeds and keys written into its buffers; the rows after one read) gives
    each batch the host's hops bit for bit, earlier batches' arrays unchanged by later replays (the sources and
    row pointers copied out), the map whole after each."""
    A = _graph(24 if not GPU else 300, seed=8)
    n = A.shape[0]
    indptr, indices = A.indptr.astype(np.int64), A.indices.astype(np.int32)
    d_indptr, d_indices = xp.asarray(indptr), xp.asarray(indices)
    dev, ref = _sample.Relabel(n, xp), _sample.Relabel(n, np)
    size, fanouts = 5, (3, 2, 2)
    rng = np.random.default_rng(0)
    batches = [(rng.permutation(n)[:size].astype(np.int64), [90 + 5 * b + h for h in range(3)]) for b in range(4)]
    with warnings.catch_warnings():  # (the simulator hashes with NumPy scalars, which warn where uint64 wraps)
        warnings.filterwarnings("ignore", "overflow encountered in scalar", RuntimeWarning)
        # (a first batch of the shape eagerly: on the GPU it compiles and loads what the capture records)
        _sample.hop_kernels(xp, d_indptr, d_indices, xp.asarray(batches[0][0]), fanouts, batches[0][1], dev)
        rec = _sample.RecordedHops(xp, d_indptr, d_indices, size, fanouts, dev)
        kept = []
        for seeds, keys in batches[1:]:
            want = _sample.sample_hops(indptr, indices, seeds, fanouts, keys, ref)
            got = rec(xp.asarray(seeds), np.asarray(keys, np.uint64))
            for g_hop, w_hop in zip(got, want):
                for g, w, dtype in zip(g_hop, w_hop, [np.int64, np.int32, np.int32, np.int32, np.float32]):
                    assert host(g).dtype == dtype
                    np.testing.assert_array_equal(host(g), w)
            assert (host(dev.slot) == -1).all() and not host(dev.mark).any()
            kept.append((got, want))
    for got, want in kept:
        for g_hop, w_hop in zip(got, want):
            for g, w in zip(g_hop, w_hop):
                np.testing.assert_array_equal(host(g), w)
    assert rec.replays == 3


@pytest.mark.gpu
def test_a_batch_shape_sampled_again_replays_its_recorded_hops_as_the_eager_path_makes_them():
    """A batch of a size and fan-outs the graph sampled before replays the hops up to the read as a CUDA graph
    (recorded at the second such batch): every batch's hops are the host's bit for bit with new seeds and keys,
    the map is whole after each, earlier batches' arrays are unchanged by later replays (the sources and row
    pointers are copied out of the graph's buffers), and a batch of another size runs eagerly until it too is seen
    twice."""
    import cupy as cp

    A = _graph(300, seed=5)
    n = A.shape[0]
    indptr, indices = A.indptr.astype(np.int64), A.indices.astype(np.int32)
    dev, ref = _sample.Relabel(n, cp), _sample.Relabel(n, np)
    d_indptr, d_indices = cp.asarray(indptr), cp.asarray(indices)
    rng = np.random.default_rng(3)
    fanouts = (4, 3, 2)
    kept = []

    def same(got, want):
        for g_hop, w_hop in zip(got, want):
            for g, w in zip(g_hop, w_hop):
                np.testing.assert_array_equal(g.get(), w)

    for b, size in enumerate([32, 32, 32, 32, 7, 7, 7, 32]):
        seeds = rng.permutation(n)[:size].astype(np.int64)
        keys = [1000 + 10 * b + h for h in range(len(fanouts))]
        want = _sample.sample_hops(indptr, indices, seeds, fanouts, keys, ref)
        got = _sample.hop_kernels(cp, d_indptr, d_indices, cp.asarray(seeds), fanouts, keys, dev)
        same(got, want)
        assert (dev.slot.get() == -1).all() and not dev.mark.get().any()
        kept.append((got, want))
    for got, want in kept:
        same(got, want)
    replays = sorted(r.replays for r in dev._recorded.values() if r is not None)
    assert replays == [2, 4]  # (size 7: its second and third batch; size 32: its second to fifth)


@pytest.mark.gpu
def test_a_batch_shape_that_cannot_be_recorded_runs_eagerly_and_is_not_tried_again(monkeypatch):
    """Where the capture fails (a stream or CuPy that cannot capture), the batch runs the eager path, gives the
    host's hops, leaves the map whole, and its shape is not recorded again."""
    import cupy as cp

    from tcgnn_py.sampling import _neighbors

    tries = []

    def cannot(*args):
        tries.append(1)
        raise RuntimeError("no capture here")

    monkeypatch.setattr(_neighbors.RecordedHops, "__init__", cannot)
    A = _graph(300, seed=6)
    n = A.shape[0]
    indptr, indices = A.indptr.astype(np.int64), A.indices.astype(np.int32)
    dev, ref = _sample.Relabel(n, cp), _sample.Relabel(n, np)
    d_indptr, d_indices = cp.asarray(indptr), cp.asarray(indices)  # (one graph: its shape is keyed by its buffers)
    for b in range(4):
        seeds = np.random.default_rng(b).permutation(n)[:20].astype(np.int64)
        keys = [7 * b + h for h in range(2)]
        want = _sample.sample_hops(indptr, indices, seeds, (3, 2), keys, ref)
        got = _sample.hop_kernels(cp, d_indptr, d_indices, cp.asarray(seeds), (3, 2), keys, dev)
        for g_hop, w_hop in zip(got, want):
            for g, w in zip(g_hop, w_hop):
                np.testing.assert_array_equal(g.get(), w)
        assert (dev.slot.get() == -1).all() and not dev.mark.get().any()
    assert len(tries) == 1 and list(dev._recorded.values()) == [None]


@pytest.mark.gpu
def test_batch_shapes_seen_once_are_forgotten_oldest_first():
    """A shape is recorded at its second batch, so the shapes seen once are remembered -- a bounded number of
    them, the oldest dropped: a loader whose batch sizes keep changing does not grow its sampler's state."""
    import cupy as cp

    from tcgnn_py.sampling import _neighbors

    A = _graph(300, seed=6)
    d_indptr, d_indices = cp.asarray(A.indptr.astype(np.int64)), cp.asarray(A.indices.astype(np.int32))
    dev = _sample.Relabel(A.shape[0], cp)
    for size in range(1, 60):
        assert dev.recorded(cp, d_indptr, d_indices, size, (3, 2)) is None
    kept = 4 * _neighbors.RECORDED_KEPT
    assert [key[2] for key in dev._seen] == list(range(60 - kept, 60)) and not dev._recorded


@pytest.mark.parametrize("where", ["cpu", "cuda"])
def test_relabel_is_the_sort_based_definition_call_after_call(where):
    """A hop's sources are its destinations then the other sampled nodes ascending, each entry's column its node's
    position there -- as ``unique`` and ``isin`` define them -- and the dense map is whole again after each call."""
    if where == "cuda" and not GPU:
        pytest.skip("the GPU side needs CuPy and a GPU")
    xp = np if where == "cpu" else __import__("cupy")
    rng = np.random.default_rng(3)
    n = 50
    relabel = _sample.Relabel(n, xp)
    for _ in range(6):
        nodes = rng.permutation(n)[:rng.integers(0, 12)].astype(np.int64)
        cols = rng.integers(0, n, rng.integers(0, 40)).astype(np.int32)
        src, local = relabel(xp.asarray(nodes), xp.asarray(cols))
        uniq = np.unique(cols)
        want = np.concatenate([nodes, uniq[~np.isin(uniq, nodes)]])
        np.testing.assert_array_equal(host(src), want)
        assert host(src).dtype == np.int64 and host(local).dtype == np.int32
        np.testing.assert_array_equal(want[host(local)], cols)
        assert (host(relabel.slot) == -1).all() and not host(relabel.mark).any()


def test_blocks_are_bipartite_hops_destinations_first():
    A = _graph(60, seed=2)
    seeds = np.array([4, 9, 0, 33])
    blocks = tg.nn.sample_blocks(A, seeds, [3, 2], seed=7, device="cpu")
    assert [type(b) for b in blocks] == [tg.nn.Block] * 2
    np.testing.assert_array_equal(blocks[-1].dst, seeds)
    assert blocks[0].n_dst == blocks[1].adj.shape[1]
    np.testing.assert_array_equal(blocks[0].dst, blocks[1].src)  # a hop's sources are the next hop's destinations
    dense = A.toarray()
    for block, k in zip(blocks[::-1], (3, 2)):
        M = block.adj.toarray()
        assert M.shape == (block.n_dst, len(block.src)) and len(set(block.src.tolist())) == len(block.src)
        for i, v in enumerate(block.dst.tolist()):
            row = M[i]
            picked = block.src[np.flatnonzero(row)]
            assert len(picked) == min(k, int(dense[v].sum())) and dense[v, picked].all()
            np.testing.assert_allclose(row[row != 0], 1 / len(picked))  # the mean over the sampled neighbors
    again = tg.nn.sample_blocks(A, seeds, [3, 2], seed=7, device="cpu")
    assert all((a.adj.toarray() == b.adj.toarray()).all() and (a.src == b.src).all() for a, b in zip(blocks, again))
    for block, csr in zip(blocks, (b.adj for b in tg.nn.sample_blocks(A, seeds, [3, 2], seed=7, device="cpu",
                                                                      format="csr"))):
        assert all((np.diff(csr.indices[a:b]) > 0).all() for a, b in zip(csr.indptr[:-1], csr.indptr[1:]))  # (sorted)
        np.testing.assert_array_equal(csr.toarray(), block.adj.toarray())


@pytest.mark.parametrize("layout", ["vector", "tcgnn"])
def test_a_blocks_transpose_from_its_entries_is_the_tilings_transpose(layout):
    """``adj_t``, made from the sampled entries, is ``adj.T`` made from the tiling: the same translation, array for
    array (so a backward's products are the same bit for bit), made once; a CSR block's is its matrix's ``.T``."""
    from tcgnn_py.tiles import STRUCTURE

    A = _graph(80, seed=10)
    for block in tg.nn.sample_blocks(A, np.arange(0, 80, 7), [5, 3], seed=4, device="cpu", layout=layout):
        mine, theirs = block.adj_t, block.adj.T
        assert mine is block.adj_t and mine.shape == block.adj.shape[::-1] and mine.layout == theirs.layout
        for name in STRUCTURE:
            np.testing.assert_array_equal(getattr(mine.tiling, name), getattr(theirs.tiling, name))
        np.testing.assert_array_equal(mine.values, theirs.values)
    (csr,) = tg.nn.sample_blocks(A, [3, 9], [4], device="cpu", format="csr")
    np.testing.assert_array_equal(csr.adj_t.toarray(), csr.adj.toarray().T)


@pytest.mark.parametrize("fmt", ["tiled", "csr"])
def test_rmatmat_is_the_product_by_the_transpose_and_checks_its_operand(fmt):
    """``Block.rmatmat(X)`` is ``adj.T @ X`` (to float32's rounding: the entries are 1 / count): from the sampled
    entries' CSR on a tiled block, the same after ``adj_t`` was made (its product), and by the CSR matrix's
    transpose on a CSR block."""
    A = _graph(70, seed=12)
    rng = np.random.default_rng(3)
    for block in tg.nn.sample_blocks(A, rng.permutation(70)[:10], [4, 3], seed=5, device="cpu", format=fmt):
        X = rng.integers(-8, 9, (block.n_dst, 5)).astype(np.float32)
        want = block.adj.toarray().astype(np.float64).T @ X
        got = block.rmatmat(X)
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        assert block.rmatmat(X[:, :0]).shape == (block.adj.shape[1], 0)
        if fmt == "tiled":
            assert "transpose" in block._csr._cache and block._adj_t is None
            block.adj_t
            np.testing.assert_allclose(block.rmatmat(X), want, rtol=1e-6, atol=1e-6)
        with pytest.raises(ValueError, match=rf"X must have shape \({block.n_dst}, d\)"):
            block.rmatmat(X[1:])
        H = rng.integers(-8, 9, (block.shape[1], 5)).astype(np.float32)
        got = block.matmat(H)
        assert got.shape == (block.n_dst, 5) and got.dtype == np.float32
        np.testing.assert_allclose(got, block.adj.toarray().astype(np.float64) @ H, rtol=1e-6, atol=1e-6)
        with pytest.raises(ValueError, match=rf"X must have shape \({block.shape[1]}, d\)"):
            block.matmat(H[1:])


def test_a_tiled_block_is_translated_only_when_its_matrix_is_asked_for():
    """A layer multiplies a tiled block by its sampled entries' CSR both ways: a training step never translates
    the block or its transpose, and ``adj`` (made on first use) is the same matrix."""
    A = _graph(70, seed=12)
    rng = np.random.default_rng(3)
    seeds = rng.permutation(70)[:10]
    blocks = tg.nn.sample_blocks(A, seeds, [4, 3], seed=5, device="cpu")
    params = tg.nn.sage_init((6, 5, 3), np.random.default_rng(0))
    logits, vjp = tg.nn.sage_apply(params, blocks, rng.standard_normal((blocks[0].shape[1], 6)).astype(np.float32))
    vjp(np.ones_like(logits))
    assert all(b._adj is None and b._adj_t is None for b in blocks)
    b = blocks[1]
    assert repr(b) == f"Block(n_dst={b.n_dst}, n_src={b.shape[1]}, nnz={b._csr.cols.shape[0]}, TiledMatrix)"
    assert [b.nnz for b in blocks] == [b._csr.cols.shape[0] for b in blocks] and b._adj is None
    csr = tg.nn.sample_blocks(A, seeds, [4, 3], seed=5, device="cpu", format="csr")
    for b, c in zip(blocks, csr):
        assert b.nnz == c.nnz == c.adj.nnz
        assert isinstance(b.adj, tg.TiledMatrix) and b.adj is b.adj and b.adj.shape == b.shape == c.shape
        np.testing.assert_array_equal(b.adj.toarray(), c.adj.toarray())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rmatmat_on_the_gpu_is_the_product_by_the_transpose_and_deterministic(dtype):
    """On the GPU, ``rmatmat`` is one CSR launch over the transpose's rows in entry order, and ``matmat`` one over
    the block's own (its tiled matrix not made): the products to the dtype's rounding (the entries are 1 / count),
    and the same bits call after call (no atomics)."""
    import cupy as cp

    A = _graph(400, seed=13)
    seeds = np.random.default_rng(5).permutation(400)[:50]
    rng = np.random.default_rng(6)
    host = tg.nn.sample_blocks(A, seeds, [6, 4], seed=9, device="cpu")
    for dev, ref in zip(tg.nn.sample_blocks(A, seeds, [6, 4], seed=9, device="cuda"), host):
        for d in (1, 2, 3, 7, 17, 64, 65, 130):  # (every group of lanes per row, one to three passes of columns)
            X = rng.integers(-8, 9, (dev.n_dst, d)).astype(dtype)
            want = ref.adj.toarray().astype(np.float64).T @ X
            got = dev.rmatmat(cp.asarray(X))
            assert got.dtype == dtype and got.shape == want.shape
            np.testing.assert_allclose(got.get(), want, rtol=1e-6, atol=1e-5)
            H = rng.integers(-8, 9, (dev.shape[1], d)).astype(dtype)
            got = dev.matmat(cp.asarray(H))
            assert got.dtype == dtype and got.shape == (dev.n_dst, d) and dev._adj is None
            np.testing.assert_allclose(got.get(), ref.adj.toarray().astype(np.float64) @ H, rtol=1e-6, atol=1e-5)
        R = cp.asarray(rng.standard_normal((dev.n_dst, 33)).astype(dtype))
        first = dev.rmatmat(R)
        np.testing.assert_allclose(first.get(), ref.adj.toarray().T.astype(np.float64) @ R.get(),
                                   rtol=1e-5, atol=1e-5)
        for _ in range(3):
            assert bool((dev.rmatmat(R) == first).all())


@pytest.mark.gpu
@pytest.mark.parametrize("d", [2, 64])
def test_the_csr_product_covers_more_rows_than_its_grid_and_empty_rows(d):
    """``pointwise.csr_mm`` past its most blocks' rows (each group of lanes takes several rows) and with empty
    rows, exact on small integers, one launch bound for both row counts."""
    import cupy as cp
    import scipy.sparse as sp

    from tcgnn_py.products.families import pointwise

    rng = np.random.default_rng(d)
    for n in (40_000, 300):
        A = sp.random_array((n, 500), density=0.004, random_state=rng, format="csr", dtype=np.float32)
        A.data = rng.integers(-8, 9, A.nnz).astype(np.float32)
        X = rng.integers(-8, 9, (500, d)).astype(np.float32)
        got = pointwise.csr_mm(cp.asarray(A.data), cp.asarray(A.indices, dtype=cp.int32),
                               cp.asarray(A.indptr, dtype=cp.int32), cp.asarray(X))
        assert (np.diff(A.indptr) == 0).any()
        np.testing.assert_array_equal(got.get(), A @ X)


def test_an_empty_batch_and_an_isolated_node_have_their_defined_blocks():
    A = _graph(20, seed=3, hub=False)
    lonely = int(np.flatnonzero(np.diff(A.indptr) == 0)[0]) if (np.diff(A.indptr) == 0).any() else None
    (block,) = tg.nn.sample_blocks(A, np.array([], np.int64), [4], device="cpu")
    assert block.n_dst == 0 and block.adj.shape == (0, 0)
    if lonely is not None:
        (block,) = tg.nn.sample_blocks(A, [lonely], [4], device="cpu")
        assert block.adj.shape == (1, 1) and block.adj.nnz == 0
        out, _ = tg.nn.sage_conv(block, np.ones((1, 2), np.float32), np.eye(2, dtype=np.float32),
                                 np.eye(2, dtype=np.float32))
        np.testing.assert_array_equal(out, [[1, 1]])  # its own features only: no neighbor to average


def test_bad_sampling_input_fails_with_clear_errors():
    A = _graph(10, seed=4)
    with pytest.raises(ValueError, match="fanouts must be a non-empty list of positive ints"):
        tg.nn.sample_blocks(A, [1], [0], device="cpu")
    for bad in ([], [2.5], [True], [-2]):
        with pytest.raises(ValueError, match="fanouts must be"):
            tg.nn.sample_blocks(A, [1], bad, device="cpu")
    with pytest.raises(ValueError, match=r"seeds must be node ids in \[0, 10\), got ids from -1 to 3"):
        tg.nn.sample_blocks(A, [3, -1], [2], device="cpu")
    with pytest.raises(ValueError, match=r"got ids from 0 to 10"):
        tg.nn.sample_blocks(A, [0, 10], [2], device="cpu")
    with pytest.raises(ValueError, match="seeds must be distinct"):
        tg.nn.sample_blocks(A, [2, 2], [2], device="cpu")
    with pytest.raises(ValueError, match="seeds must be a 1-D array of node ids"):
        tg.nn.sample_blocks(A, [[1]], [2], device="cpu")
    with pytest.raises(ValueError, match="A must be square"):
        tg.nn.sample_blocks(sp.csr_array(np.ones((3, 4))), [0], [2], device="cpu")
    one = np.ones(2, np.float32)  # (arrays scipy's constructor takes without a full check)
    for indices, indptr, message in (([0, 3], [0, 1, 2, 2], r"indices must be < 3"),
                                     ([0, -1], [0, 1, 2, 2], "indices must be >= 0"),
                                     ([0, 1], [0, 2, 1, 2], "indptr must be a non-decreasing sequence")):
        bad = sp.csr_array((one, np.array(indices), np.array(indptr)), shape=(3, 3), copy=False)
        with pytest.raises(ValueError, match=message):
            tg.nn.sample_blocks(bad, [0], [2], device="cpu")
        with pytest.raises(ValueError, match=message):
            tg.nn.NeighborLoader(bad, [0], [2], 1, device="cpu")
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        tg.nn.NeighborLoader(A, [0, 1], [2], 0, device="cpu")
    with pytest.raises(ValueError, match=r"nodes must be a 1-D array of node ids in \[0, 10\)"):
        tg.nn.NeighborLoader(A, [0, 12], [2], 4, device="cpu")
    # (a float seed would be truncated into another seed's blocks: refused, as a bool and a string)
    for bad, kind in ((1.5, "float"), (True, "bool"), ("1", "str")):
        with pytest.raises(TypeError, match=f"seed must be an int, got {kind}"):
            tg.nn.sample_blocks(A, [1], [2], seed=bad, device="cpu")
        with pytest.raises(TypeError, match=f"seed must be an int, got {kind}"):
            tg.nn.NeighborLoader(A, [0, 1], [2], 1, seed=bad, device="cpu")
    # (a float node id would be truncated into another node; a string flag would be taken as true)
    with pytest.raises(ValueError, match=r"nodes must be a 1-D array of node ids, got shape \(2,\) and dtype float64"):
        tg.nn.NeighborLoader(A, [0.5, 1], [2], 1, device="cpu")
    for flag in ("shuffle", "prefetch"):
        with pytest.raises(TypeError, match=f"{flag} must be a bool, got str"):
            tg.nn.NeighborLoader(A, [0, 1], [2], 1, device="cpu", **{flag: "no"})
    with pytest.raises(ValueError, match="format must be 'tiled' or 'csr', got 'coo'"):
        tg.nn.NeighborLoader(A, [0, 1], [2], 1, device="cpu", format="coo")
    with pytest.raises(ValueError, match="device must be None, 'cuda' or 'cpu', got 'tpu'"):
        tg.nn.NeighborLoader(A, [0, 1], [2], 1, device="tpu")
    with pytest.raises(ValueError, match="device must be None, 'cuda' or 'cpu', got 'tpu'"):
        tg.nn.sample_blocks(A, [0, 1], [2], device="tpu")
    same = [tg.nn.sample_blocks(A, [1, 4], [2, 2], seed=s, device="cpu", format="csr") for s in (7, np.int64(7), -7)]
    assert all((a.adj != b.adj).nnz == 0 for a, b in zip(same[0], same[1]))  # (NumPy's ints are ints)


def test_sage_conv_and_its_vjp_are_the_dense_formula():
    A = _graph(50, seed=5)
    rng = np.random.default_rng(0)
    seeds = rng.permutation(50)[:7]
    blocks = tg.nn.sample_blocks(A, seeds, [4, 3], seed=1, device="cpu")
    for block in blocks:
        M = block.adj.toarray().astype(np.float64)
        n_src, n = len(block.src), block.n_dst
        H = rng.integers(-4, 5, (n_src, 3)).astype(np.float32)
        Ws, Wn = (rng.integers(-3, 4, (3, 2)).astype(np.float32) for _ in range(2))
        b = np.array([1.0, -2.0], np.float32)
        out, vjp = tg.nn.sage_conv(block, H, Ws, Wn, b)
        np.testing.assert_allclose(out, H[:n] @ Ws + M @ H @ Wn + b, rtol=1e-5, atol=1e-5)
        g = rng.integers(-3, 4, (n, 2)).astype(np.float32)
        dH, dWs, dWn, db = vjp(g)
        want = M.T @ g @ Wn.T
        want[:n] += g @ Ws.T
        np.testing.assert_allclose(dH, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(dWs, H[:n].T @ g, rtol=1e-6)
        np.testing.assert_allclose(dWn, (M @ H).T @ g, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(db, g.sum(axis=0))
    csr_blocks = tg.nn.sample_blocks(A, seeds, [4, 3], seed=1, device="cpu", format="csr")
    assert isinstance(csr_blocks[0].adj, sp.csr_array)
    out, vjp = tg.nn.sage_conv(blocks[-1], H, Ws, Wn, b)
    out_csr, vjp_csr = tg.nn.sage_conv(csr_blocks[-1], H, Ws, Wn, b)  # (the same seed: the same sample)
    np.testing.assert_allclose(out_csr, out, rtol=1e-6)
    for mine, theirs in zip(vjp_csr(g), vjp(g)):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6)
    with pytest.raises(ValueError, match="format must be 'tiled' or 'csr'"):
        tg.nn.sample_blocks(A, [1], [2], device="cpu", format="coo")
    with pytest.raises(TypeError, match="sage_conv expects a Block"):
        tg.nn.sage_conv(A, H, Ws, Wn)
    with pytest.raises(ValueError, match=r"H must have shape \(\d+, f\)"):
        tg.nn.sage_conv(blocks[0], H[:1], Ws, Wn)


@pytest.mark.parametrize("prefetch", [False, True])
def test_the_loader_covers_every_node_once_an_epoch_reproducibly(prefetch):
    A = _graph(45, seed=6)
    nodes = np.arange(3, 40)
    loader = tg.nn.NeighborLoader(A, nodes, [3, 2], 8, seed=2, device="cpu", prefetch=prefetch)
    assert len(loader) == 5
    epochs = [[(s, [b.src for b in blocks]) for s, blocks in loader] for _ in range(2)]
    for epoch in epochs:
        np.testing.assert_array_equal(np.sort(np.concatenate([s for s, _ in epoch])), nodes)
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(*epochs))  # shuffled anew
    twin = tg.nn.NeighborLoader(A, nodes, [3, 2], 8, seed=2, device="cpu", prefetch=not prefetch)
    for (s, srcs), (t, blocks) in zip(epochs[0], twin):
        np.testing.assert_array_equal(s, t)
        assert all(np.array_equal(a, b.src) for a, b in zip(srcs, blocks))


@pytest.mark.gpu
def test_blocks_on_the_gpu_are_the_hosts_and_sage_trains():
    import cupy as cp

    A = _graph(300, seed=7)
    seeds = np.random.default_rng(1).permutation(300)[:64]
    host_blocks = tg.nn.sample_blocks(A, seeds, [5, 3], seed=11, device="cpu")
    dev_blocks = tg.nn.sample_blocks(A, seeds, [5, 3], seed=11, device="cuda")
    for a, b in zip(host_blocks, dev_blocks):
        assert b.adj.device == "cuda"
        np.testing.assert_array_equal(a.src, b.src.get())
        np.testing.assert_array_equal(a.adj.toarray(), b.adj.toarray())
    H = cp.asarray(np.random.default_rng(2).integers(-4, 5, (len(dev_blocks[0].src), 4)).astype(np.float32))
    W = cp.eye(4, dtype=cp.float32)
    out, vjp = tg.nn.sage_conv(dev_blocks[0], H, W, W)
    want, _ = tg.nn.sage_conv(host_blocks[0], H.get(), W.get(), W.get())
    np.testing.assert_allclose(out.get(), want, rtol=1e-3, atol=1e-3)
    assert all(g is None or g.shape for g in vjp(cp.ones_like(out)))


def test_sage_apply_is_its_layers_in_order():
    """sage_apply: sage_conv per block, ReLU between (no dropout at p=0), and its grads the layers' vjps chained."""
    A = _graph(60, seed=9)
    rng = np.random.default_rng(4)
    blocks = tg.nn.sample_blocks(A, rng.permutation(60)[:9], [5, 3], seed=2, device="cpu")
    params = tg.nn.sage_init((6, 5, 3), np.random.default_rng(0))
    H = rng.standard_normal((len(blocks[0].src), 6)).astype(np.float32)
    logits, vjp = tg.nn.sage_apply(params, blocks, H)
    h1, v1 = tg.nn.sage_conv(blocks[0], H, params["W_self0"], params["W_neigh0"], params["b0"])
    r1, rv = tg.nn.relu(h1)
    want, v2 = tg.nn.sage_conv(blocks[1], r1, params["W_self1"], params["W_neigh1"], params["b1"])
    np.testing.assert_allclose(logits, want, rtol=1e-6)
    g = rng.standard_normal(want.shape).astype(np.float32)
    grads = vjp(g)
    # The first hop's input is data: no gradient of it, so its block's transpose is never made; the second's
    # backward multiplies by its transpose's CSR, made once, never translated into tiles.
    assert "transpose" not in blocks[0]._csr._cache and "transpose" in blocks[1]._csr._cache
    assert blocks[0]._adj_t is None and blocks[1]._adj_t is None
    dr, dWs1, dWn1, db1 = v2(g)
    _, dWs0, dWn0, db0 = v1(rv(dr))
    for name, w in (("W_self1", dWs1), ("W_neigh1", dWn1), ("b1", db1), ("W_self0", dWs0), ("W_neigh0", dWn0),
                    ("b0", db0)):
        np.testing.assert_allclose(grads[name], w, rtol=1e-6, err_msg=name)
    assert v1(rv(dr), input_grad=False)[0] is None
    with pytest.raises(ValueError, match="the parameters have 2 layers, the batch 1 blocks"):
        tg.nn.sage_apply(params, blocks[1:], H)
