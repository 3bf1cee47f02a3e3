"""One plan per operand signature: a plan runs its general form until its binder gives a bound launch."""

from tcgnn_py.products import Plan


def test_a_plan_runs_general_until_its_launch_binds():
    calls = []

    def general(values, casts, X, out):
        calls.append("general")
        return "Y"

    tries = iter([None, None, lambda values, casts, X, out: calls.append("bound") or "Y"])

    def binder(values, casts, X, out, general):
        calls.append("bind")
        return next(tries)

    plan = Plan(general, binder)
    for _ in range(4):
        assert plan("values", {}, "X", None) == "Y"
    # the launch is provisional twice (the binder gives None), then bound: later calls skip general and binder
    assert calls == ["general", "bind", "general", "bind", "general", "bind", "bound"]
    assert plan.bound is not None


def test_a_plan_without_a_binder_stays_general():
    n = []
    plan = Plan(lambda values, casts, X, out: n.append(1) or len(n))
    assert [plan(None, {}, None, None) for _ in range(3)] == [1, 2, 3] and plan.bound is None


# --- the problem a signature poses, decided once: which family, what alignment ---------------------------------

import types  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import scipy.sparse as sp  # noqa: E402

import tcgnn_py as tg  # noqa: E402
from tcgnn_py.products import Operand, Problem  # noqa: E402
from tcgnn_py.products._dispatch import SDDMM, SPMM  # noqa: E402


def _device_array(dtype, shape, ptr=1 << 20, contiguous=True):
    """What a plan reads of a device array: dtype, shape, C-contiguity, base address."""
    return types.SimpleNamespace(dtype=np.dtype(dtype), shape=shape, data=types.SimpleNamespace(ptr=ptr),
                                 flags=types.SimpleNamespace(c_contiguous=contiguous))


def _tiling(layout):
    A = sp.random(40, 24, density=0.2, format="csr", dtype=np.float32, random_state=0)
    return tg.TiledMatrix(A, layout=layout).tiling


@pytest.mark.parametrize("layout, x, result, precision, family", [
    ("vector", "float32", "float32", None, "vec"),
    ("tcgnn", "float32", "float32", None, "tf32"),
    ("tcgnn", "float32", "float32", "fp32", "core"),
    ("vector", "float64", "float64", None, "core"),
    ("vector", "float16", "float32", None, "half"),
    ("vector", "bfloat16", "bfloat16", "bf16", "half"),
    ("2:4", "float16", "float16", None, "sparse"),
    ("2:4", "float32", "float32", None, "core"),  # no float32 kernel on 16x16 tiles
    ("1:2", "float32", "float32", None, "sparse"),
    ("1:2", "float32", "float32", "fp32", "core"),
])
def test_the_front_door_table_names_the_family_that_plans_a_problem(layout, x, result, precision, family):
    if "bfloat16" in (x, result):
        pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes (the [bf16] extra)")  # registers the name
    X = _device_array(x, (24, 16))
    problem = Problem.spmm(_tiling(layout), np.ones(3, np.float32), X, np.dtype(result), precision, None)
    assert SPMM[problem.route].__name__ == f"tcgnn_py.products.families.{family}"
    assert problem.X == Operand(np.dtype(x), (24, 16), True, True) and problem.out is None


def test_alignment_is_decided_from_the_operands_as_the_kernel_reads_them():
    tiling, values = _tiling("vector"), np.ones(3, np.float32)

    def aligned(X, out=None, **kw):
        return Problem.spmm(tiling, values, X, np.dtype(np.float32), None, out).aligned(**kw)

    assert aligned(_device_array("float32", (24, 16)))
    assert not aligned(_device_array("float32", (24, 18)))  # rows of 18 floats: not 16-byte multiples
    assert not aligned(_device_array("float32", (24, 16)), multiple=32)
    assert not aligned(_device_array("float32", (24, 16), ptr=(1 << 20) + 4))  # a base 4 bytes off
    # ... unless the kernel reads a copy: X not C-contiguous, or of another type than the kernel's
    assert aligned(_device_array("float32", (24, 16), ptr=(1 << 20) + 4, contiguous=False))
    assert aligned(_device_array("float32", (24, 16), ptr=(1 << 20) + 4), cast=np.dtype(np.float64))
    off = _device_array("float32", (40, 16), ptr=(1 << 20) + 8)
    assert not aligned(_device_array("float32", (24, 16)), off)  # the result written in place, 8 bytes off
    assert aligned(_device_array("float32", (24, 16)), off, direct=False)  # ... or a new result, then copied


def test_only_a_result_the_kernel_writes_in_place_is_bound():
    tiling, values = _tiling("vector"), np.ones(3, np.float32)
    X = _device_array("float32", (24, 16))
    assert Problem.spmm(tiling, values, X, np.dtype(np.float32), None, None).bindable
    assert not Problem.spmm(tiling, values, _device_array("float32", (24, 16), contiguous=False), np.dtype(np.float32),
                            None, None).bindable
    strided_out = _device_array("float32", (40, 16), contiguous=False)
    assert not Problem.spmm(tiling, values, X, np.dtype(np.float32), None, strided_out).bindable
    # a float16 result of float32 X: computed in float32, then rounded into a new array
    problem = Problem.spmm(tiling, values, X, np.dtype(np.float16), None, None)
    assert problem.kdt == np.float32 and not problem.bindable


@pytest.mark.parametrize("product, table", [("spmm", SPMM), ("sddmm", SDDMM)])
def test_every_problem_a_precision_resolves_to_has_a_family(product, table):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes (the [bf16] extra)")
    types_ = (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)
    routes = set()
    for layout in ("tcgnn", "vector", "2:4", "1:2"):
        tiling, values = _tiling(layout), np.ones(3, np.float32)
        for x in types_:
            for result in types_:
                for precision in (None, "tf32", "fp32", "fp16", "bf16"):
                    X = _device_array(x, (24, 8))
                    try:
                        if product == "spmm":
                            problem = Problem.spmm(tiling, values, X, np.dtype(result), precision, None)
                        else:
                            problem = Problem.sddmm(tiling, values, _device_array(x, (40, 8)), X, np.dtype(result),
                                                    precision, None, False)
                    except (TypeError, ValueError):
                        continue  # a precision this product cannot take: an error names it
                    routes.add(problem.route)
    assert routes == set(table)


def test_an_sddmm_widens_16_bit_operands_to_tf32_where_tiles_have_tensor_cores():
    half = _device_array("float16", (24, 8))
    for layout, mode in (("vector", "tf32"), ("tcgnn", "tf32"), ("1:2", "tf32"), ("2:4", "exact")):
        problem = Problem.sddmm(_tiling(layout), np.ones(3, np.float32), _device_array("float16", (40, 8)), half,
                                np.dtype(np.float16), None, None, False)
        assert (problem.mode, problem.kdt) == (mode, np.float32), layout
        assert problem.route in SDDMM
