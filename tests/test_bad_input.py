"""Hostile and unusual input: no silent wrong answer, and every error names the argument and what it expects.

Each test here failed before its fix (a wrong result, or an error that said something else).  They run on
the reference path without a GPU and on the device path with one.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from _env import GPU

import tcgnn_py as tg
from tcgnn_py import distributed as dist

EXAMPLES = os.path.join(os.path.dirname(__file__), os.pardir, "examples")


def host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)


# --- silent wrong answers -------------------------------------------------------------------------------------


def test_spmm_out_with_sparse_operand_is_refused():
    A = sp.csr_array(np.array([[1, 0, 2], [0, 3, 0]], np.float32))
    out = np.full((2, 2), -7, np.float32)
    with pytest.raises(TypeError, match="out= needs a dense operand"):
        tg.spmm(tg.TiledMatrix(A), sp.csr_array(np.ones((3, 2), np.float32)), out=out)
    # Without out= a sparse operand still gives scipy's sparse product.
    P = tg.spmm(tg.TiledMatrix(A), sp.csr_array(np.ones((3, 2), np.float32)))
    assert sp.issparse(P) and P.toarray().tolist() == [[3, 3], [3, 3]]


@pytest.mark.parametrize("dtype", [np.int8, np.bool_, np.uint8])
@pytest.mark.parametrize("how", ["permutation", "locality", "2:4"])
def test_reorder_identity_with_narrow_duplicates(dtype, how):
    """Duplicates are summed after the cast to the value dtype, also through ``Permutation.apply``."""
    v = 100 if dtype is not np.bool_ else True
    A = sp.coo_array((np.array([v, v], dtype), ([0, 0], [1, 1])), shape=(2, 2))
    X = np.ones((2, 1), np.float32)
    want = host(tg.TiledMatrix(A) @ X).ravel().tolist()
    assert want == ([200.0, 0.0] if dtype is not np.bool_ else [2.0, 0.0])
    p = tg.Permutation([1, 0]) if how == "permutation" else tg.reorder(A, how)
    B = p.apply(A)
    assert B.format == "coo" and B.dtype == A.dtype and B.nnz == 2  # every stored entry kept, renumbered
    got = p.undo_rows(host(tg.TiledMatrix(B) @ p.apply_rows(X)))
    assert got.ravel().tolist() == want


@pytest.mark.parametrize("fmt", ["coo", "csc", "csr"])
def test_duplicates_summed_after_cast_in_every_format(fmt):
    data, rows, cols = np.array([100, 100, 5], np.int8), np.array([0, 0, 1]), np.array([1, 1, 0])
    if fmt == "coo":
        A = sp.coo_array((data, (rows, cols)), shape=(2, 2))
    elif fmt == "csc":  # column 0: row 1; column 1: row 0 twice (scipy's own conversions would sum in int8)
        A = sp.csc_array((data[[2, 0, 1]], rows[[2, 0, 1]], np.array([0, 1, 3])), shape=(2, 2))
    else:
        A = sp.csr_array((data, cols, np.array([0, 2, 3])), shape=(2, 2))
    assert A.nnz == 3
    T = tg.TiledMatrix(A)
    assert T.toarray().tolist() == [[0.0, 200.0], [5.0, 0.0]] and T.nnz == 2


def test_locality_report_counts_positions_not_duplicates():
    # Row 0 stores column 1 twice, row 2 stores column 0 twice (CSR keeps duplicates as given).
    A = sp.csr_array((np.ones(5, np.float32), np.array([1, 1, 2, 0, 0]), np.array([0, 2, 3, 5])), shape=(3, 3))
    r = tg.locality_report(A)
    for layout in ("tcgnn", "vector"):
        st = tg.TiledMatrix(A, layout=layout).tile_stats()
        assert r[layout].nnz == st.nnz == 3
        assert r[layout].pairs == 3 and r[layout].pairs_per_nnz == 1.0
    q = tg.reorder(A, "locality")
    assert q.report.nnz == 3 and q.report["vector"].pairs_per_nnz == 1.0


def test_nm_reorder_counts_positions_not_duplicates():
    A = sp.csr_array((np.ones(5, np.float32), np.array([1, 1, 2, 0, 0]), np.array([0, 2, 3, 5])), shape=(3, 3))
    C = A.copy()
    C.sum_duplicates()
    assert tg.nm_report(A, "1:2") == tg.nm_report(C, "1:2")
    assert tg.reorder(A, "1:2").perm.tolist() == tg.reorder(C, "1:2").perm.tolist()


def test_with_values_keeps_the_value_dtype():
    T = tg.TiledMatrix(sp.csr_array(np.eye(3, dtype=np.float32)))
    assert T.with_values(np.ones(T.nnz)).dtype == np.float32  # float64 values into a float32 matrix
    assert T.with_values(np.ones(T.nnz, np.int64)).dtype == np.float32
    assert T.with_values(np.ones(T.nnz), dtype=np.float64).dtype == np.float64  # asked for
    assert tg.TiledMatrix(sp.csr_array(np.eye(3))).with_values(np.ones(3, np.float32)).dtype == np.float64


@pytest.mark.parametrize("order", ["csr", "tiled"])
def test_with_values_copies_the_callers_array_in_both_orders(order):
    T = tg.TiledMatrix(sp.csr_array(np.eye(3, dtype=np.float32)))
    v = np.arange(1, 4, dtype=np.float32)
    if GPU:
        import cupy as cp

        v = cp.asarray(v)
    V = T.with_values(v, order=order)
    v[:] = -1
    assert sorted(host(V.values).tolist()) == [1.0, 2.0, 3.0]


BIG = 2**53 + 1


def test_int64_beyond_float64_is_refused():
    T = tg.TiledMatrix(sp.csr_array(np.eye(3, dtype=np.float32)))
    with pytest.raises(ValueError, match=r"A holds the int64 value 9007199254740993.*2\*\*53"):
        tg.TiledMatrix(sp.csr_array(np.array([[BIG]], np.int64)))
    with pytest.raises(ValueError, match="X holds the int64 value"):
        T @ np.full((3, 1), BIG, np.int64)
    with pytest.raises(ValueError, match="X holds the int64 value -9007199254740993"):
        T @ np.full((3, 1), -BIG, np.int64)
    with pytest.raises(ValueError, match="values holds the uint64 value"):
        T.with_values(np.full(3, BIG, np.uint64))
    # At the limit, and with a dtype the caller chose, nothing is refused.
    assert tg.TiledMatrix(sp.csr_array(np.array([[2**53]], np.int64))).toarray().item() == 2.0**53
    assert host(T @ np.full((3, 1), 2**53, np.int64)).ravel().tolist() == [2.0**53] * 3
    assert tg.TiledMatrix(sp.csr_array(np.array([[BIG]], np.int64)), dtype=np.float64).dtype == np.float64


# --- errors that name the argument ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [5, (2.0, 3.0), "ab", (1, 2, 3)])
def test_shape_must_be_a_pair_of_ints(shape):
    parts = (np.ones(1, np.float32), np.zeros(1, np.int32), np.array([0, 1], np.int32))
    with pytest.raises(TypeError, match=r"shape must be a pair of ints \(n_rows, n_cols\)"):
        tg.TiledMatrix(parts, shape)


def test_operands_of_more_than_two_dimensions():
    T = tg.TiledMatrix(sp.csr_array(np.eye(3, dtype=np.float32)))
    with pytest.raises(ValueError, match=r"matmul: X must be 1-D or 2-D, got 3-D with shape \(3, 2, 2\)"):
        T @ np.ones((3, 2, 2), np.float32)
    with pytest.raises(ValueError, match=r"matmul: the left operand must be 1-D or 2-D, got 3-D"):
        np.ones((2, 2, 3), np.float32) @ T
    with pytest.raises(ValueError, match=r"sddmm: Xa must be 1-D or 2-D, got 3-D"):
        tg.sddmm(T, np.ones((3, 2, 2), np.float32))
    with pytest.raises(ValueError, match=r"sddmm: Xb must be 1-D or 2-D, got 3-D"):
        tg.sddmm(T, np.ones((3, 2), np.float32), np.ones((3, 2, 2), np.float32))


def test_string_operands():
    T = tg.TiledMatrix(sp.csr_array(np.eye(3, dtype=np.float32)))
    with pytest.raises(TypeError, match="unsupported operand type"):
        T @ "abc"
    with pytest.raises(TypeError, match="unsupported operand type"):
        "abc" @ T
    with pytest.raises(TypeError, match="spmm: X must be an array of numbers, got str"):
        tg.spmm(T, "abc")
    with pytest.raises(TypeError, match="sddmm: Xa must be a dense array of numbers, got str"):
        tg.sddmm(T, "abc")


def test_int32_limit_from_the_shape_before_any_conversion():
    import tracemalloc

    A = sp.coo_array((np.ones(1, np.float32), ([0], [0])), shape=(2**31, 2))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="does not fit the int32 indices"):
            tg.TiledMatrix(A)  # scipy's tocsr() would allocate a 16 GiB indptr first (MemoryError on small hosts)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 26


def test_graph_permute_takes_an_array_like():
    g = tg.load_cora()
    order = np.arange(g.adj.shape[0])[::-1]
    for perm in (order, order.tolist()):
        h = g.permute(perm)
        assert isinstance(h.permutation, tg.Permutation)
        assert (h.labels == g.labels[order]).all()


def test_permutation_of_no_vertices_and_wrong_types():
    assert len(tg.Permutation([])) == 0
    with pytest.raises(ValueError, match=r"a permutation is a 1-D array of integers, got a 1-D array of float64"):
        tg.Permutation([0.0, 1.0])
    with pytest.raises(ValueError, match="1-D array of integers, got a 0-D array of object"):
        tg.Permutation({})


@pytest.mark.skipif(GPU, reason="checks the messages given where no GPU is usable")
def test_distributed_without_a_gpu_says_so():
    with pytest.raises(RuntimeError, match=r"needs CUDA GPUs, and none is usable here.*backend='reference'"):
        dist.spmd(lambda ctx: 1, 2)
    with pytest.raises(RuntimeError, match=r"distributed.init\(\) needs CUDA GPUs"):
        dist.init()


@pytest.mark.parametrize("timeout", [-1, 0, float("nan"), "5"])
def test_distributed_timeouts(timeout):
    err = TypeError if isinstance(timeout, str) else ValueError
    with pytest.raises(err, match="timeout must be a"):
        dist.spmd(lambda ctx: 1, 1, backend="reference", timeout=timeout)
    with pytest.raises(err, match="timeout must be a"):
        dist.init(timeout=timeout)


def test_load_graph_says_what_it_takes():
    with pytest.raises(FileNotFoundError, match=r"no graph at 'pubmed': expected a folder.*only cora ships"):
        tg.load_graph("pubmed")
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got NoneType"):
        tg.load_graph(None)


@pytest.mark.parametrize("args, message", [
    (["--dims", "-5"], "feature widths must be integers >= 1"),
    (["--dims", "0"], "feature widths must be integers >= 1"),
    (["--dims", "a"], "expected comma-separated integers"),
    (["--epochs", "0"], "--epochs must be at least 1"),
])
def test_bench_cli_ranges(args, message, capsys, monkeypatch):
    from tcgnn_py.bench.__main__ import main

    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")  # main sets it for --device cpu: restored after the test
    with pytest.raises(SystemExit) as e:
        main(["cora", "--device", "cpu", *args])
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("spec, message", [
    ("banded:10:-1", "N >= 1 and K >= 0"),
    ("powerlaw:0:5", "N >= 1 and K >= 0"),
    ("no_such_graph_here", "looked up as NAME/adj_csr.npz under $TCGNN_PY_DATA"),
])
def test_bench_cli_graph_specs(spec, message, capsys, monkeypatch):
    from tcgnn_py.bench.__main__ import main

    monkeypatch.setenv("TCGNN_PY_DEVICE", "cpu")  # main sets it for --device cpu: restored after the test
    with pytest.raises(SystemExit) as e:
        main([spec, "--device", "cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and ("only cora ships" in err or ":" in spec)


def _example(*args):
    env = dict(os.environ, TCGNN_PY_DEVICE="cpu")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, "gcn_cora.py"), *args], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["--cuda-graph", "--device", "cpu"], "--cuda-graph captures GPU work: it needs a usable GPU"),
    (["--epochs", "0", "--device", "cpu"], "--epochs must be at least 1"),
    (["--min-accuracy", "80", "--device", "cpu"], "--min-accuracy is a fraction in [0, 1]"),
])
def test_example_arguments_are_argparse_errors(args, message):
    res = _example(*args)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr


def test_example_bfloat16_without_the_extra():
    env = dict(os.environ, TCGNN_PY_DEVICE="cpu")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    # A stand-in ml_dtypes that fails to import, as on an install without the extra.
    code = ("import sys, runpy; sys.modules['ml_dtypes'] = None; "
            f"sys.argv = ['gcn_cora.py', '--dtype', 'bfloat16', '--device', 'cpu']; "
            f"sys.path.insert(0, {EXAMPLES!r}); runpy.run_path({os.path.join(EXAMPLES, 'gcn_cora.py')!r}, "
            "run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 2 and "pip install 'tcgnn_py[bf16]'" in res.stderr and "Traceback" not in res.stderr


# --- the sweep of the public surface --------------------------------------------------------------------------


@pytest.mark.parametrize("call, message", [
    (lambda T: tg.TiledMatrix(T.tocsr(), dtype="x"), "dtype must be a dtype or its name"),
    (lambda T: tg.TiledMatrix(T.tocsr(), dtype=1.5), "dtype must be a dtype or its name"),
    (lambda T: T.astype(0), "dtype must be a dtype or its name"),
    (lambda T: T.with_values(np.ones(T.nnz), dtype="x"), "dtype must be a dtype or its name"),
    (lambda T: T.with_values(np.ones(T.nnz), order=np.ones(2)), "order must be 'csr' or 'tiled'"),
    (lambda T: tg.sddmm(T, np.ones((3, 2)), multiply_values=np.ones(2)), "multiply_values must be a bool"),
    (lambda T: T.check_format(np.ones(2)), "full_check must be a bool"),
    (lambda T: T.transpose(axes=1.5), "an 'axes' parameter other than (1, 0)"),
    (lambda T: tg.best_pattern(T.tocsr(), max_M="x"), "max_M must be an int"),
    (lambda T: tg.nn.add_self_loops(T.tocsr(), fill_value="x"), "fill_value must be a real number"),
    (lambda T: tg.reorder(None), "A must be a sparse matrix"),
    (lambda T: tg.locality_report({}), "A must be a sparse matrix"),
])
def test_public_surface_errors(call, message):
    T = tg.TiledMatrix(sp.csr_array(np.eye(3, dtype=np.float32)))
    with pytest.raises((TypeError, ValueError)) as e:
        call(T)
    assert message in str(e.value)
