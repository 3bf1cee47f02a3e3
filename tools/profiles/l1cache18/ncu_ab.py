# One profiled call of tg.spmm: SIDE "old" = the 16-bit family of base_products.py (cp.async.cg) with (hi, lo)
# pairs; "pairs" = this tree's kernels with pairs; "new" = this tree as it is. Usage: GRAPH D DTYPE SIDE [knob=value]
import sys, numpy as np, cupy as cp, tcgnn_py as tg
from tcgnn_py import _ops
from tcgnn_py.kernels import registry
from tcgnn_py.bench import resolve_graph
g, D, dt, side = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
for kv in sys.argv[5:]:
    k, v = kv.split("=")
    _ops.set_tuning(**{k: eval(v)})
if side in ("old", "pairs"):
    _ops.set_tuning(half_exact_values=False)
if side == "old":
    old = {"__name__": "tcgnn_py.kernels._old", "__package__": "tcgnn_py.kernels"}
    exec(compile(open(".gpu/base_products.py").read(), "base_products.py", "exec"), old)
    registry.register("half_old", *old["FAMILIES"]["half"])
    real = registry.get_kernel
    registry.get_kernel = lambda family, name: real("half_old" if family == "half" else family, name)
_, A = resolve_graph(g); A = A.astype(np.float32); A.sum_duplicates()
T = tg.TiledMatrix(A)
if dt == "bfloat16":
    import ml_dtypes
    dt = ml_dtypes.bfloat16
X = cp.asarray(np.random.default_rng(0).standard_normal((A.shape[1], D)).astype(np.float32)).astype(dt)
Y = cp.empty((A.shape[0], D), cp.float32)
for _ in range(5):
    tg.spmm(T, X, out=Y)
cp.cuda.Device().synchronize()
print(g, D, dt, side, sys.argv[5:], [str(v.kernel) for k, v in T.tiling._cache.items() if isinstance(k, tuple) and "launch" in str(k[0])], flush=True)
cp.cuda.profiler.start()
tg.spmm(T, X, out=Y)
cp.cuda.Device().synchronize()
cp.cuda.profiler.stop()
