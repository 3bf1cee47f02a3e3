"""Layer 4 (bench): Graphs by name, path or synthetic spec."""

import os
import pathlib

from .._io import load_cora, load_graph
from .._synth import banded_graph, power_law_graph, uniform_graph

__all__ = ["resolve_graph", "locate_graph", "SYNTHETIC", "data_roots"]

#: ``kind:N:K`` specs: K is the edge count (power-law, uniform) or the half band width (banded).
SYNTHETIC = {
    "powerlaw": lambda n, k: power_law_graph(n, k, seed=0),
    "uniform": lambda n, k: uniform_graph(n, k, seed=0),
    "banded": lambda n, k: banded_graph(n, k),
}


def data_roots():
    """Where graph names are looked up: ``$TCGNN_PY_DATA``, ``.gpu/data``, ``../shared/data``."""
    return [pathlib.Path(p) for p in (os.environ.get("TCGNN_PY_DATA"), ".gpu/data", "../shared/data") if p]


def resolve_graph(spec):
    """``(name, scipy csr_array)`` of a graph spec.

    ``spec`` is a graph name under :func:`data_roots` (``cora`` falls back to the
    bundled copy), a path to a graph folder,
    ``.npz`` or ``.mtx``, or a synthetic ``powerlaw:N:NNZ``, ``uniform:N:NNZ`` or
    ``banded:N:HALF_WIDTH`` graph (fixed seed).

    Examples
    --------
    >>> from tcgnn_py.bench import resolve_graph
    >>> name, A = resolve_graph("banded:100:2")
    >>> name, A.shape, A.nnz
    ('banded:100:2', (100, 100), 494)
    """
    where = locate_graph(spec)
    if isinstance(where, tuple):
        kind, n, k = where
        return spec, SYNTHETIC[kind](n, k)
    if where == "bundled":
        return spec, load_cora().adj
    return (spec if where.name == spec else where.stem), load_graph(where).adj


def locate_graph(spec):
    """Where ``spec`` comes from, without loading it: ``(kind, N, K)``, ``"bundled"`` or a path.

    Raises ``ValueError`` (a malformed synthetic spec) or ``FileNotFoundError``
    that says where names are looked up.
    """
    kind, _, rest = spec.partition(":")
    if kind in SYNTHETIC and rest:
        try:
            n, k = (int(v) for v in rest.split(":"))
        except ValueError:
            raise ValueError(f"synthetic graphs are {kind}:N:K with integers N and K, got {spec!r}") from None
        if n < 1 or k < 0:
            raise ValueError(f"synthetic graphs are {kind}:N:K with N >= 1 and K >= 0, got {spec!r}")
        if kind != "banded" and k > n * n:  # the generators' own limit, checked before anything is measured
            raise ValueError(f"{kind}:N:K: {k} edges do not fit {n} nodes (at most N * N = {n * n})")
        return kind, n, k
    for root in data_roots():
        if (root / spec / "adj_csr.npz").exists():
            return root / spec
    if spec == "cora":
        return "bundled"
    if not pathlib.Path(spec).exists():
        env = os.environ.get("TCGNN_PY_DATA")
        roots = ", ".join(str(r) for r in data_roots() if str(r) != env)
        raise FileNotFoundError(
            f"no graph {spec!r}: a name is looked up as NAME/adj_csr.npz under $TCGNN_PY_DATA "
            f"({'unset' if env is None else repr(env)}) and {roots}; only cora ships with the package. "
            "Give a path to a graph folder, an .npz or an .mtx file, or a synthetic powerlaw:N:NNZ, "
            "uniform:N:NNZ or banded:N:HALF_WIDTH"
        )
    return pathlib.Path(spec)
