"""Train a GAT (graph attention network) on Cora: fused attention (scores, softmax, aggregation in one pass).

Veličković et al.'s Cora model: dropout 0.6, GAT layer 1433 -> 8 x 8 heads (concatenated), ELU,
dropout 0.6, GAT layer 64 -> 7 (one head); Adam with lr 0.005 and weight decay 5e-4, 200 epochs,
Planetoid split, the epoch with the best validation accuracy kept; dropout 0.6 on the attention
too.  The GAT paper reports 83.0 %; this asserts >= 80 %.

    python examples/gat_cora.py                       # GPU if usable
    python examples/gat_cora.py --device cpu --epochs 50 --min-accuracy 0.7
    python examples/gat_cora.py --dtype float16           # mixed precision (bfloat16 too)
    python examples/gat_cora.py --cuda-graph              # replay a captured step (launch-bound graphs)
"""

from _common import device_name, load, parse_args, precision_args, report

args = parse_args(__doc__.splitlines()[0], training=True)

import tcgnn_py as tg  # noqa: E402  (after --device has set TCGNN_PY_DEVICE)

nn = tg.nn
g, X = load(tg)
layout, dtype = precision_args(args)  # --dtype float16|bfloat16: mixed precision on the vector layout
A = nn.add_self_loops(g.adj, layout=layout)  # each node attends to itself and its neighbours
rng = nn.default_rng(args.seed, like=A)  # parameters and dropout masks on A's device
params = nn.gat_init((X.shape[1], 8, int(g.labels.max()) + 1), rng, heads=8)
opt = nn.Adam(params, lr=0.005, weight_decay=5e-4)
result = nn.train(nn.gat_apply, params, A, X, g.labels, (g.train_idx, g.val_idx, g.test_idx), opt,
                  epochs=args.epochs, rng=rng, dropout_p=0.6, dtype=dtype, cuda_graph=args.cuda_graph)
report("GAT", result, args.epochs, device_name(A), args.min_accuracy, args.dtype)
