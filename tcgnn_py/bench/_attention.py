"""Layer 4 (bench): One graph-attention layer, fused against the library's unfused sequence and other frameworks'.

Rows of two kinds, each timed for the forward pass and for forward + backward:

* ``attention``: :func:`tcgnn_py.nn.graph_attention` alone, fused or ``fused=False`` (every entry's score, an
  edge softmax and SpMM per head, and the backward pass likewise): GAT's additive scores with 1 and 4 heads,
  AGNN's cosine scores;
* ``layer``: the whole layer (:func:`tcgnn_py.nn.gat_conv`, :func:`tcgnn_py.nn.agnn_conv`, dense parts
  included) beside the same layer from the ``--baselines`` file (``attention_builders()``, e.g. PyTorch
  Geometric's ``GATConv`` and ``AGNNConv``).

The graph gets self-loops (as the layers' users give it); features are ``WIDTH`` wide per head, random, rotated
between calls.  Clocks: calls back to back, and GPU-only (queued behind a spin kernel); on the host, the host
clock (back to back only).
"""

import numpy as np

from ._graphs import resolve_graph
from ._timing import settle, time_back_to_back, time_queued

__all__ = ["bench_attention", "attention_markdown", "attention_problem", "ATTENTION_CASES", "WIDTH"]

#: Features per head (the issue's D = 64).
WIDTH = 64
#: ``(score, heads)`` of each case: AGNN's cosine (one head), GAT's additive with 1 and 4 heads.
ATTENTION_CASES = (("cosine", 1), ("additive", 1), ("additive", 4))


def attention_problem(spec, n_inputs=2, seed=0, device="cuda"):
    """The graph with self-loops (scipy ``csr_array`` and TiledMatrix) and ``n_inputs`` random float32 feature
    matrices of ``WIDTH`` columns, on ``device``."""
    from .. import nn
    from .._device import get_cupy

    name, adj = resolve_graph(spec)
    T = nn.add_self_loops(adj, device=device)
    xp = np if device == "cpu" else get_cupy()
    rng = np.random.default_rng(seed)
    n = T.shape[0]
    Xs = [xp.asarray(rng.standard_normal((n, WIDTH), dtype=np.float32)) for _ in range(n_inputs)]
    return {"name": name, "adj": T.tocsr(), "A": T, "Xs": Xs, "width": WIDTH, "xp": xp}


def _ours(problem, score, heads, kind, fused):
    """``(fwd(i), fwd_bwd(i))`` of tcgnn_py: the attention alone (``kind="attention"``) or the layer."""
    from .. import nn

    A, Xs, xp = problem["A"], problem["Xs"], problem["xp"]
    rng = np.random.default_rng(1)
    n, D = A.shape[0], problem["width"]
    g = xp.asarray(rng.standard_normal((n, heads * D), dtype=np.float32))
    if kind == "attention":
        if score == "cosine":
            Hn = [X / xp.sqrt((X * X).sum(axis=1, keepdims=True)) for X in Xs]
            beta = xp.asarray([1.0], np.float32)
            call = lambda i: nn.graph_attention(A, Xs[i], score="cosine", Q=Hn[i], K=Hn[i], beta=beta,  # noqa: E731
                                                fused=fused)
        else:
            Vs = [xp.tile(X, (1, heads)) for X in Xs]
            s = [xp.asarray(rng.standard_normal((n, heads), dtype=np.float32)) for _ in Xs]
            call = lambda i: nn.graph_attention(A, Vs[i], heads=heads, s_src=s[i], s_dst=s[i - 1],  # noqa: E731
                                                fused=fused)
    elif score == "cosine":
        beta = xp.asarray([1.0], np.float32)
        call = lambda i: nn.agnn_conv(A, Xs[i], beta, fused=fused)  # noqa: E731
    else:
        scale = np.float32(1 / np.sqrt(D))  # (a float32 scale: a float64 one would promote W to float64)
        W = xp.asarray(rng.standard_normal((D, heads * D), dtype=np.float32) * scale)
        a1, a2 = (xp.asarray(rng.standard_normal((heads, D), dtype=np.float32) * scale) for _ in range(2))
        call = lambda i: nn.gat_conv(A, Xs[i], W, a1, a2, heads=heads, fused=fused)  # noqa: E731
    return (lambda i: call(i)[0]), (lambda i: call(i)[1](g))


def bench_attention(spec, calls=20, device="cuda", extra=None):
    """Rows ``{graph, nodes, nnz, kind, score, heads, pass, impl, b2b_us, gpu_us}`` (``gpu_us`` None on the host).

    ``extra`` maps an implementation name to ``build(problem, score, heads) -> (fwd(i), fwd_bwd(i))`` or None
    (the layer rows' other frameworks).
    """
    problem = attention_problem(spec, device=device)
    gpu = device != "cpu"
    nin = len(problem["Xs"])
    rows = []
    for score, heads in ATTENTION_CASES:
        if score == "cosine" and heads != 1:
            continue
        for kind in ("attention", "layer"):
            # (on the host the fused pass's place is taken by its NumPy reference)
            impls = {"fused" if gpu else "reference": _ours(problem, score, heads, kind, True),
                     "unfused": _ours(problem, score, heads, kind, False)}
            if kind == "layer":
                for name, build in (extra or {}).items():
                    built = build(problem, score, heads)
                    if built is not None:
                        impls[name] = built
            for impl, fns in impls.items():
                for pas, fn in zip(("fwd", "fwd+bwd"), fns):
                    fn(0)  # compiles and caches outside the clocks
                    if gpu and impl not in (extra or {}):
                        # ours: timed once its products' launches have settled and no compile runs beside the
                        # clocks, as the product rows are
                        settle(lambda: fn(0))
                    b2b = time_back_to_back(fn, nin, calls, gpu=gpu)
                    q = time_queued(fn, nin, calls) if gpu else None
                    rows.append({"graph": problem["name"], "nodes": problem["A"].shape[0],
                                 "nnz": int(problem["A"].nnz), "kind": kind, "score": score, "heads": heads,
                                 "pass": pas, "impl": impl, "b2b_us": 1e3 * b2b,
                                 "gpu_us": None if q is None else 1e3 * q})
    return rows


def attention_markdown(rows):
    """Table: one line per graph, case and pass; microseconds per call as ``GPU-only (back to back)`` per
    implementation, and the speedups of the first (the fused pass, or on the host its reference) on both clocks."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    ours, others = impls[0], impls[1:]
    head = ["graph", "nnz", "what", "pass"] + [f"{i} us" for i in impls]
    head += [f"{ours} speedup over {i}" for i in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = list(dict.fromkeys((r["graph"], r["kind"], r["score"], r["heads"], r["pass"]) for r in rows))

    def cell(r):
        return f"{r['b2b_us']:,.0f}" if r["gpu_us"] is None else f"{r['gpu_us']:,.0f} ({r['b2b_us']:,.0f})"

    for graph, kind, score, heads, pas in keys:
        sel = {r["impl"]: r for r in rows if (r["graph"], r["kind"], r["score"], r["heads"], r["pass"])
               == (graph, kind, score, heads, pas)}
        f = sel[ours]
        what = ("AGNN" if score == "cosine" else f"GAT {heads} head" + ("s" if heads > 1 else "")) + (
            " attention" if kind == "attention" else " layer")
        cells = [graph, f"{f['nnz']:,}", what, pas] + [cell(sel[i]) if i in sel else "–" for i in impls]
        for i in others:
            if i not in sel:
                cells.append("–")
            elif f["gpu_us"] is None:
                cells.append(f"{sel[i]['b2b_us'] / f['b2b_us']:.2f}×")
            else:
                cells.append(f"{sel[i]['gpu_us'] / f['gpu_us']:.2f}× ({sel[i]['b2b_us'] / f['b2b_us']:.2f}×)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
