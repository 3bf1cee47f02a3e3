"""SDDMM ``<X[i], X[j]>`` on every edge: tcgnn_py beside cuSPARSE SDDMM and a gather-and-dot kernel."""

import numpy as np

from .common import DIMS, PRODUCT_GRAPHS, Rotating, features, load, require_gpu, sync

IMPLS = ["tcgnn_tf32", "tcgnn_fp32", "cusparse_sddmm", "gather_dot"]


class SDDMM:
    params = [PRODUCT_GRAPHS, DIMS, IMPLS]
    param_names = ["graph", "D", "impl"]
    timeout = 600

    def setup_cache(self):
        return load(PRODUCT_GRAPHS)

    def setup(self, graphs, graph, D, impl):
        require_gpu()
        import cupy as cp
        import cupyx.scipy.sparse as csp

        import tcgnn_py as tg
        from tcgnn_py.bench import CusparseSDDMM, GatherDotSDDMM

        A = graphs[graph]
        self.Xs = features(A.shape[0], D)
        self.next = Rotating(len(self.Xs))
        self.closer = None
        if impl.startswith("tcgnn"):
            T = tg.TiledMatrix(A, dtype=np.float32)
            precision = impl.split("_")[1]
            self.fn = lambda i: tg.sddmm(T, self.Xs[i], precision=precision)
        else:
            out = cp.empty(A.nnz, cp.float32)
            cls = CusparseSDDMM if impl == "cusparse_sddmm" else GatherDotSDDMM
            try:
                self.fn = self.closer = cls(csp.csr_matrix(A), self.Xs, out)
            except RuntimeError as exc:
                raise NotImplementedError(str(exc)) from exc
        self.fn(0)
        sync()

    def teardown(self, graphs, graph, D, impl):
        if getattr(self, "closer", None) is not None:
            self.closer.close()

    def time_sddmm(self, graphs, graph, D, impl):
        self.fn(self.next())
        sync()
