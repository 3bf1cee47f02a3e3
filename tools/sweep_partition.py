"""How the vector SpMM cuts windows into units: the statistics' rule against alternatives, two clocks.

    python tools/sweep_partition.py GRAPH ... [--dims 32,64,128,256] [--json FILE]

The partition (blocks per unit) fixes every sum's order, so the timed launch
choice never varies it; the rule in ``_ops._vec_unit_size`` picks it from the
tiling's statistics.  This sweep times that rule's settings (``vec_tail_factor``,
``vec_target_warps``, an 8-block unit size) in one process per graph: for each
setting, every product is checked exact on small-integer data, then timed on
the GPU-only clock (20 calls queued behind a spin kernel, median of 11 batches)
and from idle (one call at a time, 4 rotating inputs), against the best of
cuSPARSE ALG2 / ALG3.  The timed launch choice is on, as by default.
"""


import numpy as np

SETTINGS = {
    "base": {},
    "tail2": dict(vec_tail_factor=2),
    "tail1.5": dict(vec_tail_factor=1.5),
    "tail1": dict(vec_tail_factor=1),
    "tw32": dict(vec_target_warps=32),
    "u8": {},  # 8-block units allowed (VEC_UNIT_SIZES)
}


def main():
    from _sweep import graph_args  # tools/

    args = graph_args(__doc__)

    import tcgnn_py as tg
    from tcgnn_py import _ops
    from _sweep import cusparse_clocks, geomean_summary, int_points, ours_clocks, write_outputs  # tools/

    base, sizes = dict(_ops.TUNING), _ops.VEC_UNIT_SIZES
    rows = []
    dims = [int(d) for d in args.dims.split(",")]
    for name, A, Ad, T, D, Xs, Y, ref in int_points(args.graphs, dims, np.random.default_rng(0)):
        row = {"graph": name, "D": D, "cusparse": cusparse_clocks(Ad, Xs, Y)}
        c = row["cusparse"]
        line = [f"{name:18s} D={D:3d} cuSPARSE {c['gpu']:6.1f}/{c['idle']:6.1f} us |"]
        for label, kw in SETTINGS.items():
            _ops.VEC_UNIT_SIZES = (8,) + sizes if label == "u8" else sizes
            _ops.set_tuning(**{**base, **kw})  # a new tuning version: planned (and timed) again
            tg.spmm(T, Xs[0], out=Y)
            exact = bool((Y == ref).all())  # synchronize!
            t = dict(ours_clocks(lambda i: tg.spmm(T, Xs[i], out=Y)), exact=exact)
            launch = next(v for k, v in T.tiling._cache.items()
                          if isinstance(k, tuple) and k[0] == "launch" and k[3] == D
                          and k[-1] == _ops.TUNING_VERSION[0])
            t["units"], t["n_slices"] = int(launch.units.shape[0]), launch.n_slices
            row[label] = t
            line.append(f"{label} {c['gpu'] / t['gpu']:.2f}/{c['idle'] / t['idle']:.2f}"
                        f"{'' if exact else ' WRONG'}")
        _ops.VEC_UNIT_SIZES = sizes
        _ops.set_tuning(**base)
        rows.append(row)
        print(" ".join(line), flush=True)
    summary = geomean_summary(rows, SETTINGS)
    print("\n".join(summary))
    write_outputs(args, "", [], rows, summary)


if __name__ == "__main__":
    main()
