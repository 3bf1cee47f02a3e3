"""One tuning knob, two values, each with its own timed launch choice, in one process.

    python tools/ab_tuning.py --knob NAME --values A B GRAPH ... [--dims 32,64,128,256] [--x-dtype float32]
        [--json FILE] [--markdown FILE]

``A`` and ``B`` are Python literals, e.g. ``--knob half_shapes --values None "((1, 1, 2), (2, 1, 2))"``.

For each graph and width: the best of cuSPARSE ALG2 / ALG3 (row-major) and ``tg.spmm(T, X, out=Y)`` on the
default layout inside ``with tcgnn_py.tuning(knob=value)`` (a fresh ``TiledMatrix`` per value, so each plans
and times its own launch, settled: :func:`tcgnn_py.bench.settle`), on the GPU-only, back-to-back and from-idle
clocks of ``tools/_sweep.py``.
Every product is checked exact on small-integer data first.  The geomean summary has one line per clock
and value; the last column is the launch each value's timed choice kept.
"""

import ast

import numpy as np


def main():
    from _sweep import graph_args  # tools/

    def more(ap):
        ap.add_argument("--knob", required=True, help="an option of tcgnn_py.tuning (tcgnn_py.tuning_options())")
        ap.add_argument("--values", nargs=2, required=True, help="two Python literals")
        ap.add_argument("--x-dtype", default="float32", choices=("float32", "float16", "bfloat16"))

    args = graph_args(__doc__, more)

    import tcgnn_py as tg
    from tcgnn_py.bench import settle
    from _sweep import cusparse_points, geomean_summary, ours_clocks, write_outputs

    knob, values = args.knob, [ast.literal_eval(v) for v in args.values]
    if knob not in tg.tuning_options():
        raise SystemExit(f"--knob must be an option of tcgnn_py.tuning, got {knob!r}")
    labels = [f"{knob}={v!r}" for v in values]
    half = args.x_dtype != "float32"
    if half:
        import ml_dtypes

        xdt = np.dtype(ml_dtypes.bfloat16) if args.x_dtype == "bfloat16" else np.dtype(np.float16)
    head = (f"| graph | D | cuSPARSE GPU-only µs | {labels[0]} µs | {labels[1]} µs | GPU-only ratios | back to back"
            f" ratios | from idle ratios | launches kept |\n" + "|---" * 9 + "|")
    print(head, flush=True)
    rows, lines = [], []
    rng = np.random.default_rng(0)
    dims = [int(d) for d in args.dims.split(",")]
    for name, A, D, Xs, Y, ref, row in cusparse_points(args.graphs, dims, rng, xdt if half else None):
        kept = []
        for label, value in zip(labels, values):
            with tg.tuning(**{knob: value}):
                T = tg.TiledMatrix(A)
                settle(lambda: tg.spmm(T, Xs[0], out=Y))  # (the launch its timed choice keeps)
                assert bool((Y == ref).all()), (name, D, label)  # synchronize!
                row[label] = ours_clocks(lambda i: tg.spmm(T, Xs[i], out=Y))
            choices = T.launch_choices()
            kept.append(str(choices[-1]["ms"][choices[-1]["kept"]][0]) if choices else "untimed")
        row["kept"] = kept
        c, a, b = row["cusparse"], row[labels[0]], row[labels[1]]
        ratios = [" / ".join(f"{c[k] / x[k]:.2f}×" for x in (a, b)) for k in ("gpu", "b2b", "idle")]
        line = (f"| {name} | {D} | {c['gpu']:.1f} | {a['gpu']:.1f} | {b['gpu']:.1f} | {ratios[0]} | "
                f"{ratios[1]} | {ratios[2]} | {' ; '.join(kept)} |")
        print(line, flush=True)
        rows.append(row)
        lines.append(line)
    summary = geomean_summary(rows, labels)
    print("\n".join(summary))
    write_outputs(args, head, lines, rows, summary)


if __name__ == "__main__":
    main()
