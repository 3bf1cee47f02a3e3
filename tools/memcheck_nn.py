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
    for name, build, init, apply in (("gcn", nn.gcn_norm, nn.gcn_init, nn.gcn_apply),
                                     ("agnn", nn.add_self_loops, nn.agnn_init, nn.agnn_apply)):
        A = build(A0, dtype=dtype)
        params = init((37, 16, 5), rng, dtype=dtype)
        opt = nn.Adam(params, lr=0.01, weight_decay=5e-4)
        r = nn.train(apply, params, A, X, labels, (idx, idx, idx), opt, epochs=3, rng=rng)
        print(f"memcheck nn {name} {np.dtype(dtype).name}: loss {r.final_loss:.3f}")
cp.cuda.Device().synchronize()
print("memcheck nn workload ok")
