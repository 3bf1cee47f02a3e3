"""Train a GAT on Cora in JAX: one jitted step whose attention and aggregations run over tcgnn_py's products.

``tcgnn_py.jax.gat_conv`` writes graph attention as matrix operations -- per-node scores, a softmax over each
row's entries in ``jnp``, the aggregation by the library's product with the attention as the entries' values --
inside one ``jax.jit`` step with the loss, its gradient and Adam.  Veličković et al.'s Cora model, as
examples/gat_cora.py: dropout 0.6 on the features and the attention, 8 heads of 8 (concatenated), ELU, one
output head; Adam with lr 0.005 and weight decay 5e-4, 200 epochs; the best validation epoch is tested.

    python examples/gat_jax.py                       # GPU if usable (JAX with CUDA, CuPy)
    python examples/gat_jax.py --device cpu --epochs 60 --min-accuracy 0.75
"""

from _common import jax_setup, jax_train, load, parse_args

args = parse_args(__doc__.splitlines()[0], training=True)
jax_setup(args, "gat_jax.py")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import tcgnn_py as tg  # noqa: E402
from tcgnn_py import jax as tgj  # noqa: E402

g, X = load(tg)
A = tg.nn.add_self_loops(g.adj)  # each node attends to itself and its neighbours; static in the jitted step
X = jnp.asarray(X)
dims = (X.shape[1], 8, int(g.labels.max()) + 1)
# drawn on the host: jnp.asarray of a CuPy array views CuPy's memory without holding it (see the JAX guide)
params = {k: jnp.asarray(v) for k, v in tg.nn.gat_init(dims, tg.nn.default_rng(args.seed), heads=8).items()}
P = 0.6


def dropout(key, h):
    return jnp.where(jax.random.bernoulli(key, 1 - P, h.shape), h / (1 - P), 0)


def forward(params, X, key):
    keys = [None] * 4 if key is None else list(jax.random.split(key, 4))
    att = dict(dropout=0.0 if key is None else P)
    h = X if key is None else dropout(keys[0], X)
    h = tgj.gat_conv(A, h, params["W1"], params["a_src1"], params["a_dst1"], params["b1"], heads=8, key=keys[1],
                     **att)
    h = jax.nn.elu(h)
    h = h if key is None else dropout(keys[2], h)
    return tgj.gat_conv(A, h, params["W2"], params["a_src2"], params["a_dst2"], params["b2"], heads=1, key=keys[3],
                        **att)


jax_train("GAT", g, forward, params, X, lr=0.005, decayed=set(params), epochs=args.epochs,
          min_acc=args.min_accuracy, seed=args.seed)
