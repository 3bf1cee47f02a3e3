"""Train the 2-layer GCN on Cora in JAX: one jitted step whose aggregations are tcgnn_py's products.

The step -- dropout, forward, cross-entropy on the training nodes, its gradient, an Adam update -- is one
``jax.jit`` program; ``tcgnn_py.jax.gcn_conv`` runs ``H @ W`` as XLA's GEMM and the sparse product as the
library's (on the GPU its tensor-core kernels on XLA's stream; on JAX's CPU backend the reference path).  The
setup of the GCN paper, as examples/gcn_cora.py: hidden 16, dropout 0.5, Adam lr 0.01, weight decay 5e-4 on the
first layer, 200 epochs, the public split; the model with the best validation accuracy is the one tested.

    python examples/gcn_jax.py                       # GPU if usable (JAX with CUDA, CuPy)
    python examples/gcn_jax.py --device cpu --epochs 60 --min-accuracy 0.75
"""

import os
import time

from _common import load, parse_args

args = parse_args(__doc__.splitlines()[0], training=True)
if args.dtype != "float32" or args.cuda_graph:
    raise SystemExit("gcn_jax.py: float32 only, and XLA decides what it captures (no --dtype, no --cuda-graph)")
if args.device == "cpu":
    os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # (room for the library's CuPy pool beside XLA)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import tcgnn_py as tg  # noqa: E402
from tcgnn_py import jax as tgj  # noqa: E402

g, X = load(tg)
A = tg.nn.gcn_norm(g.adj)  # D^-1/2 (A + I) D^-1/2, static in the jitted step
labels = jnp.asarray(g.labels)
train, val, test = (jnp.asarray(i) for i in (g.train_idx, g.val_idx, g.test_idx))
X = jnp.asarray(X)
dims = (X.shape[1], 16, int(g.labels.max()) + 1)


def glorot(key, shape):
    a = np.sqrt(6.0 / (shape[0] + shape[1]))
    return jax.random.uniform(key, shape, jnp.float32, -a, a)


k0, k1, key = jax.random.split(jax.random.PRNGKey(args.seed), 3)
params = {"W0": glorot(k0, dims[:2]), "b0": jnp.zeros(dims[1]), "W1": glorot(k1, dims[1:]), "b1": jnp.zeros(dims[2])}


def dropout(key, h, p=0.5):
    return jnp.where(jax.random.bernoulli(key, 1 - p, h.shape), h / (1 - p), 0)


def forward(params, key=None):
    h = X if key is None else dropout(jax.random.fold_in(key, 0), X)
    h = jax.nn.relu(tgj.gcn_conv(A, h, params["W0"], params["b0"]))
    h = h if key is None else dropout(jax.random.fold_in(key, 1), h)
    return tgj.gcn_conv(A, h, params["W1"], params["b1"])


def loss(params, key):
    logp = jax.nn.log_softmax(forward(params, key)[train])
    return -jnp.take_along_axis(logp, labels[train][:, None], axis=1).mean()


@jax.jit
def step(params, m, v, t, key):
    """One training step: the loss's gradient (with L2 decay on the first layer, as PyTorch's Adam) and Adam."""
    value, grads = jax.value_and_grad(loss)(params, key)
    grads = {k: grads[k] + (5e-4 * params[k] if k in ("W0", "b0") else 0) for k in grads}
    t = t + 1
    m = {k: 0.9 * m[k] + 0.1 * grads[k] for k in grads}
    v = {k: 0.999 * v[k] + 0.001 * grads[k] ** 2 for k in grads}
    lr = 0.01 * jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
    params = {k: params[k] - lr * m[k] / (jnp.sqrt(v[k]) + 1e-8 * jnp.sqrt(1 - 0.999 ** t)) for k in params}
    return params, m, v, t, value


@jax.jit
def accuracies(params):
    pred = forward(params).argmax(axis=1)
    return tuple((pred[i] == labels[i]).mean() for i in (val, test))


m = {k: jnp.zeros_like(p) for k, p in params.items()}
v = {k: jnp.zeros_like(p) for k, p in params.items()}
t = jnp.zeros((), jnp.float32)
best, times = (-1.0, 0.0, 0), []
for epoch in range(args.epochs):
    key, sub = jax.random.split(key)
    start = time.perf_counter()
    params, m, v, t, value = step(params, m, v, t, sub)
    value.block_until_ready()
    times.append(time.perf_counter() - start)
    val_acc, test_acc = (float(a) for a in accuracies(params))
    if val_acc > best[0]:
        best = (val_acc, test_acc, epoch)
device = "GPU (JAX with CUDA, tcgnn_py's kernels)" if jax.default_backend() == "gpu" else "CPU (JAX, reference path)"
print(f"GCN in JAX on Cora, {device}, float32: {args.epochs} epochs")
print(f"  test accuracy {100 * best[1]:.1f}% (epoch {best[2] + 1}, best validation {100 * best[0]:.1f}%); "
      f"last loss {float(value):.3f}")
print(f"  time per epoch {1e3 * float(np.median(times)):.2f} ms (median jitted step)")
assert best[1] >= args.min_accuracy, f"test accuracy {best[1]:.3f} < {args.min_accuracy}"
