# Host cost of the pieces of a cached tg.spmm call (no synchronisation inside the loops: the GPU keeps up).
import numpy as np, cupy as cp, tcgnn_py as tg
from tcgnn_py import _ops

from tcgnn_py.bench import resolve_graph
from tcgnn_py.bench._timing import time_per_call
_, A = resolve_graph("cora"); A = A.astype(np.float32)
T = tg.TiledMatrix(A)
X = cp.asarray(np.random.default_rng(0).standard_normal((A.shape[1], 32)).astype(np.float32))
Y = cp.empty((A.shape[0], 32), cp.float32)
for _ in range(20): tg.spmm(T, X, out=Y)
cp.cuda.Device().synchronize()
key = _ops.hot_key(T._values, X, Y, None)
f = T._hot[key]
closure_cells = {c.cell_contents.__class__.__name__: c.cell_contents for c in (f.__closure__ or [])}
run = closure_cells.get("BoundLaunch") or closure_cells.get("function")
from tcgnn_py.kernels.driver import BoundLaunch
bl = next((c.cell_contents for c in f.__closure__ if isinstance(c.cell_contents, BoundLaunch)), None)
from cupy_backends.cuda.api import driver
def timeit(name, fn, n=20000):
    host, _ = time_per_call(fn, n, warmup=200)
    print(f"{name:40s} {1e6 * host:6.2f} us", flush=True)
vals = T._values
stream = cp.cuda.get_current_stream()
timeit("tg.spmm(T, X, out=Y)", lambda: tg.spmm(T, X, out=Y))
timeit("T @ X (new Y)", lambda: T @ X)
timeit("hot_key", lambda: _ops.hot_key(vals, X, Y, None))
timeit("T._hot.get(key)", lambda: T._hot.get(key))
timeit("_overlap(Y, X)", lambda: _ops._overlap(Y, X))
timeit("X.data.ptr", lambda: X.data.ptr)
timeit("get_current_stream().ptr", lambda: cp.cuda.get_current_stream().ptr)
timeit("runtime.getDevice()", lambda: cp.cuda.runtime.getDevice())
timeit("closure f(T, X, Y)", lambda: f(T, X, Y))
if bl is not None:
    timeit("BoundLaunch(vals, X, Y)", lambda: bl(vals, X, Y))
    timeit("driver.launchKernel (bound args)", lambda: bl._launch(*bl._args))
k = cp.RawKernel("extern \"C\" __global__ void e(){}", "e")
k((1,), (32,), ())
fp = k.kernel.ptr if hasattr(k, "kernel") else None
import ctypes
ptrs = (ctypes.c_void_p * 1)()
timeit("launchKernel empty kernel", lambda: driver.launchKernel(k.kernel.ptr, 1, 1, 1, 32, 1, 1, 0, stream.ptr, ctypes.addressof(ptrs), 0))
