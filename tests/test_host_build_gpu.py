"""Small host inputs are translated (and reordered) on the host: the same arrays and permutations as the kernels'.

The GPU path of ``TiledMatrix`` translates a host input of up to ``sgt_host_max`` entries with the NumPy
reference and uploads the result once (up to ``sgt_host_cold_max``, transposes too, until the kernels have
run in the process), and ``reorder`` with ``device=None`` runs small graphs on the host: both skip the Numba
kernels' first compile.  These tests pin the kernels with ``tg.tuning`` and compare.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import tcgnn_py as tg
from _env import cupy_fixture, ints
from _zoo import zoo

cp = cupy_fixture()
KERNELS = dict(sgt_host_max=-1, nm_group_host_max=-1)  # every size goes to the kernels
GRAPHS = dict(zoo(), cora=tg.load_cora().adj, power_law=tg.power_law_graph(3000, 30000, seed=3))


def _arrays(T):
    return {k: getattr(T.tiling, k) for k in ("win_ptr", "block_cols", "block_ptr", "tile_pos", "perm")} | {
        "values": T.values}


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["vector", "tcgnn", "2:4", "1:2"])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_host_build_equals_the_kernels(cp, name, layout):
    A = GRAPHS[name]
    T = tg.TiledMatrix(A, layout=layout)
    with tg.tuning(**KERNELS):
        K = tg.TiledMatrix(A, layout=layout)
    assert T.device == K.device == "cuda"
    for (k, a), b in zip(_arrays(T).items(), _arrays(K).values()):
        assert isinstance(a, cp.ndarray) and a.dtype == b.dtype and a.shape == b.shape, k
        np.testing.assert_array_equal(a.get(), b.get(), err_msg=k)
    if A.shape[1]:
        X = cp.asarray(ints(np.random.default_rng(0), A.shape[1], 16))
        np.testing.assert_array_equal((T @ X).get(), (K @ X).get())
        np.testing.assert_array_equal((T.T.T @ X).get(), (A @ X.get().astype(np.float64)).astype(np.float32))


@pytest.mark.gpu
def test_nm_grouping_of_a_larger_host_build_runs_on_the_gpu(cp):
    """Between the two limits, SGT runs on the host and the N:M grouping on the GPU: the same arrays again."""
    A = GRAPHS["power_law"]
    with tg.tuning(nm_group_host_max=A.nnz - 1):
        T = tg.TiledMatrix(A, layout="2:4")
    with tg.tuning(**KERNELS):
        K = tg.TiledMatrix(A, layout="2:4")
    for (k, a), b in zip(_arrays(T).items(), _arrays(K).values()):
        np.testing.assert_array_equal(a.get(), b.get(), err_msg=k)


@pytest.mark.gpu
def test_device_input_keeps_the_kernels(cp):
    """CuPy input is translated where it is (no download), whatever its size."""
    import cupyx.scipy.sparse as csp

    A = GRAPHS["cora"]
    T = tg.TiledMatrix(csp.csr_matrix(A.astype(np.float32)))
    np.testing.assert_array_equal(T.tocsr().toarray(), A.toarray())


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["2:4", (4, 2, 8), "locality"])
def test_small_reorder_on_the_host_equals_the_kernels(cp, pattern):
    A = tg.power_law_graph(1001, 6000, seed=4, symmetric=True)
    auto = tg.reorder(A, pattern, max_iter=3) if pattern != "locality" else tg.reorder(A, pattern)
    kern = tg.reorder(A, pattern, max_iter=3, device="cuda") if pattern != "locality" else \
        tg.reorder(A, pattern, device="cuda")
    np.testing.assert_array_equal(auto.perm, kern.perm)
    with tg.tuning(reorder_host_max=-1, locality_host_max=-1):  # device=None on the kernels
        again = tg.reorder(A, pattern, max_iter=3) if pattern != "locality" else tg.reorder(A, pattern)
    np.testing.assert_array_equal(again.perm, kern.perm)


@pytest.mark.gpu
def test_locality_report_on_the_host_equals_the_kernels(cp):
    A = sp.csr_array(GRAPHS["cora"])
    auto = tg.locality_report(A)
    kern = tg.locality_report(A, device="cuda")
    assert auto == kern


_COLD = r"""
import json, sys
import numpy as np, cupy as cp, scipy.sparse as sp
import tcgnn_py as tg
from tcgnn_py.tiles import _sgt
A = tg.power_law_graph(40000, 400000, seed=5)  # above sgt_host_max, below sgt_host_cold_max
X = cp.asarray(np.random.default_rng(0).integers(-8, 9, (A.shape[0], 16)).astype(np.float32))
with tg.tuning(sgt_compile_after=-1):  # (no background compile: the kernels stay cold until used)
    T = tg.TiledMatrix(A)
    Y, YT = (T @ X).get(), (T.T @ X).get()
cold = _sgt.kernels_ran()
with tg.tuning(sgt_host_max=-1):
    K = tg.TiledMatrix(A)  # the kernels, now
same = all(bool((getattr(T.tiling, k) == getattr(K.tiling, k)).all())
           for k in ("win_ptr", "block_cols", "block_ptr", "tile_pos", "perm"))
# T's transpose was worked out on the host while cold (with its derived data); K's on the device, by the kernels
same_T = all(bool((getattr(T.T.tiling, k) == getattr(K.T.tiling, k)).all())
             for k in ("win_ptr", "block_cols", "block_ptr", "tile_pos", "perm")) and bool((T.T.values == K.T.values).all())
derived_T = T.T.tiling.peek("block_meta") is not None and isinstance(T.T.tiling.peek(("host", "win_ptr")), np.ndarray)
W = tg.TiledMatrix(A)  # warm: the kernels again
Bd = (A.astype(np.float64) @ X.get()).astype(np.float32), (A.T.astype(np.float64) @ X.get()).astype(np.float32)
print(json.dumps(dict(nnz=int(A.nnz), ran_before=cold, ran_after=_sgt.kernels_ran(), same=same, same_T=same_T,
                      derived_T=derived_T,
                      exact=bool((Y == Bd[0]).all() and (YT == Bd[1]).all()),
                      warm_exact=bool(((W @ X).get() == Bd[0]).all()), T_host_limit=_sgt.host_limit())))
"""


@pytest.mark.gpu
def test_a_first_build_above_the_host_limit_waits_no_compile(cp):
    """In a new process, a host graph above ``sgt_host_max`` and its transpose are translated on the host while the
    kernels have not run (no compile on first use; the transpose worked out there whole, with its derived data);
    once they have, the same graph and its transpose go to them: equal arrays."""
    res = subprocess.run([sys.executable, "-c", _COLD], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    from tcgnn_py import _tuning

    assert _tuning.DEFAULTS["sgt_host_max"] < out["nnz"] <= _tuning.DEFAULTS["sgt_host_cold_max"]
    assert out == dict(out, ran_before=False, ran_after=True, same=True, same_T=True, derived_T=True, exact=True,
                       warm_exact=True,
                       T_host_limit=_tuning.DEFAULTS["sgt_host_max"])


_BEHIND = r"""
import json
import numpy as np, cupy as cp
import tcgnn_py as tg
from tcgnn_py.kernels import sgt as k
from tcgnn_py.tiles import _sgt
A = tg.power_law_graph(40000, 400000, seed=5)  # above sgt_host_max, below sgt_host_cold_max
X = cp.asarray(np.random.default_rng(0).integers(-8, 9, (A.shape[0], 16)).astype(np.float32))
T = tg.TiledMatrix(A)  # on the host; the first such build starts no compile
first = _sgt._WARMING.get("thread")
T = tg.TiledMatrix(A)  # on the host again, and the kernels' compile starts behind it
thread = _sgt._WARMING.get("thread")
Y = (T @ X).get()
from tcgnn_py.kernels.registry import wait_for_compiles
wait_for_compiles()  # (the registry tracks the compile: a benchmark's timing waits for it)
# the compile is over once the wait returns; its thread may still be returning (marking it done is the thread's
# last step), so what the wait promises is read from the compile's own result, not from the thread
waited = _sgt.kernels_ran()
thread.join(300)
compiled = {name: len(kernel.overloads) for name, (kernel, _) in k.KERNELS.items()}
K = tg.TiledMatrix(A)  # the kernels, now: nothing compiles
same = all(bool((getattr(T.tiling, a) == getattr(K.tiling, a)).all())
           for a in ("win_ptr", "block_cols", "block_ptr", "tile_pos", "perm"))
Bd = (A.astype(np.float64) @ X.get()).astype(np.float32)
print(json.dumps(dict(first=first is not None, started=thread is not None, waited=waited, ready=_sgt.kernels_ran(),
                      limit=_sgt.host_limit(),
                      compiled_again=[n for n, c in compiled.items() if len(k.KERNELS[n][0].overloads) != c],
                      compiled=sorted(n for n, c in compiled.items() if c), same=same,
                      exact=bool((Y == Bd).all() and ((K @ X).get() == Bd).all()))))
"""


@pytest.mark.gpu
def test_a_second_cold_build_on_the_host_compiles_the_kernels_behind_it(cp):
    """The second build sent to the host only because the kernels have not run compiles them in the background
    (the first does not), and ``wait_for_compiles`` waits for that compile: once it ends, the next build of the
    size goes to the kernels and compiles nothing more (their signatures are the launches'), with the same arrays
    and exact products."""
    from tcgnn_py.kernels import sgt as k

    res = subprocess.run([sys.executable, "-c", _BEHIND], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    from tcgnn_py import _tuning

    assert out == dict(first=False, started=True, waited=True, ready=True, limit=_tuning.DEFAULTS["sgt_host_max"],
                       compiled_again=[],
                       compiled=sorted(k.KERNELS), same=True, exact=True)


_NO_BACKGROUND = r"""
import tcgnn_py as tg
from tcgnn_py.kernels import registry
from tcgnn_py.tiles import _sgt
registry.stop_background_compiles()
A = tg.power_law_graph(40000, 400000, seed=5)
tg.TiledMatrix(A)
tg.TiledMatrix(A)  # the second cold build, which would start the kernels' compile behind it
print("thread:", _sgt._WARMING.get("thread"), "cold:", _sgt._WARMING.get("cold"), flush=True)
"""


@pytest.mark.gpu
def test_no_compile_starts_behind_cold_builds_where_background_compiles_are_off(cp):
    """A process that turned background compiles off (NCCL collectives: a module load on another thread can
    deadlock them) starts no compile of the translation kernels behind its cold builds either."""
    res = subprocess.run([sys.executable, "-c", _NO_BACKGROUND], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "thread: None cold: 2" in res.stdout, res.stdout


_EXIT = r"""
import tcgnn_py as tg
from tcgnn_py.tiles import _sgt
A = tg.power_law_graph(40000, 400000, seed=5)
tg.TiledMatrix(A)
tg.TiledMatrix(A)  # the second cold build: the kernels compile behind it
print("compiling at exit:", _sgt._WARMING["thread"].is_alive(), flush=True)
"""


@pytest.mark.gpu
def test_a_process_ends_cleanly_while_the_kernels_compile_behind_it(cp, tmp_path):
    """A process that ends while the background compile runs (an empty kernel cache: it compiles for seconds)
    stops it after the kernel in hand and exits with status 0, no traceback and no fatal error."""
    res = subprocess.run([sys.executable, "-c", _EXIT], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONUNBUFFERED="1", NUMBA_CACHE_DIR=str(tmp_path)))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "compiling at exit: True" in res.stdout
    assert "Traceback" not in res.stderr and "Fatal" not in res.stderr, res.stderr[-3000:]


_RACE = r"""
import json, threading, time
import numpy as np, cupy as cp, cupyx.scipy.sparse as csp
import tcgnn_py as tg
from numba.cuda.cudadrv import driver
from tcgnn_py.kernels import numba_launch, sgt  # noqa: F401  (imported here: the compile thread reaches Numba at once)
from tcgnn_py.tiles import _sgt
init, entered = driver.Device.__init__, threading.Event()

def slow(self, devnum):  # Numba registering a device, slowed: the compile thread is inside it when the caller launches
    entered.set()
    time.sleep(1.0)
    init(self, devnum)

driver.Device.__init__ = slow
A = tg.power_law_graph(3000, 30000, seed=1)
X = cp.asarray(np.random.default_rng(0).integers(-8, 9, (A.shape[1], 16)).astype(np.float32))
thread = _sgt.warm_kernels()
entered.wait(60)
with tg.tuning(sgt_host_max=-1):  # (a device CSR to the kernels: the caller's first Numba launch)
    T = tg.TiledMatrix(csp.csr_matrix(A))
Y = (T @ X).get()
thread.join(300)
print(json.dumps(dict(raced=entered.is_set(), exact=bool((Y == (A.astype(np.float64) @ X.get())).all()),
                      compiled=_sgt.kernels_ran())))
"""


@pytest.mark.gpu
def test_a_translation_launched_while_the_kernels_compile_behind_it_shares_numba_s_devices(cp):
    """The caller's first Numba launch and the background compile reach Numba's device list at once (Numba
    registering a device is slowed so that they do): the list is built once, the translation is exact, and the
    compile ends with the kernels ready.  Numba builds that list without a lock: both threads registered device 0,
    and one raised."""
    res = subprocess.run([sys.executable, "-c", _RACE], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == dict(raced=True, exact=True, compiled=True), res.stdout
