"""Time per training epoch: tcgnn_py.nn beside the same models on cupyx, and beside other frameworks.

    python tools/gnn_epoch_table.py cora citeseer pubmed blogcatalog3 powerlaw:1000000:16000000 \
        [--baselines FILE.py [--sys-path DIR]] [--jax segment_sum,bcoo,tcgnn | none] [--epochs 20] \
        [--json FILE] [--markdown FILE]

This repository imports no deep-learning framework.  Other frameworks' models
(the PyTorch Geometric columns of docs/benchmarks.md) come from ``--baselines``, a
file kept outside it whose ``builders()`` returns them; the PyG models used for
the results page (PyG's gcn.py and agnn.py examples, and GCNConv on a
``torch.sparse_csr`` adjacency) were last in this file at commit 968cbab
(``git show 968cbab:tools/gnn_epoch_table.py``).  Without ``--baselines`` only
the tcgnn_py and cupyx columns are filled, and the JAX columns where JAX and optax
are installed (``--jax segment_sum``: the pure-JAX model alone, whose XLA compile is
the shortest of the three).
"""

import argparse
import json
import pathlib
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--baselines", metavar="FILE.py",
                    help="a file (kept outside this repository) whose builders() adds other frameworks' models")
    ap.add_argument("--sys-path", help="a directory to put on sys.path for that file's imports")
    ap.add_argument("--jax", default="segment_sum,bcoo,tcgnn", metavar="AGGREGATIONS",
                    help="the JAX columns, by aggregation (comma-separated), or none")
    ap.add_argument("--epochs", type=int, default=20, help="epochs per timed batch (median of 3)")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    if args.sys_path:
        sys.path.append(args.sys_path)

    from tcgnn_py.bench import bench_gnn, gnn_markdown, load_baselines

    builders, versions = {}, {}
    if args.baselines:
        try:
            builders, versions, *_ = load_baselines(args.baselines)
        except ImportError as exc:
            print(f"baselines of {args.baselines} not available ({exc}): tcgnn_py and cupyx only")

    jax = [] if args.jax == "none" else [a for a in args.jax.split(",") if a]
    rows = []
    for spec in args.graphs:
        got = bench_gnn(spec, epochs=args.epochs, extra=builders, with_jax=jax)
        rows += got
        print(gnn_markdown(got), flush=True)
    table = gnn_markdown(rows)
    print(table)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"versions": versions, "rows": rows}, indent=1))
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table)


if __name__ == "__main__":
    main()
