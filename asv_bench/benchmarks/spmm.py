"""SpMM ``A @ X``: tcgnn_py (TF32 tensor cores, fp32 CUDA cores) beside cuSPARSE row-major and cupyx."""

import numpy as np

from .common import DIMS, PRODUCT_GRAPHS, ProductBenchmark, Rotating, features, gpu_cache, require_gpu, settle, sync

IMPLS = ["tcgnn_tf32", "tcgnn_fp32", "cusparse_alg2", "cusparse_alg3", "cupyx"]


class SpMM(ProductBenchmark):
    params = [PRODUCT_GRAPHS, DIMS, IMPLS]

    def make(self, A, D, impl):
        import cupy as cp
        import cupyx.scipy.sparse as csp

        import tcgnn_py as tg
        from tcgnn_py.bench import CSR_ALG2, CSR_ALG3, CusparseRowMajor

        self.Y = cp.empty((A.shape[0], D), cp.float32)
        if impl.startswith("tcgnn"):
            T = tg.TiledMatrix(A, dtype=np.float32)
            precision = impl.split("_")[1]
            return lambda i: tg.spmm(T, self.Xs[i], out=self.Y, precision=precision)
        if impl == "cupyx":
            Ad = csp.csr_matrix(A)
            return lambda i: Ad @ self.Xs[i]
        alg = CSR_ALG2 if impl == "cusparse_alg2" else CSR_ALG3
        self.closer = CusparseRowMajor(csp.csr_matrix(A), self.Xs, self.Y, alg)
        return self.closer

    def time_spmm(self, graphs, graph, D, impl):
        self.fn(self.next())
        sync()


class SpMMHalf(ProductBenchmark):
    """16-bit features: ours (vector layout, float32 matrix and output) and cuSPARSE with 16-bit A, X, Y."""

    params = [PRODUCT_GRAPHS, DIMS, ["float32", "float16", "bfloat16"], ["tcgnn_vector", "cusparse_alg2"]]
    param_names = ["graph", "D", "dtype", "impl"]

    def setup(self, graphs, graph, D, dtype, impl):
        require_gpu()
        import cupy as cp
        import cupyx.scipy.sparse as csp

        import tcgnn_py as tg
        from tcgnn_py.bench import CSR_ALG2, CusparseRowMajor

        A = graphs[graph]
        self.Xs = [x.astype(dtype) for x in features(A.shape[1], D)]
        self.next = Rotating(len(self.Xs))
        self.closer = None
        if impl == "tcgnn_vector":
            T = tg.TiledMatrix(A, dtype=np.float32, layout="vector")
            self.Y = cp.empty((A.shape[0], D), cp.float32)
            self.fn = lambda i: tg.spmm(T, self.Xs[i], out=self.Y)
        else:
            self.Y = cp.empty((A.shape[0], D), dtype)
            self.fn = self.closer = CusparseRowMajor(csp.csr_matrix(A), self.Xs, self.Y, CSR_ALG2)
        settle(lambda: self.fn(0))

    def teardown(self, graphs, graph, D, dtype, impl):
        if getattr(self, "closer", None) is not None:  # (asv tears down a setup that skipped too)
            self.closer.close()

    def time_spmm(self, graphs, graph, D, dtype, impl):
        self.fn(self.next())
        sync()


class TileQuality:
    """What SGT leaves for the tensor cores (structure only: one value per graph)."""

    params = [PRODUCT_GRAPHS]
    param_names = ["graph"]
    timeout = 600

    def setup_cache(self):
        return gpu_cache(PRODUCT_GRAPHS)

    def setup(self, graphs, graph):
        require_gpu()
        import tcgnn_py as tg

        self.stats = tg.TiledMatrix(graphs[graph]).tile_stats()

    def track_tensor_core_blocks(self, graphs, graph):
        return self.stats.blocks

    track_tensor_core_blocks.unit = "blocks"

    def track_tile_density(self, graphs, graph):
        return 100 * self.stats.density

    track_tile_density.unit = "% of tile slots"

    def track_block_reduction(self, graphs, graph):
        return 100 * self.stats.block_reduction

    track_block_reduction.unit = "% blocks removed by SGT"
