"""The statistics' launch against the timed choice's on the timed choice's own clock, from timed_choice.py's records.

    python tools/rule_fit.py FILE.json [FILE.json ...] [--set FIELD=VALUE ...]

``tools/timed_choice.py --json FILE`` keeps, per graph and width, every candidate the timed choice timed (the
statistics' launch first) and the launch it kept.  This tool reads them back: per file (the graphs a rule was
fitted on, graphs it was not), the kept candidate's time over the statistics' launch's, as a geomean over the
points, the points within 5 % and the worst.  ``--set FIELD=VALUE`` (repeatable) weighs a rule term before it is
written: each point's statistics' configuration with those fields replaced, where the timed choice timed that
configuration (else the statistics' own).  Every candidate gives the same bits, so only speed is compared, and on
one clock: the timed choice's round robin, the same for every candidate of a point (timed_choice.py's own summary
compares two launches timed apart, on its GPU-only clock).
"""

import argparse
import ast
import dataclasses
import json

#: The fields timed_choice.py records of the launch kept (``won``): float32 X's, 16-bit X's.
WON_FIELDS = {6: ("kernel", "FS", "U", "COMBINE", "DV", "L1"), 4: ("FS", "COMBINE", "KS", "NS")}


def candidates(row):
    """``[(configuration, µs), ...]`` of one point's timed candidates, the statistics' first: each configuration a
    dict of the kernel config's fields (by its class in ``tcgnn_py.kernels.products``), ``kernel`` and ``bpu``."""
    from tcgnn_py.kernels import products as kp

    out = []
    for key, us in row["timed"]["candidates_us"].items():
        values = ast.literal_eval(key)
        names = ("kernel",) + tuple(f.name for f in dataclasses.fields(getattr(kp, values[0]))) + ("bpu",)
        out.append((dict(zip(names, values)), us))
    return out


def kept_us(row, cands):
    """µs of the launch the timed choice kept: the candidate whose fields are the recorded ``won`` ones (the
    statistics' own where it is one of those, the timed choice's tie-break)."""
    won = dict(zip(WON_FIELDS[len(row["timed"]["won"])], row["timed"]["won"]))
    match = [i for i, (c, _) in enumerate(cands) if all(c.get(k) == v for k, v in won.items())]
    if not match:
        raise ValueError(f"{row['graph']} D={row['D']}: no timed candidate has the kept launch's fields {won}")
    return cands[0][1] if match[0] == 0 else min(cands[i][1] for i in match)


def chosen_us(cands, replace):
    """µs of the statistics' configuration with the fields of ``replace`` changed, where that one was timed."""
    want = dict(cands[0][0], **replace)
    return next((us for c, us in cands if c == want), cands[0][1])


def compare(rows, replace, margin=0.05):
    """``(geomean, within, points, worst ratio, worst point)`` of the kept launch's time over the chosen one's."""
    from _sweep import ratio_summary  # tools/

    ratios = []
    for row in rows:
        cands = candidates(row)
        ratios.append(kept_us(row, cands) / chosen_us(cands, replace))
    gm, within, worst = ratio_summary(ratios, margin)
    return gm, within, len(ratios), ratios[worst], f"{rows[worst]['graph']} D={rows[worst]['D']}"


def _value(text):
    """A --set value: True / False, an int, or the text."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="JSON files of tools/timed_choice.py --json")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="replace a field of the statistics' configuration (repeatable)")
    args = ap.parse_args(argv)
    replace = {}
    for item in args.set:
        field, sep, value = item.partition("=")
        if not sep or not field:
            ap.error(f"--set takes FIELD=VALUE, got {item!r}")
        replace[field] = _value(value)
    label = "statistics" + "".join(f", {k}={v}" for k, v in replace.items())
    for path in args.files:
        with open(path) as f:
            rows = json.load(f)["rows"]
        gm, within, n, worst, where = compare(rows, replace)
        print(f"{path}: {label} against timed (the timed choice's clock): geomean {gm:.3f}x, {within} of {n} "
              f"within 5 %, worst {worst:.2f}x ({where})")


if __name__ == "__main__":
    main()
