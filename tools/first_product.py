"""Time to the first product: fresh processes, empty or warm kernel caches, wall clock.

    python tools/first_product.py [--runs 3] [--graph ADJ_CSR_NPZ] [--json FILE]

The measurement is :func:`tcgnn_py.bench.first_product_times` (see its module for the steps); the
table is the results page's.  Run it on a GPU machine.
"""

import argparse
import json

from tcgnn_py.bench import first_product_markdown, first_product_times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--graph", metavar="ADJ_CSR_NPZ", help="a graph whose first TiledMatrix and product are timed")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    runs = first_product_times(args.runs, args.graph)
    print(first_product_markdown(runs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
