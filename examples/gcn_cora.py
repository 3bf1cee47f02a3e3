"""Train Kipf & Welling's 2-layer GCN on Cora with tcgnn_py's tensor-core SpMM.

The setup of the GCN paper: hidden 16, dropout 0.5, Adam with lr 0.01, weight
decay 5e-4 on the first layer, 200 epochs, the Planetoid public split (140
training nodes).  The paper reports 81.5 % test accuracy; this asserts >= 80 %.

    python examples/gcn_cora.py                       # GPU if usable
    python examples/gcn_cora.py --device cpu --epochs 50 --min-accuracy 0.7
    python examples/gcn_cora.py --dtype float16           # mixed precision (bfloat16 too)
    python examples/gcn_cora.py --cuda-graph              # replay a captured step (launch-bound graphs)
"""

from _common import device_name, load, parse_args, precision_args, report

args = parse_args(__doc__.splitlines()[0], training=True)

import tcgnn_py as tg  # noqa: E402  (after --device has set TCGNN_PY_DEVICE)

nn = tg.nn
g, X = load(tg)
layout, dtype = precision_args(args)  # --dtype float16|bfloat16: mixed precision on the vector layout
A = nn.gcn_norm(g.adj, layout=layout)  # D^-1/2 (A + I) D^-1/2 as tensor-core tiles
rng = nn.default_rng(args.seed, like=A)  # parameters and dropout masks on A's device
params = nn.gcn_init((X.shape[1], 16, int(g.labels.max()) + 1), rng)
opt = nn.Adam(params, lr=0.01, weight_decay={"W0": 5e-4, "b0": 5e-4})
result = nn.train(nn.gcn_apply, params, A, X, g.labels, (g.train_idx, g.val_idx, g.test_idx), opt,
                  epochs=args.epochs, rng=rng, dropout_p=0.5, dtype=dtype,
                  cuda_graph=args.cuda_graph)
report("GCN", result, args.epochs, device_name(A), args.min_accuracy, args.dtype)
