"""A product's cached launch (hot path) against its first-call path, per layout and X type, in one process.

    python tools/host_costs.py GRAPH ... [--dims 64]

For each graph, width, layout (vector, 2:4, 1:2) and X type the layout takes on
tensor cores: ``tg.spmm(T, X, out=Y)`` (the hot path once a signature has been
seen) against ``T._matmul_dispatch(X, out=Y)`` (the path every first call takes:
validation, precision, casts, launch lookup, CuPy's launch).  Three figures each:
host µs per call (wall clock over back-to-back calls, closed by one
synchronisation), one call from idle, and GPU-only (both µs, the harness's
clocks; 4 rotating small-integer inputs).
"""

import argparse

import numpy as np

LAYOUTS = (("vector", ("float32", "float16", "bfloat16")), ("2:4", ("float16", "bfloat16")), ("1:2", ("float32",)))


def host_us(call, n=1000):
    from tcgnn_py.bench._timing import time_per_call

    return 1e6 * time_per_call(call, n, warmup=30)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--dims", default="64")
    args = ap.parse_args()

    import cupy as cp

    import tcgnn_py as tg
    from tcgnn_py.bench import resolve_graph
    from tcgnn_py.bench._timing import time_queued, time_rotating

    print("| graph | D | layout | X | host µs/call: cached / first-call path | from idle µs | GPU-only µs |")
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for spec in args.graphs:
        name, A = resolve_graph(spec)
        A = A.astype(np.float32)
        for D in (int(d) for d in args.dims.split(",")):
            Xs = [cp.asarray(rng.integers(-3, 4, (A.shape[1], D)).astype(np.float32)) for _ in range(4)]
            Y = cp.empty((A.shape[0], D), cp.float32)
            for layout, types in LAYOUTS:
                T = tg.TiledMatrix(A, layout=layout)
                for dt in types:
                    X = [x.astype(dt) for x in Xs]
                    paths = {"hot": lambda i: tg.spmm(T, X[i], out=Y), "slow": lambda i: T._matmul_dispatch(X[i], out=Y)}
                    paths["hot"](0)  # plans and caches the launch
                    r = {k: (host_us(lambda: f(0)), 1e3 * time_rotating(f, 4, 20, 3), 1e3 * time_queued(f, 4))
                         for k, f in paths.items()}
                    h, s = r["hot"], r["slow"]
                    print(f"| {name} | {D} | {layout} | {dt} | {h[0]:.1f} / {s[0]:.1f} | {h[1]:.1f} / {s[1]:.1f} |"
                          f" {h[2]:.1f} / {s[2]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
