"""What the launch-shape sweeps and A/B tools share: graphs, integer twins and operands, cuSPARSE and our clocks."""

import numpy as np

from tcgnn_py.bench import CSR_ALG2, CSR_ALG3, CusparseRowMajor, resolve_graph, time_rotating


def _canonical(spec):
    """``(name, A)``: the graph as canonical float32 CSR (duplicates summed, indices sorted)."""
    name, A = resolve_graph(spec)
    A = A.astype(np.float32)
    A.sum_duplicates()
    A.sort_indices()
    return name, A


def load_graph(spec, rng):
    """``(name, A, Ai)``: A as canonical float32 CSR, and Ai with its pattern and values in +-[1, 4] (exact tests)."""
    name, A = _canonical(spec)
    Ai = A.copy()
    Ai.data[:] = rng.integers(1, 5, Ai.nnz) * rng.choice([-1, 1], Ai.nnz)
    return name, A, Ai


def cusparse_us(Ad, Xs, Y, repeat=20):
    """Median µs of cuSPARSE CSR ALG2 and ALG3 (row-major X) on rotating inputs: ``{"alg2": .., "alg3": ..}``."""
    out = {}
    for alg, label in ((CSR_ALG2, "alg2"), (CSR_ALG3, "alg3")):
        c = CusparseRowMajor(Ad, Xs, Y, alg)
        out[label] = 1e3 * time_rotating(c, len(Xs), repeat)
        c.close()
    return out


def int_graph(spec, rng):
    """``(name, A, Ad)``: canonical float32 CSR with values in [1, 3] (products exact in TF32), and its CuPy copy."""
    import cupyx.scipy.sparse as csp

    name, A = _canonical(spec)
    A.data[:] = rng.integers(1, 4, A.nnz)
    return name, A, csp.csr_matrix(A)


def int_operands(A, Ad, D, rng, n_inputs=4):
    """``(Xs, Y, ref)``: ``n_inputs`` small-integer X of width D, an output, and ``A @ Xs[0]`` by cuSPARSE."""
    import cupy as cp

    Xs = [cp.asarray(rng.integers(-4, 5, (A.shape[1], D)).astype(np.float32)) for _ in range(n_inputs)]
    return Xs, cp.empty((A.shape[0], D), cp.float32), Ad @ Xs[0]


def cusparse_points(specs, dims, rng, xdt=None):
    """Per graph and width: ``(name, A, D, Xs, Y, ref, row)`` of small-integer operands (:func:`int_graph`,
    :func:`int_operands`), ``row`` holding ``cusparse`` (:func:`cusparse_clocks` on float32 X, the user's
    alternative and the type its descriptors say), then Xs cast to ``xdt`` (exact in 16 bits) if given."""
    for spec in specs:
        name, A, Ad = int_graph(spec, rng)
        for D in dims:
            Xs, Y, ref = int_operands(A, Ad, D, rng)
            row = {"graph": name, "nnz": int(A.nnz), "D": D, "cusparse": cusparse_clocks(Ad, Xs, Y)}
            if xdt is not None:
                Xs = [X.astype(xdt) for X in Xs]
            yield name, A, D, Xs, Y, ref, row


def cusparse_clocks(Ad, Xs, Y):
    """µs of the best of cuSPARSE ALG2 / ALG3: ``{"gpu": queued behind a spin, "idle": one call at a time,
    "b2b": calls back to back}``."""
    from tcgnn_py.bench import time_back_to_back, time_queued

    cs = [CusparseRowMajor(Ad, Xs, Y, alg) for alg in (CSR_ALG2, CSR_ALG3)]
    out = {"gpu": min(1e3 * time_queued(c, len(Xs)) for c in cs),
           "idle": min(1e3 * time_rotating(c, len(Xs), 20, 3) for c in cs),
           "b2b": min(1e3 * time_back_to_back(c, len(Xs)) for c in cs)}
    for c in cs:
        c.close()
    return out


def ours_clocks(call, n_inputs=4):
    """µs of ``call(i)`` on the same clocks as :func:`cusparse_clocks`."""
    from tcgnn_py.bench import time_back_to_back, time_queued

    return {"gpu": 1e3 * time_queued(call, n_inputs), "idle": 1e3 * time_rotating(call, n_inputs, 20, 3),
            "b2b": 1e3 * time_back_to_back(call, n_inputs)}


def geomean_summary(rows, labels, clocks=(("gpu", "GPU-only"), ("b2b", "back to back"), ("idle", "from idle"))):
    """One line per clock and label: geomean of ``row["cusparse"][clock] / row[label][clock]``, points below 1."""
    import math

    out = []
    for clock, name in clocks:
        for label in labels:
            r = [x["cusparse"][clock] / x[label][clock] for x in rows]
            gm = math.exp(sum(map(math.log, r)) / len(r))
            out.append(f"{name}, {label}: geomean {gm:.3f}x over the best cuSPARSE call, {sum(v < 1 for v in r)}"
                       f" of {len(r)} below 1.0x, worst {min(r):.2f}x")
    return out


def against_summary(rows, label, base, margin=0.05,
                    clocks=(("gpu", "GPU-only"), ("b2b", "back to back"), ("idle", "from idle"))):
    """One line per clock: the geomean of ``row[base][clock] / row[label][clock]`` (``label``'s speed against
    ``base``'s: the statistics' launch against the timed choice's), and the points within ``margin`` of ``base``."""
    out = []
    for clock, name in clocks:
        r = [x[base][clock] / x[label][clock] for x in rows]
        gm, within, worst = ratio_summary(r, margin)
        out.append(f"{name}, {label} against {base}: geomean {gm:.3f}x, {within} of {len(r)}"
                   f" within {100 * margin:.0f} %, worst {r[worst]:.2f}x")
    return out


def ratio_summary(ratios, margin=0.05):
    """``(geomean, how many are within margin of 1 or above, index of the smallest)`` of speed ratios."""
    import math

    gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return gm, sum(v >= 1 - margin for v in ratios), min(range(len(ratios)), key=ratios.__getitem__)


def int_points(specs, dims, rng):
    """Per graph and width: ``(name, A, Ad, T, D, Xs, Y, ref)`` (see :func:`int_graph`, :func:`int_operands`;
    T is the default TiledMatrix of A, built once per graph)."""
    import tcgnn_py as tg

    for spec in specs:
        name, A, Ad = int_graph(spec, rng)
        T = tg.TiledMatrix(A)
        for D in dims:
            yield (name, A, Ad, T, D) + int_operands(A, Ad, D, rng)


def write_outputs(args, head, lines, rows, summary):
    """``--json`` (rows and summary lines) and ``--markdown`` (the table, then the summary as a list)."""
    import json

    if getattr(args, "json", None):
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)
    if getattr(args, "markdown", None):
        with open(args.markdown, "w") as f:
            f.write(head + "\n" + "\n".join(lines) + "\n\n" + "\n".join(f"- {s}" for s in summary) + "\n")


def graph_args(doc, add=None):
    """The tools' command line: GRAPH ..., ``--dims``, ``--json``, ``--markdown``; ``add(parser)`` adds more."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--dims", default="32,64,128,256")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    if add is not None:
        add(ap)
    return ap.parse_args()
