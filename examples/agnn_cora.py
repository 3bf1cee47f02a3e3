"""Train an AGNN (attention-based GNN) on Cora: SDDMM attention, edge softmax, SpMM aggregation.

Thekumparampil et al.'s model as PyTorch Geometric's example builds it: dropout,
linear 1433 -> 16, ReLU, two attention propagation layers (the first with a
fixed temperature, the second learned), dropout, linear 16 -> 7; Adam with
lr 0.01 and weight decay 5e-4, 200 epochs, Planetoid split.  The AGNN paper
reports 83.1 %; this asserts >= 80 %.

    python examples/agnn_cora.py                       # GPU if usable
    python examples/agnn_cora.py --device cpu --epochs 50 --min-accuracy 0.7
    python examples/agnn_cora.py --dtype float16           # mixed precision (bfloat16 too)
    python examples/agnn_cora.py --cuda-graph              # replay a captured step (launch-bound graphs)
"""

from _common import device_name, load, parse_args, precision_args, report

args = parse_args(__doc__.splitlines()[0], training=True)

import tcgnn_py as tg  # noqa: E402  (after --device has set TCGNN_PY_DEVICE)

nn = tg.nn
g, X = load(tg)
layout, dtype = precision_args(args)  # --dtype float16|bfloat16: mixed precision on the vector layout
A = nn.add_self_loops(g.adj, layout=layout)  # each node attends to itself and its neighbours
rng = nn.default_rng(args.seed, like=A)  # parameters and dropout masks on A's device
params = nn.agnn_init((X.shape[1], 16, int(g.labels.max()) + 1), rng, n_prop=2)
opt = nn.Adam(params, lr=0.01, weight_decay=5e-4)
result = nn.train(nn.agnn_apply, params, A, X, g.labels, (g.train_idx, g.val_idx, g.test_idx), opt,
                  epochs=args.epochs, rng=rng, dropout_p=0.5, dtype=dtype,
                  cuda_graph=args.cuda_graph)
report("AGNN", result, args.epochs, device_name(A), args.min_accuracy, args.dtype)
