"""Workload for compute-sanitizer memcheck of tcgnn_py.jax: every operation inside ``jax.jit`` on XLA's buffers.

    compute-sanitizer --tool memcheck --show-backtrace no python tools/memcheck_jax.py   # the GPU (JAX with CUDA)
    JAX_PLATFORMS=cpu python tools/memcheck_jax.py --n 300                                # JAX's CPU backend

On a hub-heavy matrix whose row count is not a multiple of 16, in parts (``--parts`` runs some, to find which
one a tool's failure is in): the product (float32, float16, bfloat16, its transpose, with given values,
vmapped) and SDDMM; the dropped product and its gradients; the fused attention forward and backward (additive
scores with dropout, cosine scores); and a jitted training step of GCN, GAT and AGNN layers run past the timed
choice, so the bound and recorded calls run too.  Products of small integers are compared with exact ones.

Under compute-sanitizer the process dies now and then of a segmentation fault, before any report and at no fixed
point (without the sanitizer this workload has not crashed).  It has completed whole only with two settings: XLA's
own GEMMs run as cuBLAS calls, not Triton fusions, untuned (``XLA_FLAGS`` gains
``--xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0``), and the sanitizer takes no host backtraces
(``--show-backtrace no``; an error is still reported with its kernel, thread and address); with them it still dies
in some runs.  ``tools/gpu_run.sh`` runs it whole, and again where a run died before any report, never where one
reported.  The library's kernels are the same either way.
"""

import argparse
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # (CuPy's pool beside XLA's)
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), "--xla_gpu_enable_triton_gemm=false",
                                    "--xla_gpu_autotune_level=0"]).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import tcgnn_py as tg  # noqa: E402
from tcgnn_py import jax as tgj  # noqa: E402


def ints(rng, *shape):
    return rng.integers(-4, 5, shape).astype(np.float32)


PARTS = ("products", "dense", "attention", "step")


def products(A, rng):
    """The product (three widths, its transpose, 16-bit x, given values, vmapped) and SDDMM, exact."""
    n = A.shape[0]
    M = A.tocsr().toarray().astype(np.float64)
    for D in (1, 37, 64):
        x = ints(rng, n, D)
        f = jax.jit(lambda x: tgj.spmm(A, x))
        for _ in range(3):  # (planned, then bound)
            np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x))), M @ x)
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: tgj.spmm(A.T, x))(jnp.asarray(x))), M.T @ x)
    for dtype in (jnp.float16, jnp.bfloat16):
        x = ints(rng, n, 40)
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: tgj.spmm(A, x))(jnp.asarray(x, dtype))), M @ x)
    rows, cols = tgj.entries(A)
    v = ints(rng, A.nnz)
    V = np.zeros(A.shape)
    V[rows, cols] = v
    x = ints(rng, n, 16)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v, x: tgj.spmm(A, x, values=v))(jnp.asarray(v),
                                                                                               jnp.asarray(x))), V @ x)
    a, b = ints(rng, n, 8), ints(rng, n, 8)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, b: tgj.sddmm(A, a, b))(jnp.asarray(a), jnp.asarray(b))),
                                  (a[rows] * b[cols]).sum(axis=1))
    xb = ints(rng, 3, n, 8)
    got = jax.jit(jax.vmap(lambda x: tgj.spmm(A, x)))(jnp.asarray(xb))
    np.testing.assert_array_equal(np.asarray(got), np.einsum("ij,bjd->bid", M, xb))
    print("memcheck jax: products, sddmm, vmap exact")


def dense(A, rng):
    """The dropped product (the library's kernels where the input is wide) and its gradients, exact."""
    key = jax.random.key(4)
    for k, m in ((200, 16), (1433, 32), (129, 3)):
        H, W, g = (jnp.asarray(ints(rng, *s)) for s in ((A.shape[0], k), (k, m), (A.shape[0], m)))
        f = jax.jit(lambda H, W, g: jax.vjp(lambda H, W: tgj.linear(H, W, dropout=0.5, key=key), H, W)[1](g))
        Hd = np.asarray(tgj.dropout(H, 0.5, key), np.float64)
        dH, dW = f(H, W, g)
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda H, W: tgj.linear(H, W, dropout=0.5, key=key))(H, W)),
                                      Hd @ np.asarray(W, np.float64))
        np.testing.assert_array_equal(np.asarray(dW), Hd.T @ np.asarray(g, np.float64))
    print("memcheck jax: dropped products and their gradients exact")


def attention(A, rng):
    """The fused attention's forward and backward, additive scores with dropout and cosine scores."""
    n = A.shape[0]
    for dtype in (jnp.float32, jnp.float16):
        Vf = jnp.asarray(rng.standard_normal((n, 32)), dtype)
        s = jnp.asarray(rng.standard_normal((n, 4)), jnp.float32)

        def additive(Vf, s_src, s_dst, key):
            return jnp.sum(tgj.graph_attention(A, Vf, heads=4, s_src=s_src, s_dst=s_dst, dropout=0.3, key=key)
                           .astype(jnp.float32) ** 2)

        def cosine(Vf, beta):
            return jnp.sum(tgj.graph_attention(A, Vf, score="cosine", Q=Vf, K=Vf, beta=beta).astype(jnp.float32) ** 2)

        grads = jax.jit(jax.grad(additive, argnums=(0, 1, 2)))(Vf, s, s, jax.random.key(1))
        grads += jax.jit(jax.grad(cosine, argnums=(0, 1)))(Vf, jnp.ones(1, jnp.float32))
        assert all(np.isfinite(np.asarray(g, np.float32)).all() for g in grads)
    print("memcheck jax: fused attention forward and backward, float32 and float16")


def step(A0, A, rng, steps):
    """Jitted training steps of GCN (its input dropped in the product), GAT and AGNN layers."""
    n = A.shape[0]
    G = tg.nn.gcn_norm(A0, device=A.device)
    X = jnp.asarray(rng.standard_normal((n, 137)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 5, n))
    shapes = {"W0": (137, 16), "b0": (16,), "W1": (16, 32), "a_src": (4, 8), "a_dst": (4, 8), "W2": (32, 5)}
    params = {k: jnp.asarray(0.1 * rng.standard_normal(s), jnp.float32) for k, s in shapes.items()}
    params["beta"] = jnp.ones((1,), jnp.float32)

    def loss(p, X, key):
        k1, k2 = jax.random.split(key)
        h = jax.nn.relu(tgj.gcn_conv(G, X, p["W0"], p["b0"], dropout=0.5, key=k2))
        h = jax.nn.elu(tgj.gat_conv(A, h, p["W1"], p["a_src"], p["a_dst"], heads=4, dropout=0.2, key=k1))
        h = tgj.agnn_conv(A, h, p["beta"])
        logits = tgj.gcn_conv(G, h, p["W2"])
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()

    @jax.jit
    def step(p, X, key):
        key, sub = jax.random.split(key)
        value, grads = jax.value_and_grad(loss)(p, X, sub)
        return {k: p[k] - 0.05 * grads[k] for k in p}, value, key

    key, values = jax.random.key(2), []
    for _ in range(steps):
        params, value, key = step(params, X, key)
        values.append(float(value))
    assert np.isfinite(values).all(), values
    print(f"memcheck jax: {steps} jitted training steps (GCN, GAT, AGNN layers) on {jax.default_backend()}, "
          f"loss {values[0]:.3f} -> {values[-1]:.3f}")


def main(n, steps, parts=PARTS):
    device = "cuda" if jax.default_backend() == "gpu" else "cpu"
    rng = np.random.default_rng(0)
    A0 = tg.power_law_graph(n, 8 * n, seed=5)
    A = tg.nn.add_self_loops(A0, device=device)
    run = {"products": products, "dense": dense, "attention": attention,
           "step": lambda A, rng: step(A0, A, rng, steps)}
    for part in parts:
        run[part](A, rng)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3001,
                    help="rows of the hub-heavy matrix (default 3001, not a multiple of 16)")
    ap.add_argument("--steps", type=int, default=30, help="jitted training steps (default 30: past the timed choice)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated parts to run, in order (default all: {','.join(PARTS)})")
    args = ap.parse_args()
    parts = args.parts.split(",")
    if not set(parts) <= set(PARTS):
        ap.error(f"--parts: each of {', '.join(PARTS)}, got {args.parts!r}")
    main(args.n, args.steps, parts)
