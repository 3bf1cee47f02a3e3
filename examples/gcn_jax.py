"""Train the 2-layer GCN on Cora in JAX: one jitted step whose aggregations are tcgnn_py's products.

The step -- dropout, forward, cross-entropy on the training nodes, its gradient, an Adam update -- is one
``jax.jit`` program; ``tcgnn_py.jax.gcn_conv`` runs ``dropout(H) @ W`` (the library's dropped product where the
features are wide, XLA's GEMM elsewhere) and the sparse product as the library's (on the GPU its tensor-core
kernels on XLA's stream; on JAX's CPU backend the reference path).  The setup of the GCN paper, as
examples/gcn_cora.py: hidden 16, dropout 0.5, Adam lr 0.01, weight decay 5e-4 on the first layer, 200 epochs,
the public split; the model with the best validation accuracy is the one tested.

    python examples/gcn_jax.py                       # GPU if usable (JAX with CUDA, CuPy)
    python examples/gcn_jax.py --device cpu --epochs 60 --min-accuracy 0.75
"""

from _common import jax_setup, jax_train, load, parse_args

args = parse_args(__doc__.splitlines()[0], training=True)
jax_setup(args, "gcn_jax.py")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import tcgnn_py as tg  # noqa: E402
from tcgnn_py import jax as tgj  # noqa: E402

g, X = load(tg)
A = tg.nn.gcn_norm(g.adj)  # D^-1/2 (A + I) D^-1/2, static in the jitted step
X = jnp.asarray(X)
dims = (X.shape[1], 16, int(g.labels.max()) + 1)
# drawn on the host: jnp.asarray of a CuPy array views CuPy's memory without holding it (see the JAX guide)
params = {k: jnp.asarray(v) for k, v in tg.nn.gcn_init(dims, tg.nn.default_rng(args.seed)).items()}


def forward(params, X, key):
    # each layer's input dropped (rate 0.5) by the library's mask; on the GPU the first layer's product reads the
    # features dropped, so no dropped copy of them is written
    keys = [{} if key is None else dict(dropout=0.5, key=jax.random.fold_in(key, i)) for i in (0, 1)]
    h = jax.nn.relu(tgj.gcn_conv(A, X, params["W0"], params["b0"], **keys[0]))
    return tgj.gcn_conv(A, h, params["W1"], params["b1"], **keys[1])


jax_train("GCN", g, forward, params, X, lr=0.01, decayed={"W0", "b0"}, epochs=args.epochs, min_acc=args.min_accuracy,
          seed=args.seed)
