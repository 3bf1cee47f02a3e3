"""The reference path (NumPy and SciPy, no GPU): the translation and a product on the bundled Cora.

These run on every machine, CI's included, so a suite whose setup broke shows there, not first on a GPU.
"""

import numpy as np


class HostPath:
    """Cora on the host: a scipy matrix to a TiledMatrix (``device="cpu"``), and ``T @ X`` at D = 64."""

    def setup(self):
        import tcgnn_py as tg

        self.A = tg.load_cora().adj.astype(np.float32)
        self.T = tg.TiledMatrix(self.A, device="cpu")
        self.X = np.random.default_rng(0).standard_normal((self.A.shape[1], 64), dtype=np.float32)

    def time_translate(self):
        import tcgnn_py as tg

        tg.TiledMatrix(self.A, device="cpu")

    def time_spmm(self):
        self.T @ self.X


class HostSampler:
    """The neighbor sampler's reference on Cora: fan-outs (15, 10, 5) around 256 seeds, CSR blocks."""

    def setup(self):
        import tcgnn_py as tg

        A = tg.load_cora().adj
        self.loader = tg.nn.NeighborLoader(A, [0], [15, 10, 5], 1, device="cpu", format="csr")
        self.seeds = np.random.default_rng(0).permutation(A.shape[0])[:256]

    def time_sample_blocks(self):
        self.loader.sample(self.seeds, seed=1)
