"""Workload for compute-sanitizer memcheck of tcgnn_py.nn: every kernel the layers launch, row counts not multiples of 16."""

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
cp.cuda.Device().synchronize()
print("memcheck nn workload ok")
