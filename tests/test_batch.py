"""Batches of small graphs: one block-diagonal graph with its node offsets, and per-graph readouts with vjps."""

import numpy as np
import pytest
import scipy.sparse as sp

from _env import GPU, int_graph, ints

import tcgnn_py as tg
from tcgnn_py import nn


def _reference(H, ptr, how):
    out = np.zeros((len(ptr) - 1, H.shape[1]), np.float64)
    for k in range(len(ptr) - 1):
        seg = H[ptr[k]:ptr[k + 1]].astype(np.float64)
        if len(seg):
            out[k] = {"sum": seg.sum(0), "mean": seg.mean(0), "max": seg.max(0)}[how]
    return out


def _reference_vjp(H, ptr, how, g):
    dH = np.zeros(H.shape, np.float64)
    for k in range(len(ptr) - 1):
        a, b = ptr[k], ptr[k + 1]
        if a == b:
            continue
        if how == "max":
            first = a + np.argmax(H[a:b] == H[a:b].max(axis=0), axis=0)  # (the first node holding the maximum)
            dH[first, np.arange(H.shape[1])] = g[k]
        else:
            dH[a:b] = g[k] / ((b - a) if how == "mean" else 1)
    return dH


def test_batch_joins_graphs_block_diagonally_and_keeps_their_offsets():
    rng = np.random.default_rng(0)
    graphs = [int_graph(rng, n, n, degree=3) for n in (5, 0, 1, 12)]
    b = nn.batch(graphs)
    assert b.ptr.tolist() == [0, 5, 5, 6, 18] and b.n_graphs == 4 and b.sizes.tolist() == [5, 0, 1, 12]
    assert b.graph.tolist() == [0] * 5 + [2] + [3] * 12
    want = np.zeros((18, 18))
    for k, g in enumerate(graphs):
        want[b.ptr[k]:b.ptr[k + 1], b.ptr[k]:b.ptr[k + 1]] = g.toarray()
    np.testing.assert_array_equal(b.adj.toarray(), want)
    T = tg.TiledMatrix(b.adj, device="cpu")  # (the batch is a graph as any other)
    np.testing.assert_array_equal(T.toarray(), b.adj.toarray())



def test_batch_is_scipys_block_diag():
    # Dense, boolean and float graphs with explicit zeros, and graphs of no entries: the values, dtype and stored
    # entries of scipy's block_diag (a canonical CSR when each graph's is).
    graphs = [np.array([[0, 1], [1, 0]], bool), sp.csr_array((np.array([0.0, 2.5]), ([0, 1], [1, 0])), shape=(2, 2)),
              sp.csr_array((3, 3)), sp.csr_array(np.eye(1, dtype=np.float32))]
    got, want = nn.batch(graphs).adj, sp.csr_array(sp.block_diag([sp.csr_array(g) for g in graphs], format="csr"))
    assert got.dtype == want.dtype and got.nnz == want.nnz and got.has_canonical_format
    np.testing.assert_array_equal(got.toarray(), want.toarray())
    empty = nn.batch([sp.csr_array((2, 2), dtype=np.float32), sp.csr_array((0, 0), dtype=np.float32)]).adj
    assert empty.shape == (2, 2) and empty.nnz == 0 and empty.dtype == np.float32

def test_batch_reads_scipy_graphs_up_to_their_last_entry():
    # CSR arrays and matrices as they are, arrays longer than their entries (scipy reads up to indptr[-1]), int64
    # indices, graphs of no nodes or no entries among many: scipy's block_diag.
    rng = np.random.default_rng(1)
    graphs = [sp.csr_array(int_graph(rng, n, n, degree=3)) for n in rng.integers(0, 9, 40)]
    graphs[3] = sp.csr_matrix(int_graph(rng, 6, 6, degree=2))
    padded = sp.csr_array(int_graph(rng, 5, 5, degree=2))
    cap = padded.nnz + 7
    indices, data = np.zeros(cap, np.int64), np.full(cap, 99.0)
    indices[:padded.nnz], data[:padded.nnz] = padded.indices, padded.data
    padded.indices, padded.data = indices, data  # (set after construction, which would trim them)
    graphs[7] = padded
    assert padded.indices.shape[0] > padded.nnz
    got = nn.batch(graphs).adj
    want = sp.csr_array(sp.block_diag([sp.csr_array(g) for g in graphs], format="csr"))
    assert got.nnz == want.nnz and got.has_canonical_format
    np.testing.assert_array_equal(got.toarray(), want.toarray())


def test_batch_refuses_what_is_not_a_sequence_of_square_graphs():
    with pytest.raises(ValueError, match="at least one graph"):
        nn.batch([])
    with pytest.raises(TypeError, match="must be a sequence"):
        nn.batch(5)
    with pytest.raises(ValueError, match=r"graphs\[1\] must be a square adjacency matrix, got shape \(2, 3\)"):
        nn.batch([sp.eye(2), sp.csr_array((2, 3))])
    with pytest.raises(TypeError, match=r"graphs\[1\] must be an adjacency matrix \(sparse, or a dense 2-D array\), "
                                        "got str"):
        nn.batch([sp.eye(2), "x"])


@pytest.mark.parametrize("how", nn._batch.READOUTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_readouts_and_their_vjps_are_the_per_graph_reductions(how, dtype):
    """Sum and max exact on integers (the sum a product on CUDA cores / the reference, the max a scatter), the
    mean within rounding (a product with 1 / n_g); vjps as the reference's, max's to the first maximum; a graph
    of no nodes reads out zeros and takes no gradient."""
    rng = np.random.default_rng(1)
    ptr = np.array([0, 3, 3, 7, 8, 20])
    H = ints(rng, 20, 6).astype(dtype)
    H[3:7, 0] = 2  # (ties: the gradient goes to the first)
    out, vjp = nn.readout(H, ptr, how)
    assert out.dtype == dtype and out.shape == (5, 6)
    g = ints(rng, 5, 6).astype(dtype)
    dH = vjp(g)
    tol = dict(rtol=1e-6, atol=1e-6) if how == "mean" else dict(rtol=0, atol=0)
    np.testing.assert_allclose(out, _reference(H, ptr, how), **tol)
    np.testing.assert_allclose(dH, _reference_vjp(H, ptr, how, g), **tol)


def test_readout_checks_its_operands():
    H = np.ones((4, 2), np.float32)
    with pytest.raises(ValueError, match="how must be one of"):
        nn.readout(H, [0, 4], "median")
    with pytest.raises(ValueError, match="must rise from 0 to the 4 rows of H"):
        nn.readout(H, [0, 3], "sum")
    with pytest.raises(ValueError, match="falling somewhere"):
        nn.readout(H, [0, 3, 2, 4], "sum")
    with pytest.raises(ValueError, match="1-D integer node offsets"):
        nn.readout(H, [0.0, 4.0], "sum")
    with pytest.raises(TypeError, match="float32 or float64"):
        nn.readout(H.astype(np.float16), [0, 4], "sum")
    with pytest.raises(ValueError, match=r"g must have the output's shape \(1, 2\)"):
        nn.readout(H, [0, 4], "max")[1](np.ones((2, 2)))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="the device readouts need CuPy and a GPU")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("how", nn._batch.READOUTS)
def test_device_readouts_are_the_host_readouts(how, dtype):
    # (sums and means on the GPU: per-segment sums in one launch; on the host: the pooling matrix's product)
    import cupy as cp

    rng = np.random.default_rng(2)
    ptr = np.array([0, 30, 30, 31, 500, 1000])
    H = ints(rng, 1000, 40).astype(dtype)
    g = ints(rng, 5, 40).astype(dtype)
    out, vjp = nn.readout(H, ptr, how)
    dout, dvjp = nn.readout(cp.asarray(H), ptr, how)
    # (a float32 mean sums up to 500 rounded terms 1 / n_g x_i: within a few units of the last place of the sum)
    tol = dict(rtol=0, atol=0) if how != "mean" else dict(rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)
    np.testing.assert_allclose(dout.get(), out, **tol)
    np.testing.assert_allclose(dvjp(cp.asarray(g)).get(), vjp(g), **tol)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="joining on the device needs CuPy and a GPU")
def test_graphs_on_the_gpu_are_joined_there_as_on_the_host():
    import cupyx.scipy.sparse as csp

    rng = np.random.default_rng(3)
    graphs = [sp.random_array((n, n), density=0.3, rng=rng, format="csr", dtype=np.float32) for n in (5, 0, 1, 40)]
    graphs.append(sp.csr_array((3, 3), dtype=np.float32))  # a graph of nodes and no edges
    want = nn.batch(graphs)
    got = nn.batch([csp.csr_matrix(g) for g in graphs])
    assert type(got.adj).__module__.startswith("cupyx")
    np.testing.assert_array_equal(got.ptr, want.ptr)
    np.testing.assert_array_equal(got.graph, want.graph)
    np.testing.assert_array_equal(got.adj.get().toarray(), want.adj.toarray())
    empty = nn.batch([csp.csr_matrix((2, 2), dtype=np.float32)])
    assert empty.adj.shape == (2, 2) and empty.adj.nnz == 0
    assert nn.gcn_norm(got.adj).device == "cuda"  # (a TiledMatrix from the joined device CSR)
