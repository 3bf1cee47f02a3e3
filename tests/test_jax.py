"""tcgnn_py.jax: the products as JAX operations through XLA's FFI -- values, gradients, transforms and errors.

On JAX's CPU backend (CI) the FFI target's host implementation runs the reference product, so the whole path --
trace-time checks, the ctypes handler, XLA's call frame, the custom vjp -- is tested without a GPU; the GPU test
runs the same checks on the GPU backend.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from _env import GPU, int_graph, ints

jax = pytest.importorskip("jax", reason="tcgnn_py.jax needs JAX (pip install 'tcgnn_py[jax]')")
jnp = pytest.importorskip("jax.numpy")

import tcgnn_py as tg  # noqa: E402
from tcgnn_py import jax as tgj  # noqa: E402


def _matrix(rng, n, k, device="cpu", **kw):
    A = int_graph(rng, n, k, degree=min(8, max(1, k // 3))).astype(np.float32)
    return A, tg.TiledMatrix(A, device=device, **kw)


@pytest.mark.parametrize("layout", ["tcgnn", "vector"])
@pytest.mark.parametrize("n, k, D", [(37, 37, 5), (100, 61, 16), (16, 200, 1)])
def test_jitted_spmm_is_the_product(layout, n, k, D):
    """Exact on small integers, through jit, for 2-D and 1-D x, and for T.T."""
    rng = np.random.default_rng(0)
    A, T = _matrix(rng, n, k, layout=layout)
    M = A.toarray().astype(np.float64)
    x = ints(rng, k, D)
    f = jax.jit(lambda x: tgj.spmm(T, x))
    np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x))), M @ x)
    np.testing.assert_array_equal(np.asarray(tgj.spmm(T, jnp.asarray(x[:, 0]))), M @ x[:, 0])
    y = ints(rng, n, D)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda y: tgj.spmm(T.T, y))(jnp.asarray(y))), M.T @ y)


def test_spmm_gradients_are_the_transposed_product():
    """The vjp is Tᵀ g: check_grads in reverse mode, exact on integers, and in x's dtype."""
    from jax.test_util import check_grads

    rng = np.random.default_rng(1)
    A, T = _matrix(rng, 40, 30)
    M = A.toarray()
    x = jnp.asarray(rng.standard_normal((30, 4)).astype(np.float32))
    with jax.default_matmul_precision("highest"):  # (float32 products: finite differences need them on a GPU)
        check_grads(lambda x: tgj.spmm(T, x), (x,), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)
    g = ints(rng, 40, 4)
    _, vjp = jax.vjp(lambda x: tgj.spmm(T, x), x)
    np.testing.assert_array_equal(np.asarray(vjp(jnp.asarray(g))[0]), M.T @ g)
    dx = jax.jit(jax.grad(lambda x: tgj.spmm(T, x).sum()))(jnp.ones((30, 4), jnp.float16))
    assert dx.dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(dx, np.float32), np.broadcast_to(M.sum(axis=0)[:, None], (30, 4)))


def test_dtypes_follow_spmm_and_vmap_folds_the_batch_into_one_product():
    rng = np.random.default_rng(2)
    A, T = _matrix(rng, 20, 20)
    M = A.toarray()
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.int32):
        assert tgj.spmm(T, jnp.ones((20, 3), dtype)).dtype == jnp.float32  # (as NumPy / JAX promote)
    xs = ints(rng, 3, 20, 4)
    f = jax.vmap(lambda x: tgj.spmm(T, x))
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(jnp.asarray(xs))), np.einsum("ij,bjd->bid", M, xs))
    assert str(jax.make_jaxpr(f)(jnp.asarray(xs))).count("ffi_call") == 1  # the batch folded into the width
    g = jax.vmap(jax.grad(lambda x: (tgj.spmm(T, x) ** 2).sum()))(jnp.asarray(xs))
    np.testing.assert_array_equal(np.asarray(g), 2 * np.einsum("ji,bjd->bid", M, np.einsum("ij,bjd->bid", M, xs)))


def test_bad_operands_fail_at_trace_time_with_spmm_wording():
    rng = np.random.default_rng(3)
    _, T = _matrix(rng, 20, 10)
    with pytest.raises(ValueError, match=r"matmul: dimension mismatch with signature \(n,k=10\),\(k=3,m\)"):
        jax.jit(lambda x: tgj.spmm(T, x))(jnp.ones((3, 2)))
    with pytest.raises(ValueError, match="must be 1-D or 2-D"):
        tgj.spmm(T, jnp.ones((10, 2, 2)))
    with pytest.raises(TypeError, match="float or integer"):
        tgj.spmm(T, jnp.ones((10, 2), bool))
    with pytest.raises(TypeError, match="must be a tcgnn_py.TiledMatrix"):
        tgj.spmm(sp.eye(10, format="csr"), jnp.ones((10, 2)))
    T64 = tg.TiledMatrix(sp.csr_array(np.eye(10)), device="cpu")
    if not jax.config.jax_enable_x64:
        with pytest.raises(TypeError, match="needs jax_enable_x64"):
            tgj.spmm(T64, jnp.ones((10, 2)))


def test_a_released_matrix_fails_its_compiled_program_with_a_clear_error():
    """The registry keeps a matrix alive for its programs until release; a program run after that raises an
    error naming the cause (an XLA error from the handler, never a crash)."""
    rng = np.random.default_rng(4)
    A, T = _matrix(rng, 12, 12)
    f = jax.jit(lambda x: tgj.spmm(T, x))
    x = jnp.ones((12, 2))
    f(x).block_until_ready()
    count = tgj.registered()
    tgj.release(T)
    assert tgj.registered() == count - 1
    with pytest.raises(Exception, match="was released"):
        f(x).block_until_ready()
    np.testing.assert_array_equal(np.asarray(tgj.spmm(T, x)), A.toarray() @ np.ones((12, 2)))  # traced anew


def test_a_device_copy_is_published_after_the_device_wait(monkeypatch):
    """A program's first call of a matrix on the GPU waits for the device once, after the copy is made and before
    the handler may use it (XLA's stream is not ordered after the streams the copy was made on); later calls
    find it without waiting."""
    from tcgnn_py.jax import _matrices

    rng = np.random.default_rng(9)
    _, T = _matrix(rng, 12, 12)
    key, events = _matrices.key_of(T), []

    class Copy:
        def __init__(self, T, **kw):
            events.append(("copy", kw["device"]))

    monkeypatch.setattr(_matrices, "TiledMatrix", Copy)
    monkeypatch.setattr(_matrices, "_synchronize", lambda: events.append(("wait", _matrices._MATRICES[key][2])))
    first = _matrices.device_matrix(key)
    assert isinstance(first, Copy) and events == [("copy", "cuda"), ("wait", None)]  # (not yet published)
    assert _matrices.device_matrix(key) is first and len(events) == 2
    tgj.release(T)


def test_gcn_conv_and_its_gradients_against_dense_jax():
    """A GCN layer (either order of its products) and its gradients in every operand: the same as the dense
    formula in jnp (exact on integers)."""
    rng = np.random.default_rng(5)
    A, T = _matrix(rng, 30, 30)
    M = jnp.asarray(A.toarray())
    for f_in, f_out in ((8, 3), (3, 8)):
        H, W, b = (jnp.asarray(ints(rng, *s)) for s in ((30, f_in), (f_in, f_out), (f_out,)))

        def dense(H, W, b):
            return M @ (H @ W) + b

        np.testing.assert_array_equal(np.asarray(jax.jit(lambda H, W, b: tgj.gcn_conv(T, H, W, b))(H, W, b)),
                                      np.asarray(dense(H, W, b)))
        g = jnp.asarray(ints(rng, 30, f_out))
        got = jax.vjp(lambda H, W, b: tgj.gcn_conv(T, H, W, b), H, W, b)[1](g)
        want = jax.vjp(dense, H, W, b)[1](g)
        for a, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(w))
    with pytest.raises(ValueError, match="do not multiply"):
        tgj.gcn_conv(T, jnp.ones((30, 4)), jnp.ones((5, 2)))


def _dense(T, values):
    rows, cols = tgj.entries(T)
    D = np.zeros(T.shape)
    D[rows, cols] = np.asarray(values)
    return D


@pytest.mark.parametrize("layout", ["tcgnn", "vector"])
def test_sddmm_and_spmm_with_values_are_the_products_and_differentiate(layout):
    """SDDMM in T's stored order (entries()) and the product with those values in place of T's: exact on integers
    through jit, gradients by check_grads and exact vjps (an SDDMM for the values, transposed products for the
    operands)."""
    from jax.test_util import check_grads

    rng = np.random.default_rng(7)
    A, T = _matrix(rng, 45, 33, layout=layout)
    rows, cols = tgj.entries(T)
    assert rows.dtype == np.int32 and rows.shape == (T.nnz,)
    np.testing.assert_array_equal(_dense(T, T.values), A.toarray())  # (the order of T's own values)
    a, b, x = (jnp.asarray(ints(rng, *s)) for s in ((45, 6), (33, 6), (33, 5)))
    e = jax.jit(lambda a, b: tgj.sddmm(T, a, b))(a, b)
    np.testing.assert_array_equal(np.asarray(e), (np.asarray(a)[rows] * np.asarray(b)[cols]).sum(axis=1))
    v = jnp.asarray(ints(rng, T.nnz))
    V = _dense(T, v)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda v, x: tgj.spmm(T, x, values=v))(v, x)), V @ x)
    g = ints(rng, 45, 5)
    dv, dx = jax.vjp(lambda v, x: tgj.spmm(T, x, values=v), v, x)[1](jnp.asarray(g))
    np.testing.assert_array_equal(np.asarray(dv), (g[rows] * np.asarray(x)[cols]).sum(axis=1))
    np.testing.assert_array_equal(np.asarray(dx), V.T @ g)
    ge = ints(rng, T.nnz)
    da, db = jax.vjp(lambda a, b: tgj.sddmm(T, a, b), a, b)[1](jnp.asarray(ge))
    G = _dense(T, ge)
    np.testing.assert_array_equal(np.asarray(da), G @ np.asarray(b))
    np.testing.assert_array_equal(np.asarray(db), G.T @ np.asarray(a))
    xf = jnp.asarray(rng.standard_normal((33, 3)).astype(np.float32))
    vf = jnp.asarray(rng.standard_normal(T.nnz).astype(np.float32))
    with jax.default_matmul_precision("highest"):
        check_grads(lambda v, x: tgj.spmm(T, x, values=v), (vf, xf), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)


def test_attention_as_matrix_operations_matches_dense_jax():
    """An AGNN-style layer written as matrix operations -- cosine scores by SDDMM, a softmax over each row's
    entries in jnp (segment ops over entries()), the aggregation by spmm with those values -- and its gradient
    are the dense formula's."""
    rng = np.random.default_rng(8)
    A, T = _matrix(rng, 40, 40)
    A = abs(A)
    T = tg.TiledMatrix(A, device="cpu")
    rows, _ = tgj.entries(T)
    w = jnp.asarray(np.asarray(T.values))
    mask = jnp.asarray(A.toarray() != 0)
    Wd = jnp.asarray(A.toarray())
    H = jnp.asarray(rng.standard_normal((40, 8)).astype(np.float32))

    def ours(H):
        Hn = H / jnp.linalg.norm(H, axis=1, keepdims=True)
        z = tgj.sddmm(T, Hn)
        top = jax.ops.segment_max(z, rows, 40)
        ex = w * jnp.exp(z - top[rows])
        P = ex / jax.ops.segment_sum(ex, rows, 40)[rows]
        return tgj.spmm(T, H, values=P)

    def dense(H):
        Hn = H / jnp.linalg.norm(H, axis=1, keepdims=True)
        z = jnp.where(mask, Hn @ Hn.T, -jnp.inf)
        ex = Wd * jnp.exp(z - z.max(axis=1, keepdims=True))
        return (ex / ex.sum(axis=1, keepdims=True)) @ H

    with jax.default_matmul_precision("highest"):
        np.testing.assert_allclose(np.asarray(jax.jit(ours)(H)), np.asarray(dense(H)), rtol=1e-5, atol=1e-5)
        gs = [jax.grad(lambda H: (f(H) ** 2).sum())(H) for f in (ours, dense)]
    np.testing.assert_allclose(np.asarray(gs[0]), np.asarray(gs[1]), rtol=1e-4, atol=1e-4)


def test_the_precision_is_the_librarys_or_jaxs_and_reaches_the_call():
    """precision=None follows jax.default_matmul_precision where the call is traced ("highest": float32 products,
    as XLA's GEMMs); the library's names and JAX's are taken; anything else fails at trace time, naming it."""
    rng = np.random.default_rng(11)
    _, T = _matrix(rng, 30, 20)
    x = jnp.ones((20, 3))

    def attrs(f):
        import re

        from tcgnn_py.jax import _ops

        codes = {int(c) for c in re.findall(r"op = (\d+) : i64", jax.jit(f).lower(x).as_text())}
        return sorted({_ops._CODES[c & 7] for c in codes})

    assert attrs(lambda x: tgj.spmm(T, x)) == [""]
    with jax.default_matmul_precision("highest"):
        assert attrs(lambda x: tgj.spmm(T, x)) == ["fp32"]
        assert attrs(lambda x: tgj.sddmm(T.T, x, jnp.ones((30, 3)))) == ["fp32"]
    assert attrs(lambda x: tgj.spmm(T, x, precision=jax.lax.Precision.HIGHEST)) == ["fp32"]
    assert attrs(lambda x: tgj.spmm(T, x, precision="tensorfloat32")) == ["tf32"]
    assert attrs(lambda x: jax.grad(lambda x: tgj.spmm(T, x, precision="fp32").sum())(x)) == ["fp32"]
    with pytest.raises(ValueError, match="spmm: precision must be None, one of .* got 'double'"):
        tgj.spmm(T, x, precision="double")
    with pytest.raises(ValueError, match="sddmm: precision must be"):
        tgj.sddmm(T, jnp.ones((30, 3)), x, precision=3)


def test_bad_values_and_sddmm_operands_fail_at_trace_time():
    rng = np.random.default_rng(9)
    _, T = _matrix(rng, 20, 10)
    with pytest.raises(ValueError, match=rf"values must have shape \({T.nnz},\)"):
        tgj.spmm(T, jnp.ones((10, 2)), values=jnp.ones(T.nnz + 1))
    with pytest.raises(TypeError, match="values must be a float array"):
        tgj.spmm(T, jnp.ones((10, 2)), values=jnp.ones(T.nnz, jnp.int32))
    with pytest.raises(ValueError, match=r"sddmm: dimension mismatch with signature \(n=20,k=10\),\(n=20,d=3\),"
                                         r"\(k=10,d=2\)->\(n,k\)"):
        tgj.sddmm(T, jnp.ones((20, 3)), jnp.ones((10, 2)))
    with pytest.raises(TypeError, match="Xb must be a float or integer array"):
        tgj.sddmm(T, jnp.ones((20, 2)), jnp.ones((10, 2), bool))


@pytest.mark.parametrize("heads, concat", [(1, True), (4, True), (4, False)])
def test_attention_layers_are_tcgnn_py_nn_layers(heads, concat):
    """gat_conv and agnn_conv in JAX (matrix operations over the library's products) give tcgnn_py.nn's outputs and
    gradients (its host path) on a real graph with self-loops."""
    from tcgnn_py import nn

    rng = np.random.default_rng(10)
    T = nn.add_self_loops(tg.load_cora().adj, device="cpu")
    n = T.shape[0]
    H = rng.standard_normal((n, 12)).astype(np.float32)
    W = (rng.standard_normal((12, 8 * heads)) / 4).astype(np.float32)
    a1, a2 = (rng.standard_normal((heads, 8)).astype(np.float32) for _ in range(2))
    b = rng.standard_normal(8 * heads if concat else 8).astype(np.float32)
    g = rng.standard_normal((n, 8 * heads if concat else 8)).astype(np.float32)
    with jax.default_matmul_precision("highest"):
        want, vjp = nn.gat_conv(T, H, W, a1, a2, b, heads=heads, concat=concat)
        got, jvjp = jax.vjp(lambda H, W, a1, a2, b: tgj.gat_conv(T, H, W, a1, a2, b, heads=heads, concat=concat),
                            *(jnp.asarray(v) for v in (H, W, a1, a2, b)))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
        for mine, theirs in zip(jvjp(jnp.asarray(g)), vjp(g)):
            np.testing.assert_allclose(np.asarray(mine), theirs, rtol=1e-3, atol=1e-4)
        if heads == 1:
            beta = np.array([0.7], np.float32)
            want, vjp = nn.agnn_conv(T, H, beta)
            got, jvjp = jax.vjp(lambda H, beta: tgj.agnn_conv(T, H, beta), jnp.asarray(H), jnp.asarray(beta))
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)
            g = rng.standard_normal((n, 12)).astype(np.float32)  # (AGNN keeps H's width)
            for mine, theirs in zip(jvjp(jnp.asarray(g)), vjp(g)):
                np.testing.assert_allclose(np.asarray(mine), theirs, rtol=1e-3, atol=1e-3)


def test_agnn_conv_has_finite_gradients_at_a_zero_row():
    """A row of zeros (after a ReLU, a node whose features all died) has no direction: its normalised row is zero
    in value, as tcgnn_py.nn's, and its gradients are finite -- the norm's root is not differentiated at zero."""
    from tcgnn_py import nn

    T = nn.add_self_loops(sp.csr_array(np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], np.float32)), device="cpu")
    H = np.array([[1, 2], [0, 0], [3, 1]], np.float32)
    out, vjp = jax.vjp(lambda H, beta: tgj.agnn_conv(T, H, beta), jnp.asarray(H), jnp.float32(0.5))
    want, _ = nn.agnn_conv(T, H, 0.5)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6)
    for grad in vjp(jnp.ones((3, 2), jnp.float32)):
        assert np.isfinite(np.asarray(grad)).all()


def test_attention_layers_check_their_operands():
    rng = np.random.default_rng(11)
    _, T = _matrix(rng, 10, 10)
    H, W = jnp.ones((10, 4)), jnp.ones((4, 6))
    with pytest.raises(ValueError, match="not 4 heads of equal width"):
        tgj.gat_conv(T, H, W, jnp.ones((4, 1)), jnp.ones((4, 1)), heads=4)
    with pytest.raises(ValueError, match=r"a_src must have shape \(2, 3\)"):
        tgj.gat_conv(T, H, W, jnp.ones((2, 2)), jnp.ones((2, 3)), heads=2)
    with pytest.raises(ValueError, match="attention dropout needs key"):
        tgj.gat_conv(T, H, W, jnp.ones((1, 6)), jnp.ones((1, 6)), dropout=0.5)
    with pytest.raises(ValueError, match="needs a square graph"):
        tgj.agnn_conv(_matrix(rng, 10, 7)[1], H, 1.0)


def test_importing_tcgnn_py_does_not_import_jax():
    code = "import sys, tcgnn_py; assert 'jax' not in sys.modules, 'jax imported'"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, TCGNN_PY_DEVICE="cpu"))
    assert res.returncode == 0, res.stderr


_RECORDED_STEP = """
import json, os, sys
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
import numpy as np, scipy.sparse as sp, jax, jax.numpy as jnp
import tcgnn_py as tg
from tcgnn_py import jax as tgj
rng = np.random.default_rng(3)
A = 0.1 * sp.random(500, 500, density=0.02, random_state=3, format="csr", dtype=np.float32)  # (norm about 1)
T = tg.TiledMatrix(A, device="cuda")
X = jnp.asarray(rng.standard_normal((500, 32), dtype=np.float32))
p = [jnp.asarray(0.1 * rng.standard_normal(s, dtype=np.float32)) for s in ((32, 64), (64, 8), (64, 16), (2, 8), (2, 8))]
p.append(jnp.float32(1.0))

def products(p):
    h = jax.nn.relu(tgj.spmm(T, X @ p[0]))
    return h, jnp.mean(tgj.spmm(T, h @ p[1]) ** 2)

def attention(p, key):
    h, value = products(p)
    z = tgj.agnn_conv(T, tgj.gat_conv(T, h, p[2], p[3], p[4], heads=2, dropout=0.2, key=key), p[5])
    return value + jnp.mean(z ** 2)

def trained(loss):
    @jax.jit
    def step(p, key):
        key, sub = jax.random.split(key)
        value, grads = jax.value_and_grad(loss)(p, sub)
        return [w - 0.01 * g for w, g in zip(p, grads)], value, key

    q, key, losses = list(p), jax.random.key(0), []
    for _ in range(40):  # (3 products a step: past the timed choice where XLA runs the calls itself)
        q, value, key = step(q, key)
        losses.append(value)
    return np.concatenate([np.asarray(w).ravel() for w in q] + [np.asarray(losses)])

np.savez(sys.argv[1], products=trained(lambda p, key: products(p)[1]), attention=trained(attention))
from tcgnn_py.jax import _ffi
print(json.dumps({"recorded": sorted({k[0] for k in _ffi._WARMED}), "held": tgj.recorded_nbytes()}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="XLA's command buffers are CUDA graphs: they need CuPy and a GPU")
def test_a_jitted_training_step_gives_the_same_bits_with_xlas_command_buffers_on_and_off(tmp_path):
    """Jitted training steps run 40 times by default (the targets recordable, XLA's command buffers on: XLA records
    the library's operations into CUDA graphs, each signature warmed up on a stream of its own first, and updates
    them in place as buffers change), with XLA's command buffers off, and with the targets not recordable
    (``TCGNN_PY_JAX_COMMAND_BUFFERS=0``), in fresh processes.  A step of products (of T and, in its
    gradient, of T.T, between XLA's GEMMs) gives the same bits; one with a GAT layer (attention dropout) and an
    AGNN layer too gives the same values within float32 rounding, as XLA's own fused operations around the
    attention are not bit-identical with command buffers on and off."""
    if jax.default_backend() != "gpu":
        pytest.skip("JAX has no GPU backend here")
    from tcgnn_py.jax._ffi import RECORDED_ENV

    runs = {}
    for mode, flags, recorded in (("on", "", None), ("off", "--xla_gpu_enable_command_buffer=", None),
                                  ("unrecorded", "", "0")):
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip())
        env.pop(RECORDED_ENV, None)
        if recorded is not None:
            env[RECORDED_ENV] = recorded
        res = subprocess.run([sys.executable, "-c", _RECORDED_STEP, str(tmp_path / mode)], capture_output=True,
                             text=True, env=env, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        saved = np.load(tmp_path / f"{mode}.npz")
        runs[mode] = (json.loads(res.stdout.strip().splitlines()[-1]), saved["products"], saved["attention"])
    from tcgnn_py.jax import ATTENTION_BWD_TARGET, ATTENTION_TARGET, SPMM_TARGET

    assert runs["on"][0]["recorded"] == sorted([SPMM_TARGET, ATTENTION_TARGET, ATTENTION_BWD_TARGET])
    assert runs["off"][0]["recorded"] == runs["unrecorded"][0]["recorded"] == []
    for on in runs["on"][1:]:
        losses = on[-40:]  # (the last 40 values saved)
        assert np.isfinite(on).all() and losses[-1] < losses[0]  # (it trains)
    np.testing.assert_array_equal(runs["on"][1], runs["off"][1])
    np.testing.assert_array_equal(runs["on"][1], runs["unrecorded"][1])
    np.testing.assert_allclose(runs["on"][2], runs["off"][2], rtol=1e-5, atol=1e-8)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="the GPU implementation needs CuPy and a GPU")
def test_jitted_spmm_on_the_gpu_is_the_product():
    """On JAX's GPU backend: the library's kernels on XLA's stream over XLA's buffers, exact on integers, with
    gradients; a matrix built on the host runs through its device copy."""
    if jax.default_backend() != "gpu":
        pytest.skip("JAX has no GPU backend here")
    rng = np.random.default_rng(6)
    for layout in ("tcgnn", "vector"):
        A, T = _matrix(rng, 300, 200, device="cuda", layout=layout)
        M = A.toarray().astype(np.float64)
        f = jax.jit(lambda x: tgj.spmm(T, x))
        for D in (1, 16, 64):
            x = ints(rng, 200, D)
            for _ in range(3):  # (planned, then bound)
                np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x))), M @ x)
        xf = rng.standard_normal((200, 16)).astype(np.float32)
        want = M @ xf.astype(np.float64)

        def err(y):
            return np.abs(np.asarray(y, np.float64) - want).max() / np.abs(want).max()

        assert err(tgj.spmm(T, jnp.asarray(xf), precision="fp32")) < 1e-6 < err(tgj.spmm(T, jnp.asarray(xf)))
        g = ints(rng, 300, 16)
        _, vjp = jax.vjp(lambda x: tgj.spmm(T, x), jnp.asarray(ints(rng, 200, 16)))
        np.testing.assert_array_equal(np.asarray(vjp(jnp.asarray(g))[0]), M.T @ g)
        h = jnp.asarray(ints(rng, 200, 16), jnp.float16)
        np.testing.assert_array_equal(np.asarray(tgj.spmm(T, h)), M @ np.asarray(h, np.float64))
        rows, cols = tgj.entries(T)
        a, b = jnp.asarray(ints(rng, 300, 8)), jnp.asarray(ints(rng, 200, 8))
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, b: tgj.sddmm(T, a, b))(a, b)),
                                      (np.asarray(a)[rows] * np.asarray(b)[cols]).sum(axis=1))
        v = jnp.asarray(ints(rng, T.nnz))
        V = np.zeros(T.shape)
        V[rows, cols] = np.asarray(v)
        np.testing.assert_array_equal(np.asarray(tgj.spmm(T, jnp.asarray(x), values=v)), V @ x)
    A, Th = _matrix(rng, 20, 20)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: tgj.spmm(Th, x))(jnp.ones((20, 2)))),
                                  A.toarray() @ np.ones((20, 2)))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="the GPU implementation needs CuPy and a GPU")
def test_a_settled_jitted_call_allocates_nothing_and_xla_copies_nothing():
    """The hot path of a jitted product and of a training step's gradient: XLA keeps no temporary for the product
    (its FFI call reads x and writes XLA's result buffer), and once settled, calls make no CuPy allocation, neither
    from CuPy's allocator nor in the pools of calls XLA recorded into command buffers."""
    from tcgnn_py.bench._jax_ops import _allocations  # (the harness's count: CuPy's allocator and XLA's recordings)

    if jax.default_backend() != "gpu":
        pytest.skip("JAX has no GPU backend here")
    rng = np.random.default_rng(9)
    A, T = _matrix(rng, 300, 300, device="cuda")
    x, w = jnp.asarray(ints(rng, 300, 64)), jnp.asarray(ints(rng, 64, 16))
    product = jax.jit(lambda x: tgj.spmm(T, x))
    step = jax.jit(jax.grad(lambda w, x: (tgj.gcn_conv(T, x, w) ** 2).sum()))
    assert product.lower(x).compile().memory_analysis().temp_size_in_bytes == 0

    def calls():
        product(x).block_until_ready()
        step(w, x).block_until_ready()

    import cupy as cp

    assert _allocations(lambda: cp.empty(8), 1) == (1, 0)  # (the count sees an allocation)
    _allocations(calls, 5)  # (planned, bound, recorded)
    assert _allocations(calls, 10) == (0, 0)
    np.testing.assert_array_equal(np.asarray(product(x)), A.toarray() @ np.asarray(x))


def test_the_gpu_targets_are_recordable_where_the_environment_asks(monkeypatch):
    """register_target declares the command-buffer trait on the GPU platform only, and by default unless
    TCGNN_PY_JAX_COMMAND_BUFFERS=0; the host target never."""
    from tcgnn_py.jax import _ffi

    seen = []
    monkeypatch.setattr(_ffi, "register", lambda name, platform, run, traits=0: seen.append((name, platform, traits)))
    for n, (env, recorded) in enumerate([("0", None), ("1", None), ("0", True), ("1", False), (None, None)]):
        if env is None:
            monkeypatch.delenv(_ffi.RECORDED_ENV, raising=False)
        else:
            monkeypatch.setenv(_ffi.RECORDED_ENV, env)
        _ffi.register_target(f"tcgnn_py_test_traits_{n}", {"cpu": None, "CUDA": None}, recorded=recorded)
    bit = _ffi.COMMAND_BUFFER_COMPATIBLE
    assert [(p, t) for _, p, t in seen] == [("cpu", 0), ("CUDA", 0), ("cpu", 0), ("CUDA", bit), ("cpu", 0),
                                            ("CUDA", bit), ("cpu", 0), ("CUDA", 0), ("cpu", 0), ("CUDA", bit)]


def test_the_handler_answers_the_metadata_query_and_turns_exceptions_into_xla_errors():
    """The ctypes handler on hand-built call frames: it finds the metadata extension behind another one and
    writes the API version and traits; on execution it decodes buffers and attributes, and an exception comes back
    as an error made by the API's Error_Create (its code and message), never raised into XLA."""
    import ctypes

    from tcgnn_py.jax import _ffi

    seen = []

    def run(stream, args, rets, value):
        seen.append((stream, args, value))
        if value < 0:
            raise ValueError("negative key")
        _ffi.host_view(rets[0])[...] = _ffi.host_view(args[0]) * 2

    _ffi.register("tcgnn_py_test_handler", "cpu", run, traits=1)
    handler = _ffi._HANDLERS[("tcgnn_py_test_handler", "cpu")]

    meta = _ffi._Metadata(ctypes.sizeof(_ffi._Metadata), _ffi._Version(), 0xFF)
    meta_ext = _ffi._MetadataExtension(_ffi._Extension(ctypes.sizeof(_ffi._MetadataExtension), _ffi._METADATA),
                                       ctypes.pointer(meta))
    other = _ffi._Extension(ctypes.sizeof(_ffi._Extension), 999,
                            ctypes.cast(ctypes.pointer(meta_ext), ctypes.POINTER(_ffi._Extension)))
    frame = _ffi._CallFrame(ctypes.sizeof(_ffi._CallFrame), ctypes.pointer(other))
    assert handler(ctypes.pointer(frame)) is None
    assert (meta.api_version.major_version, meta.api_version.minor_version, meta.traits) == (*_ffi.API_VERSION, 1)
    assert seen == []

    errors = []

    def error_create(args_ptr):
        args = args_ptr.contents
        errors.append((args.errc, args.message.decode()))
        return 4242

    api = _ffi._Api(error_create=_ffi._ErrorCreate(error_create))
    x, y = np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((2, 3), np.float32)
    dims = [(ctypes.c_int64 * 2)(*a.shape) for a in (x, y)]
    bufs = [_ffi._Buffer(ctypes.sizeof(_ffi._Buffer), None, 11, a.ctypes.data, 2, d) for a, d in zip((x, y), dims)]
    lists = [_ffi._List(ctypes.sizeof(_ffi._List), None, 1, (ctypes.c_int * 1)(1),
                        (ctypes.c_void_p * 1)(ctypes.addressof(b))) for b in bufs]

    def attrs(key, kind=_ffi._SCALAR, dtype=5):
        value = ctypes.c_int64(key)
        scalar = _ffi._Scalar(dtype, ctypes.addressof(value))
        name = b"op"
        span = _ffi._ByteSpan(ctypes.cast(ctypes.c_char_p(name), ctypes.c_void_p), len(name))
        keep = (value, scalar, name, span)
        return keep, _ffi._Attrs(ctypes.sizeof(_ffi._Attrs), None, 1, (ctypes.c_int * 1)(kind),
                                 (ctypes.POINTER(_ffi._ByteSpan) * 1)(ctypes.pointer(span)),
                                 (ctypes.c_void_p * 1)(ctypes.addressof(scalar)))

    for (key, kind, dtype), want in (((7, _ffi._SCALAR, 5), None), ((-1, _ffi._SCALAR, 5), 4242),
                                     ((7, _ffi._SCALAR, 4), 4242), ((7, 4, 5), 4242)):
        keep, a = attrs(key, kind, dtype)
        frame = _ffi._CallFrame(ctypes.sizeof(_ffi._CallFrame), None, ctypes.pointer(api), None, 3, lists[0],
                                lists[1], a)
        assert handler(ctypes.pointer(frame)) == want
    assert seen == [(0, ((x.ctypes.data, 11, (2, 3)),), 7), (0, ((x.ctypes.data, 11, (2, 3)),), -1)]
    np.testing.assert_array_equal(y, 2 * x)
    assert errors == [(3, "ValueError: negative key"),
                      (3, "TypeError: a call of this FFI target carries one int64 attribute, got XLA data type 4"),
                      (3, "TypeError: a call of this FFI target carries one int64 attribute, got 1 attribute(s), "
                          "the first of XLA attribute type 4")]


@pytest.mark.parametrize("score", ["additive", "cosine"])
def test_graph_attention_is_the_librarys_through_jit_with_its_vjp(score):
    """tgj.graph_attention (the fused operation's FFI targets; the host's implementation is nn.graph_attention)
    against nn.graph_attention: outputs and every gradient, dropout drawn from the same seed; and the matrix
    operations it falls back on where the fused kernels do not reach give the same attention."""
    from tcgnn_py import nn
    from tcgnn_py.jax import _attention

    rng = np.random.default_rng(12)
    T = nn.add_self_loops(tg.load_cora().adj, device="cpu")
    n = T.shape[0]
    heads = 2 if score == "additive" else 1
    V = rng.standard_normal((n, 4 * heads)).astype(np.float32)
    if score == "additive":
        ops = dict(s_src=rng.standard_normal((n, heads)).astype(np.float32),
                   s_dst=rng.standard_normal((n, heads)).astype(np.float32))
    else:
        Qn = V / np.linalg.norm(V, axis=1, keepdims=True)
        ops = dict(Q=Qn, K=Qn, beta=np.array([0.7], np.float32))
    g = rng.standard_normal((n, 4 * heads)).astype(np.float32)
    key = jax.random.PRNGKey(3)
    for dropout in (0.0, 0.5):
        seed = np.asarray(jax.random.bits(key, (1,), jnp.uint32)) if dropout else None
        want, vjp = nn.graph_attention(T, V, heads=heads, score=score, dropout=dropout, seed=seed, **ops)

        def f(V, ops):
            return tgj.graph_attention(T, V, heads=heads, score=score, dropout=dropout, key=key, **ops)

        jops = {k: jnp.asarray(v) for k, v in ops.items()}
        got, jvjp = jax.vjp(jax.jit(f), jnp.asarray(V), jops)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
        dV, dops = jvjp(jnp.asarray(g))
        theirs = vjp(g)
        names = ("s_src", "s_dst") if score == "additive" else ("Q", "K", "beta")
        np.testing.assert_allclose(np.asarray(dV), theirs[0], rtol=1e-4, atol=1e-5)
        for name, t in zip(names, theirs[1:]):
            np.testing.assert_allclose(np.asarray(dops[name]).reshape(np.shape(t)), t, rtol=1e-4, atol=1e-5)
    ops_t = tuple(jnp.asarray(ops[k]) for k in (("s_src", "s_dst") if score == "additive" else ("Q", "K", "beta")))
    with jax.default_matmul_precision("highest"):
        unfused = _attention._unfused(T, jnp.asarray(V), heads, score, ops_t, 0.2, 0.0, None)
    want, _ = nn.graph_attention(T, V, heads=heads, score=score, **ops)
    np.testing.assert_allclose(np.asarray(unfused), want, rtol=1e-5, atol=1e-6)


def test_graph_attention_names_bad_arguments():
    rng = np.random.default_rng(13)
    A, _ = _matrix(rng, 12, 12)
    T = tg.TiledMatrix(abs(A), device="cpu")
    V, s = jnp.ones((12, 4)), jnp.zeros((12, 2))
    with pytest.raises(ValueError, match="score must be one of"):
        tgj.graph_attention(T, V, heads=2, score="dot", s_src=s, s_dst=s)
    with pytest.raises(ValueError, match="heads must be a positive int"):
        tgj.graph_attention(T, V, heads=0, s_src=s, s_dst=s)
    with pytest.raises(ValueError, match=r"V must have shape \(12, heads \* D\) with heads=3"):
        tgj.graph_attention(T, V, heads=3, s_src=s, s_dst=s)
    with pytest.raises(ValueError, match=r"s_dst must have shape \(12, 2\)"):
        tgj.graph_attention(T, V, heads=2, s_src=s, s_dst=jnp.zeros((12, 1)))
    with pytest.raises(TypeError, match="score='additive' takes s_src and s_dst"):
        tgj.graph_attention(T, V, heads=2, s_src=s)
    with pytest.raises(TypeError, match="score='cosine' takes Q, K and beta"):
        tgj.graph_attention(T, V, score="cosine", Q=V, K=V)
    with pytest.raises(ValueError, match="score='cosine' has one head"):
        tgj.graph_attention(T, V, heads=2, score="cosine", Q=V, K=V, beta=1.0)
    with pytest.raises(ValueError, match="attention dropout needs key"):
        tgj.graph_attention(T, V, heads=2, s_src=s, s_dst=s, dropout=0.5)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        tgj.graph_attention(T, V, heads=2, s_src=s, s_dst=s, dropout=1.0, key=jax.random.PRNGKey(0))
    negative = tg.TiledMatrix(sp.csr_array(-np.eye(12, dtype=np.float32)), device="cpu")
    with pytest.raises(ValueError, match="T holds negative values"):
        tgj.graph_attention(negative, V, heads=2, s_src=s, s_dst=s)


@pytest.mark.parametrize("score, dtype", [("additive", np.float32), ("additive", np.float16),
                                          ("cosine", np.float32), ("cosine", np.float16)])
def test_graph_attention_on_the_gpu_is_the_fused_librarys(score, dtype):
    """On JAX's GPU backend: the fused kernels' forward and backward on XLA's stream, writing XLA's buffers (a
    16-bit backward's float32 gradients cast into them), against nn.graph_attention on the same device (the same
    kernels), dropout from the same seed."""
    if jax.default_backend() != "gpu":
        pytest.skip("JAX has no GPU backend here")
    import cupy as cp

    from tcgnn_py import nn

    rng = np.random.default_rng(14)
    T = nn.add_self_loops(tg.load_cora().adj, device="cuda")
    n = T.shape[0]
    heads = 4 if score == "additive" else 1
    V = rng.standard_normal((n, 16)).astype(dtype)
    if score == "additive":
        ops = dict(s_src=rng.standard_normal((n, heads)).astype(np.float32),
                   s_dst=rng.standard_normal((n, heads)).astype(np.float32))
    else:
        ops = dict(Q=rng.standard_normal((n, 16)).astype(dtype), K=rng.standard_normal((n, 16)).astype(dtype),
                   beta=np.asarray([1.5], np.float32))
    g = rng.standard_normal((n, 16)).astype(dtype)
    key = jax.random.PRNGKey(5)
    seed = np.asarray(jax.random.bits(key, (1,), jnp.uint32))
    want, vjp = nn.graph_attention(T, cp.asarray(V), heads=heads, score=score, dropout=0.3, seed=cp.asarray(seed),
                                   **{k: cp.asarray(v) for k, v in ops.items()})
    f = jax.jit(lambda V, ops: tgj.graph_attention(T, V, heads=heads, score=score, dropout=0.3, key=key, **ops))
    got, jvjp = jax.vjp(f, jnp.asarray(V), {k: jnp.asarray(v) for k, v in ops.items()})
    assert got.dtype == dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), want.get().astype(np.float32), rtol=1e-5, atol=1e-6)
    dV, dops = jvjp(jnp.asarray(g))
    theirs = vjp(cp.asarray(g))
    assert dV.dtype == dtype
    np.testing.assert_allclose(np.asarray(dV, np.float32), theirs[0].get().astype(np.float32), rtol=1e-4,
                               atol=1e-5)
    for name, mine in zip(ops, theirs[1:]):  # (each of its operand's dtype: 16-bit Q and K, float32 nn's)
        np.testing.assert_allclose(np.asarray(dops[name], np.float32).ravel(),
                                   mine.get().astype(dops[name].dtype).astype(np.float32).ravel(), rtol=1e-4,
                                   atol=1e-5, err_msg=name)


def test_graph_attention_passes_check_grads_and_vmaps():
    """The fused operation's custom vjp against finite differences (float32 products: highest precision), and
    jax.vmap over a batch of values (one call per element, the attention the same)."""
    from jax.test_util import check_grads

    rng = np.random.default_rng(15)
    A, T = _matrix(rng, 30, 30)
    T = tg.TiledMatrix(abs(A), device="cpu")
    V = jnp.asarray(rng.standard_normal((30, 6)).astype(np.float32))
    s_src, s_dst = (jnp.asarray(rng.standard_normal((30, 2)).astype(np.float32)) for _ in range(2))

    def f(V, a, b):
        return tgj.graph_attention(T, V, heads=2, s_src=a, s_dst=b)

    with jax.default_matmul_precision("highest"):
        check_grads(f, (V, s_src, s_dst), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)
    Vs = jnp.stack([V, 2 * V, -V])
    got = jax.vmap(lambda V: f(V, s_src, s_dst))(Vs)
    for i in range(3):
        np.testing.assert_allclose(np.asarray(got[i]), np.asarray(f(Vs[i], s_src, s_dst)), rtol=1e-6, atol=1e-6)


def test_a_bound_call_is_kept_as_its_fixed_replay_or_its_bound_launch_on_xlas_stream(monkeypatch):
    """_keep_bound (the GPU handler's, with the GPU's pieces standing in): nothing until the plan has bound (to a
    launch past its timed choice); the plan's fixed replay of these operands where it gives one; else its bound
    launch, run inside XLA's stream."""
    import contextlib

    from tcgnn_py._cache import Store
    from tcgnn_py.jax import _ops

    entered = []
    monkeypatch.setattr(_ops, "_device", lambda: 0)
    monkeypatch.setattr(_ops, "xla_stream", lambda ptr: contextlib.nullcontext(entered.append(ptr)))

    class Plan:
        def __init__(self, bound):
            self.bound = bound

    ran = []

    def bound(*operands):
        ran.append(operands)

    store = Store(8)
    _ops._keep_bound(store, "k0", 5, "sig", ("X", "Y"))  # no plan yet
    store["sig"] = Plan(None)
    _ops._keep_bound(store, "k0", 5, "sig", ("X", "Y"))  # a plan not bound yet
    assert "k0" not in store

    def counting(*operands):
        raise AssertionError("not kept")

    counting.countdown = object()
    counting.fixed = lambda *operands: (lambda: None)
    store["sig"] = Plan(counting)
    _ops._keep_bound(store, "k0", 5, "sig", ("X", "Y"))  # bound to the statistics' launch before the timed choice
    assert "k0" not in store
    store["sig"] = Plan(bound)
    _ops._keep_bound(store, "k1", 5, "sig", ("X", "Y"))
    store["k1"]()
    assert ran == [("X", "Y")] and entered == [5]
    bound.fixed = lambda *operands: (lambda: ran.append(("replay",) + operands))
    _ops._keep_bound(store, "k2", 5, "sig", ("X", "Y"))
    store["k2"]()
    assert ran[-1] == ("replay", "X", "Y") and entered == [5]  # (a replay holds its stream: no switch)
    bound.fixed = lambda *operands: None  # (an out that overlaps X: no replay)
    _ops._keep_bound(store, "k3", 5, "sig", ("X", "Y"))
    store["k3"]()
    assert ran[-1] == ("X", "Y") and entered == [5, 5]


def test_the_attention_backwards_working_array_is_an_xla_buffer():
    """The fused backward's target declares its working array (two float32 factors per entry and head) as one
    of its results, so XLA allocates it with the program's temporaries: the handler allocates no array of that
    size beside XLA's (in a recorded call it would stay in the call's pool)."""
    from tcgnn_py import nn

    rng = np.random.default_rng(21)
    T = nn.add_self_loops(tg.load_cora().adj, device="cpu")
    n, heads = T.shape[0], 2
    V, s = jnp.asarray(ints(rng, n, 4 * heads)), jnp.asarray(ints(rng, n, heads))

    def loss(V):
        return tgj.graph_attention(T, V, heads=heads, s_src=s, s_dst=s).sum()

    text = jax.jit(jax.grad(loss)).lower(V).as_text()
    calls = [line for line in text.splitlines() if "tcgnn_py_attention_bwd" in line]
    assert calls and all(f"tensor<{T.nnz * heads}x2xf32>" in line for line in calls), calls


def _nn_keep(i, seed, p):
    """The kernels' ``nn_keep`` of index ``i`` and a two-word seed, in Python integers (the mask's definition)."""
    mix = ((int(seed[0]) ^ int(seed[1])) * 0x9E3779B9) & 0xFFFFFFFF
    x = (i ^ ((i >> 32) * 0x27D4EB2F & 0xFFFFFFFF) ^ mix) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    x ^= x >> 16
    return np.float32(x >> 8) * np.float32(2.0 ** -24) >= np.float32(p)


def test_dropout_is_the_kernels_mask_of_a_seed_from_the_key():
    """tgj.dropout keeps element i where the kernels' hash of (i, seed) passes the rate, the seed two words from
    the key; kept values scaled by 1 / (1 - p) (16-bit values in float32), the same mask on the gradient."""
    key = jax.random.key(3)
    seed = np.asarray(jax.random.bits(key, (2,), jnp.uint32))
    x = jnp.asarray(ints(np.random.default_rng(0), 40, 30))
    y = np.asarray(jax.jit(lambda x: tgj.dropout(x, 0.25, key))(x))
    keep = np.array([_nn_keep(i, seed, 0.25) for i in range(x.size)]).reshape(x.shape)
    np.testing.assert_array_equal(y, np.where(keep, np.asarray(x) * np.float32(1 / 0.75), 0))
    assert 0.65 < keep.mean() < 0.85
    g = jnp.asarray(ints(np.random.default_rng(1), 40, 30))
    dx = jax.vjp(lambda x: tgj.dropout(x, 0.25, key), x)[1](g)[0]
    np.testing.assert_array_equal(np.asarray(dx), np.where(keep, np.asarray(g) * np.float32(1 / 0.75), 0))
    h = tgj.dropout(x.astype(jnp.float16), 0.5, key)
    assert h.dtype == jnp.float16 and set(np.unique(np.asarray(h) / np.where(x == 0, 1, x))) <= {0.0, 2.0}
    assert tgj.dropout(x, 0.0, None) is x
    with pytest.raises(ValueError, match=r"dropout: rate must be a float in \[0, 1\)"):
        tgj.dropout(x, 1.0, key)
    with pytest.raises(ValueError, match="dropout needs key"):
        tgj.dropout(x, 0.5, None)


def test_linear_is_the_dropped_input_times_the_weight_with_its_gradients():
    """tgj.linear: dropout(H) @ W + b by tgj.dropout's mask for the same key, exact on integers, and its vjp in H, W
    and b (as jnp's of that formula); the operands checked by name."""
    rng = np.random.default_rng(2)
    key = jax.random.key(4)
    H, W, b = (jnp.asarray(ints(rng, *s)) for s in ((50, 200), (200, 8), (8,)))
    g = jnp.asarray(ints(rng, 50, 8))

    def formula(H, W, b):
        return jnp.matmul(tgj.dropout(H, 0.5, key), W, precision="highest") + b

    f = jax.jit(lambda H, W, b: tgj.linear(H, W, b, dropout=0.5, key=key, precision="highest"))
    np.testing.assert_array_equal(np.asarray(f(H, W, b)), np.asarray(formula(H, W, b)))
    got = jax.vjp(lambda *a: tgj.linear(*a, dropout=0.5, key=key, precision="highest"), H, W, b)[1](g)
    for a, w in zip(got, jax.vjp(formula, H, W, b)[1](g)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(w))
    np.testing.assert_array_equal(np.asarray(tgj.linear(H, W, precision="highest")),
                                  np.asarray(jnp.matmul(H, W, precision="highest")))
    with pytest.raises(ValueError, match=r"linear: H \(n, k\) and W \(k, m\) must be 2-D and agree"):
        tgj.linear(H, W.T)
    with pytest.raises(ValueError, match=r"linear: b must have shape \(8,\)"):
        tgj.linear(H, W, b[:3])
    with pytest.raises(ValueError, match=r"linear: dropout: rate must be a float in \[0, 1\)"):
        tgj.linear(H, W, dropout=-0.1, key=key)


def test_gcn_conv_drops_its_input_as_linear():
    """tgj.gcn_conv(dropout=, key=): the layer of tgj.dropout(H) (either order of its products)."""
    rng = np.random.default_rng(8)
    A, T = _matrix(rng, 30, 30)
    key = jax.random.key(1)
    for f_in, f_out in ((8, 3), (3, 8)):
        H, W = jnp.asarray(ints(rng, 30, f_in)), jnp.asarray(ints(rng, f_in, f_out))
        with jax.default_matmul_precision("highest"):
            got = tgj.gcn_conv(T, H, W, dropout=0.5, key=key)
            want = tgj.gcn_conv(T, tgj.dropout(H, 0.5, key), W)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="the dropped product's kernels need CuPy and a GPU")
def test_linear_on_the_gpu_reads_its_input_dropped_in_the_librarys_kernel():
    """On JAX's GPU backend a wide float32 input runs the library's dropped product (FFI) and its weight
    gradient: exact on integers against tgj.dropout's formula; the mask is the library's dropout kernel's for the
    same seed words; the input's gradient by the same mask."""
    if jax.default_backend() != "gpu":
        pytest.skip("JAX has no GPU backend here")
    import cupy as cp

    from tcgnn_py.products import dense, pointwise

    rng = np.random.default_rng(9)
    key = jax.random.key(6)
    seed = jax.random.bits(key, (2,), jnp.uint32)
    ones = cp.ones((301, 200), np.float32)
    theirs = pointwise.tail(ones, None, None, 0.5, cp.asarray(np.asarray(seed)))
    np.testing.assert_array_equal(np.asarray(tgj.dropout(jnp.ones((301, 200)), 0.5, key)), theirs.get())
    # (the kernel's reach: k > dense.DENSE_MAX_K, m <= dense.DROP_MAX_N; the last case is XLA's GEMM)
    for n, k, m in ((301, 200, 16), (1000, 4714, 32), (7, 129, 3), (50, 300, 64)):
        H, W = jnp.asarray(ints(rng, n, k)), jnp.asarray(ints(rng, k, m))
        g = jnp.asarray(ints(rng, n, m))
        f = jax.jit(lambda H, W: tgj.linear(H, W, dropout=0.5, key=key))
        assert ("tcgnn_py_drop_mm" in f.lower(H, W).as_text()) == (m <= dense.DROP_MAX_N)
        Hd = np.asarray(tgj.dropout(H, 0.5, key), np.float64)
        for _ in range(2):  # (planned, then bound)
            np.testing.assert_array_equal(np.asarray(f(H, W)), Hd @ np.asarray(W, np.float64))
        dH, dW = jax.jit(lambda H, W, g: jax.vjp(f, H, W)[1](g))(H, W, g)
        np.testing.assert_array_equal(np.asarray(dW), Hd.T @ np.asarray(g, np.float64))
        mask = np.asarray(tgj.dropout(jnp.ones((n, k)), 0.5, key), np.float64)
        np.testing.assert_array_equal(np.asarray(dH), mask * (np.asarray(g, np.float64) @ np.asarray(W, np.float64).T))


def test_a_product_of_a_width_off_the_16_byte_vector_runs_on_padded_columns():
    """tgj.spmm pads x's columns with zeros to whole 16-byte vectors (4 floats, 8 16-bit values) for the FFI call,
    where the vector kernels gather rows, and cuts the result back: exact, in the forward, its vjp and vmap."""
    rng = np.random.default_rng(12)
    A, T = _matrix(rng, 40, 30)
    M = A.toarray().astype(np.float64)
    for D, dtype, padded in ((5, jnp.float32, 8), (4, jnp.float32, 4), (3, jnp.float16, 8), (39, jnp.float32, 40)):
        x = jnp.asarray(ints(rng, 30, D), dtype)
        f = jax.jit(lambda x: tgj.spmm(T, x))
        text = f.lower(x).as_text()
        assert f"tensor<40x{padded}x" in text and ("stablehlo.pad" in text) == (padded != D), (D, padded)
        y = f(x)
        np.testing.assert_array_equal(np.asarray(y, np.float64), M @ np.asarray(x, np.float64))
        g = jnp.asarray(ints(rng, 40, D), y.dtype)  # (16-bit x by a float32 matrix: a float32 result)
        (dx,) = jax.vjp(f, x)[1](g)
        assert dx.shape == x.shape
        np.testing.assert_array_equal(np.asarray(dx, np.float64), M.T @ np.asarray(g, np.float64))
    xb = jnp.asarray(ints(rng, 3, 30, 3))  # (vmap folds the batch: 9 columns, padded to 12)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(lambda x: tgj.spmm(T, x)))(xb)),
                                  np.einsum("ij,bjd->bid", M, np.asarray(xb, np.float64)))
