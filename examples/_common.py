"""What every example shares: one command line convention (``--device auto|cuda|cpu``), Cora loading, reports."""

import argparse
import functools
import os
import warnings


def parse_args(description, *, training=False, default_min_acc=0.80, argv=None, extra=None):
    """Every example's arguments: ``--device``; training examples add epochs, seed and an accuracy floor.

    ``extra(parser)`` adds an example's own arguments.

    Call it before importing tcgnn_py: ``--device cpu`` sets ``TCGNN_PY_DEVICE``,
    which tcgnn_py reads at its first device probe.
    """
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: the GPU when usable; cuda: fail without one; cpu: the NumPy reference path")
    if training:
        p.add_argument("--epochs", type=int, default=200, help="training epochs (default 200)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--min-accuracy", type=float, default=default_min_acc,
                       help="fail below this test accuracy (default %(default)s)")
        p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                       help="float16 / bfloat16: mixed precision -- 16-bit activations and tensor cores on the "
                            "vector layout, float32 master weights (bfloat16 needs ml_dtypes)")
        p.add_argument("--cuda-graph", action="store_true",
                       help="capture one training step as a CUDA graph and replay it (GPU only; same results)")
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    if training:
        if args.epochs < 1:
            p.error(f"--epochs must be at least 1, got {args.epochs}")
        if not 0 <= args.min_accuracy <= 1:
            p.error(f"--min-accuracy is a fraction in [0, 1], got {args.min_accuracy}")
        if args.dtype == "bfloat16":
            try:
                import ml_dtypes  # noqa: F401
            except ImportError:
                p.error("--dtype bfloat16 needs the optional ml_dtypes package: pip install 'tcgnn_py[bf16]'")
    if args.device == "cpu":
        os.environ["TCGNN_PY_DEVICE"] = "cpu"
        warnings.filterwarnings("ignore", message="tcgnn_py: no usable GPU")  # asked for
    if args.device != "cpu" or getattr(args, "cuda_graph", False):
        import tcgnn_py as tg

        gpu = args.device != "cpu" and tg.gpu_available()
        if args.device == "cuda" and not gpu:
            p.error("--device cuda: no usable GPU here")
        if getattr(args, "cuda_graph", False) and not gpu:
            p.error("--cuda-graph captures GPU work: it needs a usable GPU (not --device cpu)")
    return args


def load(tg):
    """Cora with row-normalised dense features (float32)."""
    import numpy as np

    g = tg.load_cora()
    X = g.features.toarray().astype(np.float32)
    X /= np.maximum(X.sum(axis=1, keepdims=True), 1)
    return g, X


def precision_args(args):
    """``(layout, dtype)`` for the graph and for training: 16-bit runs take the vector layout's kernels."""
    if args.dtype == "float32":
        return None, None
    return "vector", args.dtype


def device_name(A):
    return "GPU (CuPy, tensor cores)" if A.device == "cuda" else "CPU (NumPy reference path)"


def report(name, r, epochs, device, min_acc, dtype="float32"):
    print(f"{name} on Cora, {device}, {dtype}: {epochs} epochs")
    print(f"  test accuracy {100 * r.test_acc:.1f}% (epoch {r.best_epoch + 1}, best validation "
          f"{100 * r.val_acc:.1f}%); last epoch {100 * r.final_test_acc:.1f}%, loss {r.final_loss:.3f}")
    print(f"  time per epoch {1e3 * r.epoch_time:.2f} ms (median training step)")
    assert r.test_acc >= min_acc, f"test accuracy {r.test_acc:.3f} < {min_acc}"


def jax_setup(args, name):
    """Before importing JAX: ``--device cpu`` is JAX's CPU backend too, and JAX leaves the GPU's memory to be
    shared with the library's CuPy pool; the JAX examples run float32 only, and XLA decides what it captures."""
    import os

    if args.dtype != "float32" or args.cuda_graph:
        raise SystemExit(f"{name}: float32 only, and XLA decides what it captures (no --dtype, no --cuda-graph)")
    if args.device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def jax_train(name, g, forward, params, X, *, lr, decayed, epochs, min_acc, seed=0):
    """Train ``forward(params, X, key) -> logits`` (``key`` None: no dropout) on Cora's split with one jitted step --
    the loss's gradient with L2 decay on the ``decayed`` parameters (as PyTorch's Adam) and Adam -- keep the
    epoch of best validation accuracy, report as the other examples, and fail below ``min_acc``.  The features
    ``X`` are an argument of the jitted functions, not a constant they close over: XLA would compile a closed-over
    array into the program (seconds for a large one)."""
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    labels = jnp.asarray(g.labels)
    train, val, test = (jnp.asarray(i) for i in (g.train_idx, g.val_idx, g.test_idx))

    def loss(params, X, key):
        logp = jax.nn.log_softmax(forward(params, X, key)[train])
        return -jnp.take_along_axis(logp, labels[train][:, None], axis=1).mean()

    # (the parameters and Adam's state donated: the step's results reuse their buffers, and XLA replays its
    # command buffers without updating their addresses)
    @functools.partial(jax.jit, donate_argnums=(0, 1, 2, 3))
    def step(params, m, v, t, X, key):
        value, grads = jax.value_and_grad(loss)(params, X, key)
        grads = {k: grads[k] + (5e-4 * params[k] if k in decayed else 0) for k in grads}
        t = t + 1
        m = {k: 0.9 * m[k] + 0.1 * grads[k] for k in grads}
        v = {k: 0.999 * v[k] + 0.001 * grads[k] ** 2 for k in grads}
        c2 = jnp.sqrt(1 - 0.999 ** t)
        params = {k: params[k] - lr * c2 / (1 - 0.9 ** t) * m[k] / (jnp.sqrt(v[k]) + 1e-8 * c2) for k in params}
        return params, m, v, t, value

    @jax.jit
    def accuracies(params, X):
        pred = forward(params, X, None).argmax(axis=1)
        return tuple((pred[i] == labels[i]).mean() for i in (val, test))

    m = {k: jnp.zeros_like(p) for k, p in params.items()}
    v = {k: jnp.zeros_like(p) for k, p in params.items()}
    t, key = jnp.zeros((), jnp.float32), jax.random.PRNGKey(seed + 1)
    best, times = (-1.0, 0.0, 0), []
    for epoch in range(epochs):
        key, sub = jax.random.split(key)
        start = time.perf_counter()
        params, m, v, t, value = step(params, m, v, t, X, sub)
        value.block_until_ready()
        times.append(time.perf_counter() - start)
        val_acc, test_acc = (float(a) for a in accuracies(params, X))
        if val_acc > best[0]:
            best = (val_acc, test_acc, epoch)
    gpu = jax.default_backend() == "gpu"
    device = "GPU (JAX with CUDA, tcgnn_py's kernels)" if gpu else "CPU (JAX, reference path)"
    print(f"{name} in JAX on Cora, {device}, float32: {epochs} epochs")
    print(f"  test accuracy {100 * best[1]:.1f}% (epoch {best[2] + 1}, best validation {100 * best[0]:.1f}%); "
          f"last loss {float(value):.3f}")
    print(f"  time per epoch {1e3 * float(np.median(times)):.2f} ms (median jitted step)")
    assert best[1] >= min_acc, f"test accuracy {best[1]:.3f} < {min_acc}"
