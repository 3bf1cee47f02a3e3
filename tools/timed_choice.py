"""The vector SpMM's launch chosen by timing against the statistics' choice, in one process.

    python tools/timed_choice.py GRAPH ... [--dims 32,64,128,256] [--x-dtype float32] [--json FILE] [--markdown FILE]

For each graph and width, ``tg.spmm(T, X, out=Y)`` on the default (vector)
layout with the launch the tiling's statistics pick (``vec_timed_choice=False``)
and with the one the timed choice keeps (timed on the first call, ``timed_after=0``), against the best of
cuSPARSE ALG2 / ALG3 (row-major): on the GPU-only clock (20 calls queued
behind a spin kernel, median of 11 batches) and from idle (one call at a time,
4 rotating inputs, median of 20).  Also the first call's cost (host wall time
of a call that plans its launch: statistics only, then with the timing) and
the launch that won, and the statistics' launch against the timed choice's (geomean, points within 5 %: the
rule's comparison on graphs it was not tuned on).  Every launch is checked exact on small-integer data first.
``--x-dtype float16`` / ``bfloat16``: X of that type (the 16-bit kernel's shapes are the candidates).
"""

import time

import numpy as np


def _first_call_ms(call):
    import cupy as cp

    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    call()
    cp.cuda.Device().synchronize()
    return 1e3 * (time.perf_counter() - t0)


def main():
    from _sweep import graph_args  # tools/

    def more(ap):
        ap.add_argument("--x-dtype", default="float32", choices=("float32", "float16", "bfloat16"))

    args = graph_args(__doc__, more)

    import tcgnn_py as tg
    from tcgnn_py.bench import wait_for_compiles
    from _sweep import against_summary, cusparse_points, geomean_summary, ours_clocks, write_outputs  # tools/

    half = args.x_dtype != "float32"
    if half:
        import ml_dtypes

        xdt = np.dtype(ml_dtypes.bfloat16) if args.x_dtype == "bfloat16" else np.dtype(np.float16)
    won_fields = ("FS", "COMBINE", "KS", "NS") if half else ("kernel", "FS", "U", "COMBINE", "DV", "L1")
    head = ("| graph | D | cuSPARSE GPU-only µs | statistics µs | timed µs | cuSPARSE from idle µs | statistics µs |"
            " timed µs | GPU-only ratio: statistics / timed | from idle: statistics / timed | first call ms:"
            f" statistics / timed | timed launch ({', '.join(won_fields)}) |\n"
            + "|---" * 12 + "|")
    print(head, flush=True)
    rows, lines, untimed = [], [], 0
    rng = np.random.default_rng(0)
    dims = [int(d) for d in args.dims.split(",")]
    for name, A, D, Xs, Y, ref, row in cusparse_points(args.graphs, dims, rng, xdt if half else None):
        # Every candidate compiled first (a timing leaves uncompiled ones out, compiling them in the background):
        # the first call below, timed on the first call (timed_after=0), then times them all, and its record is the
        # choice.
        with tg.tuning(timed_after=0):
            tg.spmm(tg.TiledMatrix(A), Xs[0], out=Y)
        wait_for_compiles()
        for mode, timed in (("statistics", False), ("timed", True)):
            with tg.tuning(vec_timed_choice=timed, timed_after=0):
                T = tg.TiledMatrix(A)  # a fresh tiling: nothing planned yet
                first = _first_call_ms(lambda: tg.spmm(T, Xs[0], out=Y))
                assert bool((Y == ref).all()), (name, D, mode)  # synchronize!
                row[mode] = dict(ours_clocks(lambda i: tg.spmm(T, Xs[i], out=Y)), first_ms=first)
        choices = T.launch_choices()  # (the timed tiling's one product; none where a product too large to time
        if not choices:  # kept the statistics' launch, and there is nothing to compare)
            print(f"| {name} | {D} | not timed: a product this large keeps the statistics' launch |", flush=True)
            untimed += 1
            continue
        (choice,) = choices
        won = choice["ms"][choice["kept"]][0]
        row["timed"]["won"] = [won.get(f) for f in won_fields]
        row["timed"]["candidates_us"] = {str(tuple(c.values())): 1e3 * t for c, t in choice["ms"]}
        c, s, t = row["cusparse"], row["statistics"], row["timed"]
        line = (f"| {name} | {D} | {c['gpu']:.1f} | {s['gpu']:.1f} | {t['gpu']:.1f} | {c['idle']:.1f} |"
                f" {s['idle']:.1f} | {t['idle']:.1f} | {c['gpu'] / s['gpu']:.2f}× / {c['gpu'] / t['gpu']:.2f}× |"
                f" {c['idle'] / s['idle']:.2f}× / {c['idle'] / t['idle']:.2f}× |"
                f" {s['first_ms']:.1f} / {t['first_ms']:.1f} | {tuple(t['won'])} |")
        print(line, flush=True)
        rows.append(row)
        lines.append(line)
    summary = geomean_summary(rows, ("statistics", "timed")) + against_summary(rows, "statistics", "timed")
    if untimed:
        summary.append(f"{untimed} points not timed (the statistics' launch stands there) and left out above")
    print("\n".join(summary))
    write_outputs(args, head, lines, rows, summary)


if __name__ == "__main__":
    main()
