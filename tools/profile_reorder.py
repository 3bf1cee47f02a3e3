"""Where a GPU reorder spends its time: per backend primitive, synchronized (developer tool).

    python tools/profile_reorder.py GRAPH|powerlaw:N:E [pattern]
"""

import sys
import time
from collections import defaultdict

import cupy

import tcgnn_py as tg
from tcgnn_py import _reorder as R
sys.path.insert(0, "tools")
from reorder_report import load  # noqa: E402


def main():
    name, A = load(sys.argv[1])
    pattern = sys.argv[2] if len(sys.argv) > 2 else "2:4"
    tg.reorder(tg.power_law_graph(300, 1500, seed=1, symmetric=True), pattern)
    totals, counts = defaultdict(float), defaultdict(int)
    orig = {m: getattr(R._KernelBackend, m) for m in ("evaluate", "stage1", "stage2")}

    def wrap(m, f):
        def g(self, *a):
            cupy.cuda.get_current_stream().synchronize()
            t = time.perf_counter()
            out = f(self, *a)
            cupy.cuda.get_current_stream().synchronize()
            totals[m] += time.perf_counter() - t
            counts[m] += 1
            return out
        return g

    for m, f in orig.items():
        setattr(R._KernelBackend, m, wrap(m, f))
    t = time.perf_counter()
    p = tg.reorder(A, pattern, verbose=False)
    wall = time.perf_counter() - t
    print(f"{name} {pattern}: {p.report}; wall {wall:.3f} s")
    for m in orig:
        print(f"  {m:9s} {counts[m]:5d} calls {totals[m]:8.3f} s  {1e3 * totals[m] / max(counts[m], 1):8.3f} ms/call")
    # the stage-2 kernel alone, on the initial order
    be = R._prepare(A, pattern, "cuda")[1]
    st = orig["evaluate"](be, be.identity())
    for _ in range(2):
        cupy.cuda.get_current_stream().synchronize(); t = time.perf_counter()
        orig["stage2"](be, st)
        cupy.cuda.get_current_stream().synchronize()
    print(f"  stage2 on the input order: {1e3 * (time.perf_counter() - t):.2f} ms; evaluate:", end=" ")
    cupy.cuda.get_current_stream().synchronize(); t = time.perf_counter()
    orig["evaluate"](be, be.identity()); cupy.cuda.get_current_stream().synchronize()
    print(f"{1e3 * (time.perf_counter() - t):.2f} ms")


main()
