"""SDDMM ``<X[i], X[j]>`` on every edge: tcgnn_py beside cuSPARSE SDDMM and a gather-and-dot kernel."""

import numpy as np

from .common import DIMS, PRODUCT_GRAPHS, ProductBenchmark, sync

IMPLS = ["tcgnn_tf32", "tcgnn_fp32", "cusparse_sddmm", "gather_dot"]


class SDDMM(ProductBenchmark):
    params = [PRODUCT_GRAPHS, DIMS, IMPLS]
    feature_rows = 0

    def make(self, A, D, impl):
        import cupy as cp
        import cupyx.scipy.sparse as csp

        import tcgnn_py as tg
        from tcgnn_py.bench import CusparseSDDMM, GatherDotSDDMM

        if impl.startswith("tcgnn"):
            T = tg.TiledMatrix(A, dtype=np.float32)
            precision = impl.split("_")[1]
            return lambda i: tg.sddmm(T, self.Xs[i], precision=precision)
        cls = CusparseSDDMM if impl == "cusparse_sddmm" else GatherDotSDDMM
        try:
            self.closer = cls(csp.csr_matrix(A), self.Xs, cp.empty(A.nnz, cp.float32))
        except RuntimeError as exc:  # cuSPARSE SDDMM not reachable here: asv shows n/a
            raise NotImplementedError(str(exc)) from exc
        return self.closer

    def time_sddmm(self, graphs, graph, D, impl):
        self.fn(self.next())
        sync()
