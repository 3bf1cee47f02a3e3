"""What the test process can run, decided before anything imports Numba; shared helpers.

* ``NUMBA_ENABLE_CUDASIM=1``: the Numba kernels run in the CUDA simulator, with
  the project's warp-intrinsic shim.
* a usable GPU: everything runs, ``gpu`` and ``kernels`` tests on the device.
* neither: ``gpu``/``kernels`` tests are skipped with the reason.

Test modules import flags and helpers from here, never from ``conftest``.
"""

import os
import pathlib
import sys

import numpy as np
import scipy.sparse as sp

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
if SIM:
    sys.setswitchinterval(1e-3)  # the simulator is thread-bound: switch often
    from tcgnn_py import _cudasim

    _cudasim.install()

import tcgnn_py  # noqa: E402
from tcgnn_py._device import gpu_unusable_reason  # noqa: E402

GPU = tcgnn_py.gpu_available()
GPU_REASON = gpu_unusable_reason()

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA_DIRS = list(dict.fromkeys(
    pathlib.Path(p).resolve()
    for p in (os.environ.get("TCGNN_PY_DATA"), ROOT / ".gpu" / "data", ROOT.parent / "shared" / "data")
    if p
))
#: How to get the graphs a skipped test wanted.
DATA_HINT = (
    "set TCGNN_PY_DATA to a folder of graphs (NAME/adj_csr.npz + meta.json), "
    "e.g. the project's ../shared/data"
)


def host(x):
    """A NumPy copy of a NumPy or CuPy array."""
    return x.get() if hasattr(x, "get") else np.asarray(x)


#: The graph the package bundles: tests that need only it never skip.
BUNDLED = {"cora": pathlib.Path(tcgnn_py.__file__).parent / "datasets" / "cora"}


def graph_dir(name):
    """Folder of a named graph (cora: the bundled copy when no data folder has it), or skip saying how."""
    import pytest

    for d in DATA_DIRS:
        if (d / name / "adj_csr.npz").exists():
            return d / name
    if name in BUNDLED:
        return BUNDLED[name]
    pytest.skip(f"graph {name!r} not found in {[str(d) for d in DATA_DIRS]}; {DATA_HINT}")


def config_id(cfg):
    """A short test id of a kernel config: its template's name and arguments (``vec_async-1-4-2-T-T-T-F-F-F``)."""
    args = "-".join(("T" if v else "F") if isinstance(v, bool) else str(v) for v in vars(cfg).values())
    return f"{cfg.KERNEL.removeprefix('tcgnn_spmm_')}-{args}"


def tuning_fixture(variants):
    """A fixture parametrized over ``variants`` (name -> ``tcgnn_py.tuning`` keywords): each test runs inside the block."""
    import pytest

    @pytest.fixture(params=list(variants))
    def fixture(request):
        with tcgnn_py.tuning(**variants[request.param]):
            yield request.param

    return fixture


def poisoned(cp, T, X, dtype, precision=None):
    """``tg.spmm(T, X, out=...)`` into a NaN-filled out (every element must be written), as float64 on the host."""
    out = cp.full((T.shape[0], X.shape[1]), cp.nan, dtype=dtype)
    assert tcgnn_py.spmm(T, X, out=out, precision=precision) is out
    return np.asarray(out.get(), np.float64)


def count_timing(monkeypatch):
    """Count the timed launch choice's timings: a list that gets each timing's number of candidates."""
    from tcgnn_py.kernels import timing

    calls, real = [], timing.time_round_robin

    def counted(fns, rounds):
        calls.append(len(fns))
        return real(fns, rounds)

    monkeypatch.setattr(timing, "time_round_robin", counted)
    return calls


#: Relative Frobenius error allowed on random float data, by name: of a precision ("tf32", "fp32" CUDA cores,
#: "fp64"), or of a result's dtype (16-bit X: float32 accumulation, one rounding of the result).
TOL = {"tf32": 1e-3, "fp32": 1e-5, "fp64": 1e-12, "float32": 1e-5, "float64": 1e-12, "float16": 2e-3,
       "bfloat16": 1e-2}


def ints(rng, *shape, dtype=np.float32):
    """Small integers (|x| <= 8) of ``shape`` as ``dtype``: exact in TF32 and 16 bits."""
    return rng.integers(-8, 9, shape).astype(np.float32).astype(dtype)


def int_graph(rng, m, n, degree=12, dtype=np.float64):
    """A random m x n CSR matrix with ~``degree`` entries per row, values in [-4, 4] minus 0 (exact everywhere)."""
    A = sp.random_array((m, n), density=min(1.0, degree / max(n, 1)), rng=rng, format="csr", dtype=np.float64)
    A.data[:] = rng.integers(1, 5, A.nnz) * rng.choice([-1, 1], A.nnz)
    return A.astype(dtype)


def exact_product(A, X, dtype):
    """``A @ X`` in float64, rounded once to ``dtype`` (what every path returns on small integers)."""
    return (A.astype(np.float64) @ np.asarray(X, np.float64)).astype(np.float32).astype(dtype)


def check_cached_launch(cp, A, T, X, types, precision, rng):
    """The second call of a signature takes the cached launch and gives the first call's bits (small integers).

    ``T @ X`` twice (the first call caches one launch); ``spmm(out=)`` into each of ``types``, with and without
    ``precision``; then a matrix made by ``with_values`` on the same tiling: the cached launch reads the matrix
    it is called on.  Returns nothing; asserts.
    """
    from tcgnn_py.kernels import registry

    Xh = X.get()
    T.copy() @ X  # a timed choice's candidates compile (in the background) and are waited for: T's first
    registry.wait_for_compiles()  # call then times them all, and its launch is final (cacheable), not provisional
    from tcgnn_py.products import signature

    first = T @ X
    assert T.tiling.bound()[signature(T.values, X)].bound is not None, "the first call bound its plan's launch"
    second = T @ X
    want = exact_product(A, Xh, first.dtype)
    np.testing.assert_array_equal(first.get(), want)
    np.testing.assert_array_equal(second.get(), want)
    for ydt in types:
        for p in (None, precision):
            a, b = poisoned(cp, T, X, ydt, p), poisoned(cp, T, X, ydt, p)
            np.testing.assert_array_equal(a, exact_product(A, Xh, ydt).astype(np.float64))
            np.testing.assert_array_equal(b, a)
    B = A.copy()
    B.data = rng.integers(-4, 5, B.nnz).astype(np.float64)
    T2 = T.with_values(cp.asarray(B.data.astype(T.dtype)))
    np.testing.assert_array_equal((T2 @ X).get(), exact_product(B, Xh, first.dtype))
    np.testing.assert_array_equal(poisoned(cp, T2, X, types[0]), exact_product(B, Xh, types[0]).astype(np.float64))


def _cp():
    if not GPU:
        import pytest

        pytest.skip("needs a CUDA GPU")
    import cupy

    return cupy


def cupy_fixture():
    """A module-scoped fixture returning CuPy, or skipping the test with the reason when there is no GPU."""
    import pytest

    return pytest.fixture(scope="module", name="cp")(_cp)


# A subprocess: the translation's kernels compiled by the background compile for device 0 (a compile loads its
# module there, a read of Numba's disk cache loads nothing), then a translation on device ``argv[1]``; prints how
# many modules of Numba's each device's context holds.
WARMED_THEN_TRANSLATED = """
import sys, cupy, tcgnn_py as tg
from numba.cuda.cudadrv import devices
from tcgnn_py.kernels.registry import wait_for_compiles
from tcgnn_py.tiles import _sgt
A = tg.power_law_graph(3000, 30000, seed=1)
_sgt.warm_kernels()
wait_for_compiles()
with cupy.cuda.Device(int(sys.argv[1])), tg.tuning(sgt_host_max=-1):
    T = tg.TiledMatrix(A)
    assert (T.tocsr() != A).nnz == 0
print(*(len(g.primary_context.modules) if g.primary_context else 0 for g in devices.gpus))
"""

