"""Quality and speed of the N:M reorder over real and synthetic graphs (issue 4's report).

    python tools/reorder_report.py [--best] [--json out.json] NAME|powerlaw:N:E ...

Per graph: 2:4 (1:2:4) reorder -- initial and final PScore, improvement rate,
iterations, wall time, conforming or not, and SGT's 16x8 block count before and
after; with ``--best`` also the pattern ``best_pattern`` picks.  Each reorder is
timed once after a warm-up reorder of a small graph (kernels compiled), wall
clock including the device-to-host copy of the permutation.
"""

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np
import scipy.sparse as sp

import tcgnn_py as tg

# the paper's Table 7 (1:2:4 on SuiteSparse, A100): class -> (initial, final, rate, seconds)
PAPER = {"small": (510.31, 0.96, 99.29, 0.05), "medium": (12656.56, 21.43, 99.94, 4.39), "large": (33202.87, 930.11, 98.87, 30.55)}


def size_class(n):
    # the paper's classes average 426, 3.6k and 22.6k vertices
    return "small" if n < 1500 else "medium" if n < 10000 else "large"


def load(spec):
    if spec.startswith("powerlaw:"):
        _, n, e = spec.split(":")
        return spec, tg.power_law_graph(int(n), int(e), seed=0, symmetric=True)
    data = pathlib.Path(os.environ.get("TCGNN_PY_DATA", "../shared/data"))
    return spec, sp.csr_array(sp.load_npz(data / spec / "adj_csr.npz"))


def blocks(A):
    return tg.TiledMatrix(A).tile_stats().blocks


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--best", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)

    tg.reorder(tg.power_law_graph(300, 1500, seed=1, symmetric=True), "2:4", device=args.device)  # compile
    tg.reorder(tg.power_law_graph(300, 1500, seed=1, symmetric=True), (4, 2, 8), device=args.device)
    rows = []
    best_cols = " best pattern | its MBScore initial -> final | search s | SGT blocks after |" if args.best else ""
    print("| graph | n | nnz | initial PScore | final PScore | improvement | iterations | time s | conforming |"
          " SGT blocks before -> after |" + best_cols)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|" + ("---|---:|---:|---:|" if args.best else ""))
    for spec in args.graphs:
        name, A = load(spec)
        t = time.perf_counter()
        p = tg.reorder(A, "2:4", device=args.device, verbose=False)
        wall = time.perf_counter() - t
        r = p.report
        b0, b1 = blocks(A), blocks(p.apply(A))
        row = {
            "graph": name, "n": A.shape[0], "nnz": int(A.nnz), "class": size_class(A.shape[0]),
            "initial_pscore": r.initial_pscore, "pscore": r.pscore, "improvement": r.improvement_rate,
            "iterations": r.iterations, "time_s": wall, "conforming": r.conforming,
            "blocks_before": b0, "blocks_after": b1,
        }  # fmt: skip
        line = (
            f"| {name} | {row['n']:,} | {row['nnz']:,} | {r.initial_pscore:,} | {r.pscore:,} | "
            f"{100 * r.improvement_rate:.2f} % | {r.iterations} | {wall:.3f} | {'yes' if r.conforming else 'no'} | "
            f"{b0:,} -> {b1:,} ({100 * (b1 - b0) / max(b0, 1):+.1f} %) |"
        )
        if args.best:
            t = time.perf_counter()
            pb = tg.best_pattern(A, device=args.device, verbose=False)
            b = row["best"] = {
                "pattern": str(pb.pattern), "pscore": pb.report.pscore, "mbscore": pb.report.mbscore,
                "initial_mbscore": pb.report.initial_mbscore, "conforming": pb.report.conforming,
                "search_time_s": time.perf_counter() - t, "tried": [str(q) for q, _ in pb.search],
                "blocks_after": blocks(pb.apply(A)),
            }  # fmt: skip
            line += (
                f" {b['pattern']}{'' if b['conforming'] else ' (not conforming)'} | {b['initial_mbscore']:,} -> "
                f"{b['mbscore']:,} | {b['search_time_s']:.2f} ({len(b['tried'])} tried) | {b['blocks_after']:,} |"
            )
        print(line, flush=True)
        rows.append(row)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))

    print("\n| class | graphs | mean initial PScore | mean final | mean improvement | conforming | mean time s | paper (A100): initial -> final, rate, time |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for cls in ("small", "medium", "large"):
        sel = [r for r in rows if r["class"] == cls]
        if not sel:
            continue
        rates = [r["improvement"] for r in sel if r["initial_pscore"]]
        pi, pf, pr, pt = PAPER[cls]
        print(
            f"| {cls} | {len(sel)} | {np.mean([r['initial_pscore'] for r in sel]):,.1f} | "
            f"{np.mean([r['pscore'] for r in sel]):,.2f} | {100 * np.mean(rates):.2f} % | "
            f"{sum(r['conforming'] for r in sel)}/{len(sel)} | {np.mean([r['time_s'] for r in sel]):.3f} | "
            f"{pi:,.1f} -> {pf:,.2f}, {pr:.2f} %, {pt} s |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
