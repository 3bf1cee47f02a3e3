"""Feed JAX GPU arrays to tcgnn_py through DLPack -- tcgnn_py imports no framework.

tcgnn_py accepts any array that exports ``__dlpack__`` (or
``__cuda_array_interface__``) on a CUDA device and wraps it without a copy;
results are CuPy arrays, which JAX takes back through DLPack, again without a
copy.  So a JAX pipeline (or any other DLPack producer) can call the
tensor-core SpMM and the GNN layers directly.

    python examples/dlpack_interop.py

Exits 0 with a "skipped" line when JAX (with a GPU) is not installed.
"""

import os
import sys

import numpy as np
from _common import parse_args


def jax_framework():
    # JAX takes 75 % of the GPU's memory when it starts; CuPy shares this GPU here, so JAX takes what it needs.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp

    if not [d for d in jax.devices() if d.platform == "gpu"]:
        raise ImportError("JAX sees no GPU")
    key = jax.random.PRNGKey(0)
    return {
        "name": f"JAX {jax.__version__}",
        "randn": lambda shape: jax.random.normal(key, shape, dtype=jnp.float32),
        "from_dlpack": jnp.from_dlpack,
        "to_numpy": np.asarray,
        "type": jax.Array,
    }


def pick():
    """The JAX framework table, or the reason it cannot run here."""
    try:
        return jax_framework()
    except ImportError as exc:  # not installed, or no GPU for it
        return str(exc)


def main():
    args = parse_args(__doc__.splitlines()[0])
    import tcgnn_py as tg

    if args.device == "cpu" or not tg.gpu_available():
        print("skipped: this example moves GPU arrays, and tcgnn_py runs on the CPU here")
        return
    g = tg.load_cora()
    A = tg.nn.gcn_norm(g.adj)  # a TiledMatrix on the GPU
    assert not {"jax", "torch"} & set(sys.modules), "tcgnn_py imported a framework"
    fw = pick()
    if isinstance(fw, str):
        print(f"skipped: no JAX with a GPU ({fw})")
        return
    X = fw["randn"]((g.adj.shape[0], 64))  # a framework array on the GPU
    W = fw["randn"]((64, 16))

    Y = tg.spmm(A, X)  # DLPack in: no copy of X
    Y_fw = fw["from_dlpack"](Y)  # DLPack out: no copy of Y
    assert isinstance(Y_fw, fw["type"])
    Xh = fw["to_numpy"](X).astype(np.float64)
    want = A.tocsr().astype(np.float64) @ Xh
    err = np.linalg.norm(fw["to_numpy"](Y_fw) - want) / np.linalg.norm(want)
    print(f"{fw['name']}: A_hat @ X through DLPack, {Y_fw.shape}, relative error {err:.1e} (TF32)")
    assert err < 1e-3

    # A GCN layer and its backward on framework arrays, gradients handed back the same way.
    out, vjp = tg.nn.gcn_conv(A, X, W)
    dH, dW, _ = vjp(fw["from_dlpack"](out))  # d(0.5 |out|^2) / d(out) = out
    dW_fw = fw["from_dlpack"](dW)
    want_dW = Xh.T @ (A.tocsr().T @ (want @ fw["to_numpy"](W).astype(np.float64)))
    err = np.linalg.norm(fw["to_numpy"](dW_fw) - want_dW) / np.linalg.norm(want_dW)
    print(f"{fw['name']}: gcn_conv forward and backward through DLPack, dW relative error {err:.1e}")
    assert err < 1e-3


if __name__ == "__main__":
    main()
