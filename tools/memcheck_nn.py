"""Workload for compute-sanitizer memcheck of tcgnn_py.nn: every kernel the layers launch, row counts not multiples
of 16, the dense kernels at the edges of their tiles, and the neighbor sampler with GraphSAGE on its blocks."""

import cupy as cp
import numpy as np

import tcgnn_py as tg

nn = tg.nn
A0 = tg.power_law_graph(3001, 24000, seed=5)  # directed, hub-heavy, 3001 % 16 != 0
labels = cp.asarray(np.random.default_rng(0).integers(0, 5, 3001))
idx = cp.arange(0, 3001, 7)
for dtype in (np.float32, np.float64):
    rng = cp.random.default_rng(1)
    X = cp.asarray(np.random.default_rng(2).standard_normal((3001, 37)), dtype=dtype)
    # a five-layer GCN has ten parameters: the multi-tensor Adam step launches twice (eight, then two)
    for name, build, init, apply in (("gcn", nn.gcn_norm, nn.gcn_init, nn.gcn_apply),
                                     ("gcn5", nn.gcn_norm, lambda d, r, dtype: nn.gcn_init((37, 16, 16, 16, 16, 5), r,
                                                                                           dtype=dtype), nn.gcn_apply),
                                     ("agnn", nn.add_self_loops, nn.agnn_init, nn.agnn_apply),
                                     ("gat", nn.add_self_loops, lambda d, r, dtype: nn.gat_init(d, r, heads=4,
                                                                                                dtype=dtype),
                                      nn.gat_apply)):
        # (float64 GAT and AGNN: the unfused attention, with the scores' and normalisation's float64 kernels)
        A = build(A0, dtype=dtype)
        params = init((37, 16, 5), rng, dtype=dtype)
        opt = nn.Adam(params, lr=0.01, weight_decay=5e-4)
        r = nn.train(apply, params, A, X, labels, (idx, idx, idx), opt, epochs=3, rng=rng)
        print(f"memcheck nn {name} {np.dtype(dtype).name}: loss {r.final_loss:.3f}")
# mixed precision: 16-bit activations through the tails, the loss and the layers (GAT's scores and AGNN's
# normalisation in 16 bits, the fused attention in 16 bits)
X = cp.asarray(np.random.default_rng(2).standard_normal((3001, 37)), dtype=np.float32)
for half in ("float16", "bfloat16"):
    for name, build, init, apply in (("gcn", nn.gcn_norm, nn.gcn_init, nn.gcn_apply),
                                     ("agnn", nn.add_self_loops, nn.agnn_init, nn.agnn_apply),
                                     ("gat", nn.add_self_loops, lambda d, r: nn.gat_init(d, r, heads=4), nn.gat_apply)):
        A = build(A0)
        params = init((37, 16, 5), cp.random.default_rng(1))
        logits, vjp = apply(params, A, X, rng=cp.random.default_rng(3), dtype=half)
        loss, g = nn.cross_entropy(logits.astype(np.float32), labels, idx)
        nn.Adam(params).step(vjp(g))
        print(f"memcheck nn {name} {half}: loss {float(loss):.3f}")
# the layers' dense kernels at their edges: partial tiles of rows, columns and k, values and float4 copies, B
# transposed, A as a slice of wider rows, the bias and GAT's scores, one slice and many of a long dimension
from tcgnn_py.products import dense# noqa: E402

r = np.random.default_rng(4)
for m, k, n in ((1, 1, 1), (129, 7, 3), (1001, 64, 64), (257, 33, 17), (65, 128, 60), (3001, 16, 50),
                (500, 40, 32), (9001, 16, 64), (1001, 64, 256), (300, 256, 500), (4096, 200, 100)):
    H = cp.asarray(r.standard_normal((m, k + 3)), dtype=np.float32)
    W = cp.asarray(r.standard_normal((k, n)), dtype=np.float32)
    for a, b in ((H[:, :k], W), (cp.ascontiguousarray(H[:, :k]), cp.asfortranarray(W))):
        dense.dense_mm(a, b, cp.ones(n, np.float32))
    if n % 4 == 0 and dense.dense_scores_take(n // 4):
        a1 = cp.ones((4, n // 4), np.float32)
        dense.dense_mm(cp.ascontiguousarray(H[:, :k]), W, None, a1, a1, 4)
    w = min(k, dense.DENSE_ATB_MAX)
    for a in (H[:, :w], None):
        dense.dense_atb(a, cp.ascontiguousarray(H[:, 1:w + 1]))
for N, p, q in ((3000, 64, 256), (5001, 4, 250), (1000, 8, 512)):  # B wider than a tile
    B = cp.asarray(r.standard_normal((N, q + 1)), dtype=np.float32)
    for a in (B[:, :p], None):
        dense.dense_atb(a, B[:, 1:])
# the neighbor sampler: hubs past the fan-out (Floyd's draws), leaves under it, -1 (every neighbor); each hop's
# neighbors against the host reference, and GraphSAGE on the device's blocks, tiled and CSR
from tcgnn_py.sampling import sample_neighbors, sample_reference  # noqa: E402

G = A0.tocsr()
indptr, indices = G.indptr.astype(np.int64), G.indices.astype(np.int32)
seeds = np.random.default_rng(5).permutation(3001)[:301]
for fanout in (1, 5, 15, -1):
    ptr, cols = sample_neighbors(cp.asarray(indptr), cp.asarray(indices), cp.asarray(seeds), fanout, 77)
    want = sample_reference(indptr, indices, seeds, fanout, 77)
    assert (ptr.get() == want[0]).all() and (cols.get() == want[1]).all(), fanout
for fmt in ("tiled", "csr"):
    blocks = nn.sample_blocks(G, seeds, [15, 10, 5], seed=3, device="cuda", format=fmt)
    h = cp.asarray(np.random.default_rng(6).standard_normal((len(blocks[0].src), 37)), dtype=np.float32)
    params = nn.sage_init((37, 16, 16, 5), cp.random.default_rng(1))
    for i, block in enumerate(blocks):
        h, vjp = nn.sage_conv(block, h, params[f"W_self{i}"], params[f"W_neigh{i}"], params[f"b{i}"])
    vjp(cp.ones_like(h))
    print(f"memcheck nn sampled blocks ({fmt}): {[b.adj.nnz for b in blocks]} entries")
# the translation of small matrices in one CTA's launch and in its kernels' launches: the same arrays (hub windows,
# row counts not multiples of the window, both layouts' tile shapes)
for M in (G[:1500][:, :700], G[:37], G[:, :50][:1000]):
    M = M.tocsr().astype(np.float32)
    M.sort_indices()
    arrays = [cp.asarray(a) for a in (M.data, M.indices.astype(np.int32), M.indptr.astype(np.int32))]
    for layout in ("vector", "tcgnn"):
        built = []
        for most in (1 << 30, -1):
            with tg.tuning(sgt_one_launch_max=most):
                built.append(tg.TiledMatrix(tuple(arrays), shape=M.shape, layout=layout).tiling)
        for name in ("win_ptr", "block_cols", "block_ptr", "tile_pos", "perm"):
            assert bool((getattr(built[0], name) == getattr(built[1], name)).all()), name
print("memcheck nn small translations: one launch and the kernels' launches agree")
# per-graph readouts of a batch on the device (segments empty, of one row, long; widths not multiples of 32),
# against the host's
for d in (1, 37):
    ptr = np.array([0, 0, 1, 40, 40, 1003])
    Hh = np.random.default_rng(8).integers(-8, 9, (1003, d)).astype(np.float32)
    for how in ("sum", "mean", "max"):
        out, vjp = nn.readout(cp.asarray(Hh), ptr, how)
        want, want_vjp = nn.readout(Hh, ptr, how)
        assert np.allclose(out.get(), want, rtol=1e-5, atol=1e-6), how
        g = np.ones(want.shape, np.float32)
        assert np.allclose(vjp(cp.asarray(g)).get(), want_vjp(g), rtol=1e-5, atol=1e-6), how
print("memcheck nn readouts ok")
# a batch of small graphs (one of no nodes, one of one node) joined on the host and on the device, a GCN on its CSR
# and its tiles with each graph's mean read out, forward and backward; and a loader sampling ahead on its worker
import cupyx.scipy.sparse as csp  # noqa: E402

parts = [G[:40][:, :40], G[:0][:, :0], G[:1][:, :1], G[100:417][:, 100:417]]
for graphs in (parts, [csp.csr_matrix(g.astype(np.float32)) for g in parts]):
    b = nn.batch(graphs)
    H0 = cp.asarray(np.random.default_rng(9).integers(-8, 9, (b.adj.shape[0], 37)), dtype=np.float32)
    params = nn.gcn_init((37, 16), cp.random.default_rng(1))
    for fmt in ("csr", "tiled"):
        Ahat = nn.gcn_norm(b.adj, format=fmt)
        H, conv = nn.gcn_conv(Ahat, H0, params["W0"], params["b0"])
        pooled, pool = nn.readout(H, b.ptr, "mean")
        conv(pool(cp.ones_like(pooled)))
        print(f"memcheck nn batch ({type(graphs[0]).__module__.split('.')[0]}, {fmt}): {b.adj.nnz} entries")
loader = nn.NeighborLoader(G, np.arange(0, 3001, 3), [10, 5], 256, seed=2, device="cuda", prefetch=True)
print(f"memcheck nn loader: {sum(blocks[0].adj.nnz for _, blocks in loader)} first-layer entries")
# a device CSR's index pointer ends, which only the translation's check kernel reads: wrong (scipy's errors, nothing
# translated) or short of the entries (those before it translated)
vals, cols = cp.ones(5, np.float32), cp.asarray([0, 2, 1, 7, 9], np.int32)
for ptr in ([1, 2, 3, 5], [0, 2, 3, 9]):
    try:
        tg.TiledMatrix((vals, cols, cp.asarray(ptr, np.int32)), shape=(3, 10))
    except ValueError:
        pass
    else:
        raise AssertionError(ptr)
assert tg.TiledMatrix((vals, cols, cp.asarray([0, 2, 3, 3], np.int32)), shape=(3, 10)).nnz == 3
cp.cuda.Device().synchronize()
print("memcheck nn workload ok")
