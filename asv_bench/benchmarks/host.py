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
