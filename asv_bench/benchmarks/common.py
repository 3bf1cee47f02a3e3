"""Shared pieces of the asv suite: graphs, GPU guard, inputs.

Graphs come from ``$TCGNN_PY_DATA`` (else ``.gpu/data`` or
``../shared/data`` of the checkout) through :func:`tcgnn_py.bench.resolve_graph`.  Without a GPU,
``setup_cache`` loads no graph and ``setup`` raises ``NotImplementedError``: asv reports ``n/a``.
"""

import os
import pathlib

import numpy as np

_ROOT = pathlib.Path(__file__).resolve().parents[2]
if "TCGNN_PY_DATA" not in os.environ:
    for _d in (_ROOT / ".gpu" / "data", _ROOT.parent / "shared" / "data"):
        if _d.is_dir():
            os.environ["TCGNN_PY_DATA"] = str(_d)
            break

#: Graphs of the product benchmarks: small (launch-bound), hub-heavy, and 1M nodes.  asv runs every
#: parameter combination in its own process, so the grid stays small; the CLI sweeps the rest.
PRODUCT_GRAPHS = ["cora", "blogcatalog3", "powerlaw:1000000:16000000"]
#: Widths of the product benchmarks (``python -m tcgnn_py.bench`` sweeps more).
DIMS = [64, 128]
#: Graphs of the preprocessing and reorder benchmarks.
PREP_GRAPHS = ["cora", "blogcatalog3", "powerlaw:1000000:16000000"]
REORDER_GRAPHS = ["cora", "facebook"]


def require_gpu():
    import tcgnn_py as tg

    if not tg.gpu_available():
        raise NotImplementedError("needs a CUDA GPU (CuPy and Numba)")


def gpu_cache(names):
    """What a GPU benchmark's ``setup_cache`` returns: the graphs of :func:`load`, or ``{}`` without a GPU (its
    ``setup`` then skips, and no large synthetic graph is generated for nothing).  Never None: asv passes a
    None cache to no method, which would shift every parameter by one."""
    import tcgnn_py as tg

    return load(names) if tg.gpu_available() else {}


_CACHE = pathlib.Path(__file__).resolve().parents[1] / ".graph-cache"


def load(names):
    """``name -> canonical float32 scipy csr_array`` (what setup_cache hands to setup).

    Synthetic graphs are generated once per machine and kept in ``asv_bench/.graph-cache``.
    """
    import scipy.sparse as sp

    from tcgnn_py.bench import resolve_graph
    from tcgnn_py.bench import SYNTHETIC

    out = {}
    for name in names:
        cached = _CACHE / (name.replace(":", "-") + ".npz")
        if cached.exists():
            A = sp.load_npz(cached)
        else:
            A = resolve_graph(name)[1]
            if name.partition(":")[0] in SYNTHETIC:
                _CACHE.mkdir(exist_ok=True)
                sp.save_npz(cached, sp.csr_array(A))
        A = sp.csr_array(A, dtype=np.float32)
        A.sum_duplicates()
        A.sort_indices()
        out[name] = A
    return out


def features(n, D, count=4, seed=None):
    """Fresh standard-normal float32 device features, ``count`` of them to rotate."""
    import cupy as cp

    rng = cp.random.default_rng(seed)
    return [rng.standard_normal((n, D), dtype=cp.float32) for _ in range(count)]


def sync():
    import cupy as cp

    cp.cuda.get_current_stream().synchronize()


def settle(fn):
    """Call ``fn`` until its launches are the ones a long loop settles on (:func:`tcgnn_py.bench.settle`)."""
    from tcgnn_py.bench import settle as settled

    settled(fn, sync)


class Rotating:
    """Cycles over the fresh inputs, so no call finds the previous one's operand in L2."""

    def __init__(self, n):
        self.n, self.i = n, -1

    def __call__(self):
        self.i = (self.i + 1) % self.n
        return self.i


class ProductBenchmark:
    """Frame of the product benchmarks: graph x width x implementation, fresh inputs rotated.

    Subclasses set ``params`` and ``feature_rows`` and build the call in ``make``
    (setting ``self.closer`` when it holds library descriptors).
    """

    param_names = ["graph", "D", "impl"]
    timeout = 600
    feature_rows = 1  # 0: A's rows, 1: A's columns

    def setup_cache(self):
        return gpu_cache(PRODUCT_GRAPHS)

    def setup(self, graphs, graph, D, impl):
        require_gpu()
        A = graphs[graph]
        self.Xs = features(A.shape[self.feature_rows], D)
        self.next = Rotating(len(self.Xs))
        self.closer = None
        self.fn = self.make(A, D, impl)
        settle(lambda: self.fn(0))

    def teardown(self, graphs, graph, D, impl):
        if getattr(self, "closer", None) is not None:
            self.closer.close()
