"""A/B of a kernel family's CUDA source in one process: the working tree's against an older one.

    git show REV:tcgnn_py/kernels/products.py > old_products.py
    python tools/ab_kernels.py --old old_products.py [--family vec] [--x-dtype float32] [--dims 32,64,128,256] [--json F] GRAPH ...

The older file's ``FAMILIES[family]`` is compiled as a family of its own, and
``get_kernel`` is pointed at it for the "old" side; everything else (plans,
launches, the timed launch choice) is the working tree's.  Per graph and width:
both sides checked exact on small-integer data, then timed on the GPU-only clock
(20 calls queued behind a spin kernel, median of 11 batches), back to back and from idle
(4 rotating inputs, median of 20), against the best of cuSPARSE ALG2 / ALG3 (float32 X).
The older file must name every kernel the working tree's launches ask for (the dense-values candidates of the
timed choice exist since `3543727`).
"""


import numpy as np


def main():
    from _sweep import graph_args  # tools/

    def more(ap):
        ap.add_argument("--old", required=True)
        ap.add_argument("--family", default="vec")
        ap.add_argument("--x-dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                        help="X's type (16-bit X runs the 'half' family)")

    args = graph_args(__doc__, more)

    import tcgnn_py as tg
    from tcgnn_py import _ops
    from tcgnn_py.kernels import registry
    from _sweep import cusparse_clocks, geomean_summary, int_points, ours_clocks, write_outputs  # tools/

    old = {"__name__": "tcgnn_py.kernels._old", "__package__": "tcgnn_py.kernels"}  # its relative imports resolve
    exec(compile(open(args.old).read(), args.old, "exec"), old)
    registry.register(args.family + "_old", *old["FAMILIES"][args.family])
    real_get = registry.get_kernel
    side = {"old": False}

    def get_kernel(family, name):
        return real_get(family + "_old" if side["old"] and family == args.family else family, name)

    registry.get_kernel = get_kernel
    base = dict(_ops.TUNING)
    rows = []
    dims = [int(d) for d in args.dims.split(",")]
    xdt = np.dtype(np.float32)
    if args.x_dtype != "float32":
        import ml_dtypes

        xdt = np.dtype(ml_dtypes.bfloat16 if args.x_dtype == "bfloat16" else np.float16)
    for name, A, Ad, T, D, Xs, Y, ref in int_points(args.graphs, dims, np.random.default_rng(0)):
        row = {"graph": name, "D": D, "cusparse": cusparse_clocks(Ad, Xs, Y)}  # float32 X: the user's alternative
        Xs = [X.astype(xdt) for X in Xs]  # small integers: exact in 16 bits
        for label in ("old", "new"):
            side["old"] = label == "old"
            _ops.set_tuning(**base)  # a new tuning version: planned (and timed) again with this side's kernels
            tg.spmm(T, Xs[0], out=Y)
            assert bool((Y == ref).all()), (name, D, label)  # synchronize!
            row[label] = ours_clocks(lambda i: tg.spmm(T, Xs[i], out=Y))
        side["old"] = False
        c, o, n = row["cusparse"], row["old"], row["new"]
        print(f"{name:18s} D={D:3d} GPU-only old/new {o['gpu']:7.1f} {n['gpu']:7.1f} us"
              f" ({c['gpu'] / o['gpu']:.2f}x / {c['gpu'] / n['gpu']:.2f}x of cuSPARSE) | from idle"
              f" {o['idle']:7.1f} {n['idle']:7.1f} us"
              f" ({c['idle'] / o['idle']:.2f}x / {c['idle'] / n['idle']:.2f}x)",
              flush=True)
        rows.append(row)
    summary = geomean_summary(rows, ("old", "new"))
    print("\n".join(summary))
    write_outputs(args, "", [], rows, summary)


if __name__ == "__main__":
    main()
