"""Time per training epoch of GCN and AGNN (tcgnn_py.nn): tiled tensor cores against cupyx sparse ops; the host cost
of repeated layer calls; an input layer with its dropout; the neighbor sampler's blocks."""

import numpy as np

from .common import gpu_cache, require_gpu, settle


def _sync():
    import cupy

    cupy.cuda.Device().synchronize()


class TrainEpoch:
    """One full-batch step: forward with dropout, loss, backward, Adam (``python -m tcgnn_py.bench --ops gcn,agnn``)."""

    params = (["cora", "pubmed"], ["gcn", "agnn"], ["tcgnn_py", "tcgnn_py_graph", "cupyx"])
    param_names = ("graph", "model", "impl")
    timeout = 300

    def setup_cache(self):
        import tcgnn_py as tg
        from tcgnn_py.bench import gnn_problem

        # graph, features, labels, split; nothing without a GPU (setup skips; never None, see common.gpu_cache)
        return {g: gnn_problem(g) for g in self.params[0]} if tg.gpu_available() else {}

    def setup(self, problems, graph, model, impl):
        require_gpu()
        from tcgnn_py.bench import train_step

        # tcgnn_py_graph: the step captured once as a CUDA graph and replayed (tcgnn_py.CUDAGraph)
        sparse = "csr" if impl == "cupyx" else "tiled"
        self.step = train_step(problems[graph], model, sparse, "cuda", cuda_graph=impl == "tcgnn_py_graph")
        settle(self.step)

    def time_epoch(self, problems, graph, model, impl):
        self.step()
        _sync()


class CallCost:
    """Wall time of one repeated product on Cora at D = 16 (launch-bound): ``T @ X``, ``tg.sddmm``, a replay."""

    params = (["T @ X", "spmm(out=)", "sddmm", "graph replay"],)
    param_names = ("call",)

    def setup(self, call):
        require_gpu()
        import cupy as cp
        import numpy as np

        import tcgnn_py as tg

        A = tg.load_cora().adj.astype(np.float32)
        T = tg.TiledMatrix(A)
        X = cp.asarray(np.random.default_rng(0).standard_normal((A.shape[1], 16), dtype=np.float32))
        Y = cp.empty((A.shape[0], 16), np.float32)
        if call == "graph replay":
            settle(lambda: tg.spmm(T, X, out=Y))  # the launch the graph holds is the settled one
            graph = tg.CUDAGraph()
            with graph.capture():
                tg.spmm(T, X, out=Y)
            self.fn = graph.replay
        else:
            self.fn = {"T @ X": lambda: T @ X, "spmm(out=)": lambda: tg.spmm(T, X, out=Y),
                       "sddmm": lambda: tg.sddmm(T, X)}[call]
        settle(self.fn)
        for _ in range(50):
            self.fn()
        _sync()

    def time_100_calls(self, call):
        for _ in range(100):
            self.fn()
        _sync()


class LayerCallCost:
    """Wall time of 100 repeated layer calls on Cora, forward or forward + backward: what a layer costs on the host
    around its kernels (Cora's kernels take microseconds), the eager training loop's price per layer."""

    params = (["fwd", "fwd+bwd"], ["gcn_conv", "agnn_conv", "gat_conv 8 heads", "cross_entropy"])
    param_names = ("pass", "layer")

    def setup(self, pas, layer):
        require_gpu()
        import cupy as cp

        import tcgnn_py as tg

        nn = tg.nn
        g = tg.load_cora()
        n = g.adj.shape[0]
        rng = cp.random.default_rng(0)
        H, G = (rng.standard_normal((n, 64), dtype=cp.float32) for _ in range(2))
        W = rng.standard_normal((64, 64), dtype=cp.float32) / 8
        if layer == "gcn_conv":
            A = nn.gcn_norm(g.adj)
            call = lambda: nn.gcn_conv(A, H, W)  # noqa: E731
        elif layer == "agnn_conv":
            A, beta = nn.add_self_loops(g.adj), cp.ones(1, cp.float32)
            call = lambda: nn.agnn_conv(A, H, beta)  # noqa: E731
        elif layer == "gat_conv 8 heads":
            A = nn.add_self_loops(g.adj)
            a_src, a_dst = (rng.standard_normal((8, 8), dtype=cp.float32) for _ in range(2))
            call = lambda: nn.gat_conv(A, H, W, a_src, a_dst, heads=8)  # noqa: E731
        else:  # the loss and its gradient come from one call: no backward of its own
            logits = rng.standard_normal((n, 7), dtype=cp.float32)
            labels, index = cp.asarray(g.labels), cp.asarray(g.train_idx)
            call = lambda: (nn.cross_entropy(logits, labels, index), lambda G: None)  # noqa: E731
        self.fn = call if pas == "fwd" else lambda: call()[1](G)
        settle(self.fn)
        for _ in range(20):
            self.fn()
        _sync()

    def time_100_calls(self, pas, layer):
        for _ in range(100):
            self.fn()
        _sync()


class InputLayer:
    """A GCN input layer's forward and weight gradient with its dropout (rate 0.5): read by the layer's product
    (``gcn_conv(..., dropout_p=, rng=)``, as ``gcn_apply`` runs it) or run first (``dropout`` then ``gcn_conv``), on
    the harness's inputs (cora's 1,433 features, pubmed's 500)."""

    params = (["cora", "pubmed"], ["in the product", "dropout first"])
    param_names = ("graph", "dropout")
    timeout = 300

    def setup_cache(self):
        import tcgnn_py as tg
        from tcgnn_py.bench import gnn_problem

        return {g: gnn_problem(g) for g in self.params[0]} if tg.gpu_available() else {}

    def setup(self, problems, graph, dropout):
        require_gpu()
        import cupy as cp

        import tcgnn_py as tg

        nn, problem = tg.nn, problems[graph]
        A = nn.gcn_norm(problem["adj"])
        X = cp.asarray(problem["X"])
        rng = cp.random.default_rng(0)
        W = rng.standard_normal((X.shape[1], 16), dtype=cp.float32) / 8
        G = rng.standard_normal((X.shape[0], 16), dtype=cp.float32)
        if dropout == "in the product":
            def step():
                return nn.gcn_conv(A, X, W, dropout_p=0.5, rng=rng)[1](G, input_grad=False)
        else:
            def step():
                Xd, _ = nn.dropout(X, 0.5, rng)
                return nn.gcn_conv(A, Xd, W)[1](G, input_grad=False)
        self.fn = step
        settle(self.fn)

    def time_forward_and_weight_gradient(self, problems, graph, dropout):
        self.fn()
        _sync()


class SampledBlocks:
    """The neighbor sampler on the GPU (its kernel, relabelling, CSR blocks) and blocks as tiled matrices: fan-outs
    (15, 10, 5) around 1,024 seeds."""

    params = [["cora", "blogcatalog3"]]
    param_names = ["graph"]

    def setup_cache(self):
        return gpu_cache(self.params[0])

    def setup(self, graphs, name):
        require_gpu()
        import tcgnn_py as tg

        A = graphs[name]
        self.loaders = {f: tg.nn.NeighborLoader(A, [0], [15, 10, 5], 1, device="cuda", format=f)
                        for f in ("csr", "tiled")}
        self.seeds = np.random.default_rng(0).permutation(A.shape[0])[:1024]
        for loader in self.loaders.values():
            loader.sample(self.seeds, seed=0)  # (compiles the sampler)
        blocks = self.loaders["tiled"].sample(self.seeds, seed=0)
        self._layer_products(blocks)  # (compiles the CSR kernel)
        self._tiled_products(blocks)  # (and the translation and the products' kernels)
        from tcgnn_py.bench import wait_for_compiles

        # (the first builds translated on the host start the translation kernels' compile behind them: time
        # nothing beside it)
        wait_for_compiles()

    def time_sample_csr(self, graphs, name):
        self.loaders["csr"].sample(self.seeds, seed=1)
        _sync()

    def time_sample_tiled(self, graphs, name):
        self.loaders["tiled"].sample(self.seeds, seed=1)
        _sync()

    def time_sample_tiled_first_products(self, graphs, name):
        """A batch sampled as tiled blocks, each block's product at 64 features and, past the first hop (whose
        input is data), its transpose's, as the layers make them (``matmat``, ``rmatmat``): what a GraphSAGE step
        pays for its new matrices (with the sampling timed above)."""
        self._layer_products(self.loaders["tiled"].sample(self.seeds, seed=1))
        _sync()

    def time_sample_tiled_translated(self, graphs, name):
        """A batch sampled as tiled blocks, each block translated (``adj``) and its first product at 64 features:
        the blocks' ready-to-multiply as tiled matrices."""
        self._tiled_products(self.loaders["tiled"].sample(self.seeds, seed=1))
        _sync()

    @staticmethod
    def _layer_products(blocks):
        import cupy as cp

        for hop, block in enumerate(blocks):
            block.matmat(cp.ones((block.shape[1], 64), cp.float32))
            if hop:
                block.rmatmat(cp.ones((block.n_dst, 64), cp.float32))

    @staticmethod
    def _tiled_products(blocks):
        import cupy as cp

        for block in blocks:
            block.adj @ cp.ones((block.shape[1], 64), cp.float32)
